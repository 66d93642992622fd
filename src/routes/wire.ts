/**
 * `GET /v2` with `Upgrade: websocket`: the Postgres wire protocol over a WebSocket, as the Neon
 * driver's `Pool` and `Client` speak it (`neonConfig.wsProxy`), and as node-postgres does given the
 * driver's socket (docs/adr/017-wire-protocol.md, docs/wire-protocol.md).
 *
 * The edge answers the startup itself, as Neon's own proxy does for WebSocket connections: an
 * SSLRequest gets `N` (the WebSocket is the TLS), the password is asked for in cleartext
 * (AuthenticationCleartextPassword, which the driver pipelines behind its startup message) and is the
 * tenant key. The key's MAC is checked here before anything else, exactly as on `/sql`: a forged key
 * reaches no object, every failed authentication answers the same FATAL 28P01 and counts toward the
 * tenant id's rate limit. Only then is the tenant's object asked to take the connection (it checks
 * the key's hash, as for every route); from there on the edge relays frames both ways and reads
 * none of them (wire-relay.ts), within the bounds the object answers with. A CancelRequest, which
 * carries only the key the client was given, is checked here (its MAC), counted, and routed through
 * the cancel registry (src/wire-cancel-object) to the tenant whose connection it names
 * (wire-cancel.ts).
 */
import { Hono } from "hono";
import { loadConfig } from "../config/index.ts";
import { maxMoveHops } from "../core/move.ts";
import {
  authenticationCleartextPassword,
  checkStartup,
  concatBytes,
  decodePassword,
  decodeStartupPacket,
  encryptionRefused,
  errorResponse,
  frontend,
  isFrameProblem,
  MessageReader,
  maxStartupPacketBytes,
  negotiateProtocolVersion,
  type PostgresErrorFields,
  type StartupRequest,
} from "../core/pg-wire.ts";
import { parseTenantId } from "../core/tenant-id.ts";
import { parseWireBounds, type WireBounds, wireBounds } from "../core/wire-flow.ts";
import {
  describeFailure,
  durableObjectFailure,
  LessorError,
  postgresFieldsOf,
  type WireError,
} from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { tenantObject, tenantObjectName } from "../placement/index.ts";
import { followMoves, noteMove } from "../placement/moves.ts";
import {
  cancelRefreshMs,
  cancelShardOf,
  type WireOpen,
  wireBoundsHeader,
  wireOpenHeader,
} from "../rpc/wire.ts";
import { countFailedAuthentication, proveTenantKey } from "./auth.ts";
import type { AppContext, AppEnv } from "./context.ts";
import { mintCancelKey, routeCancel } from "./wire-cancel.ts";
import { EdgeRelay, heldFrameOverheadBytes } from "./wire-relay.ts";

export const wireRoutes = new Hono<AppEnv>();

wireRoutes.get("/v2", (c) => {
  if (c.req.header("Upgrade")?.toLowerCase() !== "websocket") throw new LessorError("wire_upgrade_required");
  const pair = new WebSocketPair();
  const [client, edge] = [pair[0], pair[1]];
  // Binary frames as ArrayBuffer (the standard's default is Blob).
  edge.binaryType = "arraybuffer";
  edge.accept();
  new WireEdge(c, edge).start();
  return new Response(null, { status: 101, webSocket: client });
});

/** How long a client may take from its WebSocket to its password. */
const handshakeDeadlineMs = 10_000;

/** The one refusal of every failed authentication (an unknown tenant, a forged, wrong or revoked key). */
const authenticationFailed: PostgresErrorFields = {
  severity: "FATAL",
  code: "28P01",
  message: "password authentication failed",
  detail: "invalid_credentials",
};

type Phase = "startup" | "password" | "authenticating" | "relaying" | "closed";

/** One client's WebSocket at the edge: the startup, the key check, then the relay. */
class WireEdge {
  private readonly reader = new MessageReader(maxStartupPacketBytes, true, true);
  private phase: Phase = "startup";
  private request: Extract<StartupRequest, { ok: true }> | null = null;
  /** What a pipelining client sent behind its password, held until the tenant's object takes over. */
  private held: Uint8Array[] = [];
  private heldBytes = 0;
  private upstream: WebSocket | null = null;
  private relay: EdgeRelay | null = null;
  /** The hold bound before the object answers with the connection's own bounds. */
  private readonly defaultBounds: WireBounds;
  private deadline: ReturnType<typeof setTimeout> | undefined;
  private cancelKey: { pid: number; tenantId: string; refresh: ReturnType<typeof setInterval> } | null = null;

  constructor(
    private readonly c: AppContext,
    private readonly socket: WebSocket,
  ) {
    this.defaultBounds = wireBounds(loadConfig(c.env));
  }

  start(): void {
    this.socket.addEventListener("message", (event) => this.fromClient(event.data));
    this.socket.addEventListener("close", () => this.end());
    this.socket.addEventListener("error", () => this.end());
    this.deadline = setTimeout(
      () =>
        this.fatal({
          severity: "FATAL",
          code: "08P01",
          message: `The startup and password did not arrive within ${handshakeDeadlineMs / 1000} s.`,
        }),
      handshakeDeadlineMs,
    );
  }

  private fromClient(data: string | ArrayBuffer): void {
    if (this.phase === "closed") return;
    if (typeof data === "string") {
      this.fatal(postgresFieldsOf(new LessorError("protocol_violation").toWire(), "FATAL"));
      return;
    }
    const bytes = new Uint8Array(data);
    if (this.phase === "relaying") {
      this.relay?.fromClient(bytes);
      return;
    }
    if (this.phase === "authenticating") {
      this.holdBack(bytes);
      return;
    }
    this.reader.push(bytes);
    this.readHandshake();
  }

  private holdBack(bytes: Uint8Array): void {
    this.held.push(bytes);
    this.heldBytes += bytes.byteLength + heldFrameOverheadBytes;
    if (this.heldBytes > this.defaultBounds.edgeHoldBytes)
      this.fatal(postgresFieldsOf(new LessorError("pipeline_limit").toWire(), "FATAL"));
  }

  private readHandshake(): void {
    for (;;) {
      const message = this.reader.next();
      if (message === null) return;
      if (isFrameProblem(message)) {
        this.fatal(
          message.problem === "fragmented"
            ? postgresFieldsOf(new LessorError("frame_limit").toWire(), "FATAL")
            : { severity: "FATAL", code: "08P01", message: "invalid startup packet or message length" },
        );
        return;
      }
      if (this.phase === "startup") {
        const packet = decodeStartupPacket(message.body);
        switch (packet.kind) {
          case "ssl":
          case "gssenc":
            // The WebSocket is the encryption (wss://): nothing more inside it, as on Neon.
            this.send(encryptionRefused);
            this.reader.expectStartupPacket();
            continue;
          case "cancel":
            this.phase = "closed";
            clearTimeout(this.deadline);
            void this.cancel(packet.pid, packet.secret).finally(() => this.closeSocket());
            return;
          case "unsupported":
            this.fatal({
              severity: "FATAL",
              code: "0A000",
              message: `unsupported frontend protocol ${packet.version >>> 16}.${packet.version & 0xffff}: Lessor speaks 3.0`,
            });
            return;
          case "malformed":
            this.fatal({ severity: "FATAL", code: "08P01", message: "invalid startup packet" });
            return;
          case "startup": {
            const request = checkStartup(packet.params, "transaction");
            if (!request.ok) {
              this.fatal({ severity: "FATAL", code: request.code, message: request.message });
              return;
            }
            this.request = request;
            this.phase = "password";
            this.send(
              concatBytes([
                ...(packet.minor > 0 || request.protocolOptions.length > 0
                  ? [negotiateProtocolVersion(request.protocolOptions)]
                  : []),
                authenticationCleartextPassword(),
              ]),
            );
            continue;
          }
        }
      }
      const password = message.type === frontend.password ? decodePassword(message.body) : null;
      if (password === null) {
        this.fatal({ severity: "FATAL", code: "08P01", message: "expected a password message" });
        return;
      }
      this.phase = "authenticating";
      const rest = this.reader.takeRest();
      if (rest.byteLength > 0) this.holdBack(rest);
      void this.authenticate(password).catch((error: unknown) => this.fatalFrom(error));
      return;
    }
  }

  private async authenticate(password: string): Promise<void> {
    const request = this.request;
    if (!request) return;
    const { c } = this;
    const tenantId = parseTenantId(request.user);
    // As on `/sql`: a user that names no tenant, or another database than its own, fails as a
    // wrong password does, without a key check (it could not be any tenant's key).
    if (!tenantId || request.database !== request.user || password === "") {
      this.fatal(authenticationFailed);
      return;
    }
    const proof = await proveTenantKey(c, tenantId, password);
    if (!proof) {
      this.fatal(authenticationFailed);
      return;
    }
    const { pid, secret } = await mintCancelKey(loadConfig(c.env).keyMacRing);
    const open: WireOpen = {
      tenantId,
      proof,
      mode: request.mode,
      applicationName: request.applicationName,
      pid,
      secret,
    };
    // The tenant's object in the region its key names, or where it moved since (src/placement/moves.ts).
    let region = followMoves(tenantId, proof.region);
    let response = await this.openWire(region, open);
    for (let hop = 0; hop < maxMoveHops && response.status === 409; hop++) {
      const refusal = await response
        .clone()
        .json<{ error?: WireError }>()
        .catch(() => null);
      const to = refusal?.error?.code === "tenant_moved" ? refusal.error.details?.region : undefined;
      if (to === undefined || !loadConfig(c.env).regions.has(to)) break;
      noteMove(tenantId, region, to);
      region = to;
      response = await this.openWire(region, { ...open, proof: { ...proof, region } });
    }
    const upstream = response.webSocket;
    if (response.status !== 101 || !upstream) {
      const body = await response.json<{ error?: WireError }>().catch(() => null);
      const error = body?.error ?? new LessorError("internal").toWire();
      if (error.code === "invalid_credentials") {
        // A key that passed the MAC check but not its object: revoked or expired.
        await countFailedAuthentication(c, tenantId);
        this.fatal(authenticationFailed);
        return;
      }
      this.fatal(postgresFieldsOf(error, "FATAL"));
      return;
    }
    upstream.binaryType = "arraybuffer";
    upstream.accept();
    if (this.phase === "closed") {
      closeOpen(upstream, "client gone");
      return;
    }
    this.upstream = upstream;
    const bounds = parseWireBounds(response.headers.get(wireBoundsHeader)) ?? this.defaultBounds;
    const relay = new EdgeRelay(this.socket, upstream, bounds, open.pid, {
      refuse: (error) => this.fatal(postgresFieldsOf(error.toWire(), "FATAL")),
    });
    this.relay = relay;
    upstream.addEventListener("message", (event) => relay.fromUpstream(event.data));
    upstream.addEventListener("close", (event) => this.upstreamClosed(event.code));
    upstream.addEventListener("error", () => this.upstreamClosed(1011));
    this.phase = "relaying";
    clearTimeout(this.deadline);
    const held = this.held;
    this.held = [];
    this.heldBytes = 0;
    for (const bytes of held) relay.fromClient(bytes);
    this.registerCancelKey(open.pid, tenantObjectName(loadConfig(c.env), region, tenantId));
  }

  /** Asks the tenant's object in `region` for the wire connection (a WebSocket, or a JSON refusal). */
  private openWire(region: string, open: WireOpen): Promise<Response> {
    return tenantObject(this.c.env, region, open.tenantId).fetch("https://tenant.lessor.internal/wire", {
      headers: { Upgrade: "websocket", [wireOpenHeader]: JSON.stringify(open) },
    });
  }

  /** The tenant's object ended the connection: normally (it said why), or by dying (a restart). */
  private upstreamClosed(code: number): void {
    if (this.phase === "closed") return;
    if (code !== 1000) {
      // The object restarted (a deploy, a crash): the pool generation behind this connection is gone.
      this.fatal(
        postgresFieldsOf(new LessorError("stale_generation", { retryAfterSeconds: 1 }).toWire(), "FATAL"),
      );
      return;
    }
    // What a client that stopped reading was not given goes first (test-only: wire-relay.ts).
    this.relay?.close(true);
    this.closeSocket();
    this.end();
  }

  private registerCancelKey(pid: number, tenantId: string): void {
    const registry = this.c.env.WIRE_CANCELS.getByName(cancelShardOf(pid));
    const register = () => {
      registry.register(pid, tenantId).catch(() => undefined);
    };
    register();
    this.cancelKey = { pid, tenantId, refresh: setInterval(register, cancelRefreshMs) };
  }

  /**
   * A CancelRequest: routed to the tenant whose connection its key names, best effort and without
   * an answer, as Postgres's own; one past its rate limit is told so before the socket closes.
   */
  private async cancel(pid: number, secret: number): Promise<void> {
    const source = this.c.req.header("CF-Connecting-IP") ?? "unknown";
    const outcome = await routeCancel(this.c.env, source, pid, secret);
    if (outcome === "limited") {
      logEvent("warn", "wire_cancel_limited", { pid });
      this.send(errorResponse(postgresFieldsOf(new LessorError("cancel_rate_limited").toWire(), "FATAL")));
    }
  }

  private fatalFrom(error: unknown): void {
    if (this.phase === "closed") return;
    let refusal: LessorError;
    if (error instanceof LessorError) refusal = error;
    else if (durableObjectFailure(error))
      refusal = new LessorError("object_unavailable", { retryAfterSeconds: 1 });
    else {
      logEvent("error", "wire_edge_error", { failure: describeFailure(error) });
      refusal = new LessorError("internal");
    }
    this.fatal(postgresFieldsOf(refusal.toWire(), "FATAL"));
  }

  /** Says why in a FATAL ErrorResponse, then closes. */
  private fatal(fields: PostgresErrorFields): void {
    if (this.phase === "closed") return;
    this.send(errorResponse(fields));
    this.closeSocket();
    this.end();
  }

  private send(data: string | ArrayBuffer | Uint8Array): void {
    try {
      this.socket.send(data);
    } catch {
      this.end();
    }
  }

  private closeSocket(): void {
    closeOpen(this.socket, "closed");
  }

  /**
   * The client's side is gone (or was closed): so is everything behind it. Each socket's close is
   * answered with a close (a peer left unanswered sees "connection lost" rather than a clean end).
   */
  private end(): void {
    if (this.phase === "closed" && this.upstream === null && this.cancelKey === null) return;
    this.phase = "closed";
    clearTimeout(this.deadline);
    this.closeSocket();
    this.relay?.close(false);
    const upstream = this.upstream;
    this.upstream = null;
    if (upstream) closeOpen(upstream, "client gone");
    const key = this.cancelKey;
    this.cancelKey = null;
    if (key) {
      clearInterval(key.refresh);
      this.c.env.WIRE_CANCELS.getByName(cancelShardOf(key.pid))
        .unregister(key.pid, key.tenantId)
        .catch(() => undefined);
    }
  }
}

/**
 * Closes a socket that is still open. One whose peer closed it is already closed (the runtime
 * answered the peer's close): closing it again would report the connection lost.
 */
export function closeOpen(socket: WebSocket, reason: string): void {
  if (socket.readyState !== WebSocket.OPEN) return;
  try {
    socket.close(1000, reason);
  } catch {
    // Closed meanwhile.
  }
}
