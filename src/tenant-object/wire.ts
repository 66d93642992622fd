/**
 * Wire connections: the Postgres wire protocol over a WebSocket, after the edge (src/routes/wire.ts)
 * answered the startup and checked the key (docs/adr/017-wire-protocol.md). Each connection relays
 * a client's messages to a pooled connection of the tenant and the server's answers back; the
 * protocol's decisions come from src/core/pg-wire.ts, and this room only moves bytes and leases:
 *
 * - **Transaction mode** (default): a lease and a connection are taken when a client message arrives
 *   with none held, and given back (reset, off the client's path) at the first ReadyForQuery that
 *   says idle with nothing owed. Named prepared statements follow the client (core `NamedStatements`).
 * - **Session mode**: one lease and connection for the connection's life, counted with the session
 *   leases against the pool size, reset when it ends.
 *
 * While a connection is leased its traffic bypasses the driver's own parser (its `data` listeners
 * are set aside and put back when it returns), so nothing is decoded twice and nothing the client
 * sends is interpreted by the driver. The bounds are `/sql`'s: the statement clock (watchdog.ts)
 * runs while the server owes an answer; an answer cycle past `LESSOR_MAX_RESPONSE_BYTES`, a COPY or
 * message past `LESSOR_MAX_BODY_BYTES`, a `PREPARE TRANSACTION`, a protocol violation, a lease held
 * past its lifetime or idle past its TTL each end the connection with a FATAL ErrorResponse. A
 * connection whose statement was still running is cancelled, drained and terminated, never reused.
 */
import type { PoolClient } from "@neondatabase/serverless";
import {
  authenticationOk,
  backend,
  backendKeyData,
  commandTag,
  concatBytes,
  errorFields,
  errorResponse,
  frontend,
  isFrameProblem,
  isFrontendMessage,
  type Message,
  MessageReader,
  NamedStatements,
  noticeResponse,
  type PoolMode,
  parameterStatus,
  readyForQuery,
  refuseCycles,
  ServerFlight,
} from "../core/pg-wire.ts";
import { LessorError, postgresFieldsOf } from "../errors/index.ts";
import { logEventSampled } from "../log/index.ts";
import { sendCancel, serverParameters, terminateAndWait } from "../postgres/index.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import type { WireOpen } from "../rpc/wire.ts";
import { asLessorError } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { markEndedOnPurpose, noteTransactionStatus, resetConnection } from "./connection-state.ts";
import { rollBackPreparedTransactions } from "./execute.ts";
import { CredentialMoved, type LiveLease, type TenantPool } from "./pool.ts";
import type { TenantRuntime } from "./runtime.ts";
import type { SessionLeases } from "./sessions.ts";
import { StatementWatchdog } from "./watchdog.ts";

/** Where the object keeps the server's parameters for the greetings of its next instances (kv). */
const parametersKey = "wireParameters";

/**
 * What a greeting reports when the server's own parameters are not known yet and no connection can
 * be had to learn them (the pool cannot start): the settings every tenant connection runs with.
 */
const fallbackParameters: ReadonlyMap<string, string> = new Map([
  ["client_encoding", "UTF8"],
  ["server_encoding", "UTF8"],
  ["DateStyle", "ISO, MDY"],
  ["IntervalStyle", "postgres"],
  ["integer_datetimes", "on"],
  ["standard_conforming_strings", "on"],
  ["is_superuser", "off"],
]);

/** Framing around a message body: a message may be this much larger than `LESSOR_MAX_BODY_BYTES`. */
const messageFramingBytes = 64 * 1024;

/** Server messages larger than the answer bound by this much are not waited for: the connection is cut. */
const floodSlackBytes = 4 * 1024 * 1024;

/** Said once per LISTEN in transaction mode: its notifications end with the transaction's connection. */
const listenNotice = noticeResponse({
  severity: "WARNING",
  code: "01000",
  message:
    "LISTEN lasts only until this transaction ends in Lessor's transaction mode (the connection is reset then); use session mode (options=-c lessor.pool_mode=session) to receive notifications.",
});

interface DataStream {
  on(event: "data" | "close", listener: (chunk: Uint8Array) => void): void;
  removeListener(event: "data" | "close", listener: (chunk: Uint8Array) => void): void;
  listeners(event: "data"): ((chunk: Uint8Array) => void)[];
  write(bytes: Uint8Array): boolean;
}

/** A pooled connection while a wire connection holds it. */
interface Held {
  lease: LiveLease;
  client: PoolClient;
  stream: DataStream;
  /** The driver's own `data` listeners, set aside while the traffic is relayed. */
  driverListeners: ((chunk: Uint8Array) => void)[];
  reader: MessageReader;
  flight: ServerFlight;
  watchdog: StatementWatchdog;
  leasedAt: number;
  /** Its client is gone or refused: nothing more is relayed; it is settled once the server owes nothing. */
  abandoned: boolean;
  /** A cancel was sent at it (or it was cut): it is never reused. */
  suspect: boolean;
  /** A `PREPARE TRANSACTION` ran on it: rolled back before the connection is reset. */
  preparedTransaction: boolean;
  /** The server sent a FATAL ErrorResponse (passed on): the client knows why it ends. */
  fatalPassedOn: boolean;
  /** Given back (or destroyed): nothing more happens to it. */
  settled: boolean;
  /** Ends its lifetime as a lease (transaction mode: per transaction; session mode: per connection). */
  lifetime: ReturnType<typeof setTimeout> | undefined;
  onData: (chunk: Uint8Array) => void;
  onClose: () => void;
}

/** The room: every wire connection of the tenant this object serves. */
export class WireConnections {
  private readonly live = new Map<number, WireConnection>();
  /** What the server reports at connection start (its version, encoding, …), as the greeting repeats it. */
  parameters: ReadonlyMap<string, string> | null = null;

  constructor(
    readonly rt: TenantRuntime,
    readonly auth: TenantAuth,
    readonly pool: TenantPool,
    readonly sessions: SessionLeases,
  ) {}

  get size(): number {
    return this.live.size;
  }

  /**
   * Accepts a wire connection the edge authenticated: checks the key hash as every route does,
   * takes the session-mode lease (or learns the server's parameters), and answers the WebSocket
   * the connection's traffic will cross; or the refusal, as JSON, for the edge to send as FATAL.
   */
  async accept(open: WireOpen): Promise<Response> {
    let authenticated = false;
    try {
      const record = await this.auth.authenticate(open.tenantId, open.proof);
      authenticated = true;
      const pair = new WebSocketPair();
      const [edge, here] = [pair[0], pair[1]];
      // Binary frames as ArrayBuffer (the standard's default is Blob).
      here.binaryType = "arraybuffer";
      here.accept();
      const connection = new WireConnection(this, record, open, here);
      try {
        await connection.start();
      } catch (error) {
        here.close(1000, "refused");
        throw error;
      }
      this.live.set(open.pid, connection);
      connection.listen();
      return new Response(null, { status: 101, webSocket: edge });
    } catch (error) {
      return Response.json(
        { error: asLessorError(this.rt.tenantId, error).toWire(), authenticated },
        { status: 403 },
      );
    }
  }

  forget(connection: WireConnection): void {
    if (this.live.get(connection.pid) === connection) this.live.delete(connection.pid);
  }

  /**
   * A CancelRequest for the connection with process id `pid`: honoured only with its secret, and
   * only for that connection's own statement (a connection that was sent a cancel is never reused,
   * so a late one cannot reach another client's statement). Answers whether a cancel was sent.
   */
  cancel(pid: number, secret: number): boolean {
    const connection = this.live.get(pid);
    if (!connection) return false;
    // Compared without an early exit: the two numbers leak nothing through timing.
    if ((connection.secret ^ secret) !== 0) return false;
    return connection.cancelRunning();
  }

  /** Ends every wire connection (forced drain, erase, a disabled tenant) with `error`. */
  endAll(error: LessorError): void {
    for (const connection of [...this.live.values()]) connection.refuse(error);
  }

  /** Ends the connections that authenticated with a key the record no longer holds: revocation is immediate. */
  endForRemovedKeys(record: TenantRecord): void {
    const usable = new Set(record.keys.map((key) => key.keyId));
    for (const connection of [...this.live.values()]) {
      if (usable.has(connection.keyId)) continue;
      connection.refuse(
        new LessorError("lease_lost", {
          publicMessage: "The key this connection authenticated with was revoked; the connection is closed.",
        }),
      );
    }
  }

  /**
   * Learns the server's parameters from a connection of the pool, and keeps them for the object's
   * next instances (one storage write when they change, none on the hot path otherwise).
   */
  learnParameters(client: PoolClient): void {
    const parameters = serverParameters(client);
    if (parameters.size === 0) return;
    const entries = [...parameters];
    const known = this.parameters ? JSON.stringify([...this.parameters]) : null;
    this.parameters = parameters;
    if (known !== JSON.stringify(entries) && this.rt.storage.isOpen)
      this.rt.storage.write(parametersKey, entries);
  }

  /** The parameters a previous instance learned, if this one has none yet. */
  recallParameters(): void {
    if (this.parameters !== null || !this.rt.storage.isOpen) return;
    const kept = this.rt.storage.read<[string, string][]>(parametersKey);
    if (kept) this.parameters = new Map(kept);
  }
}

/** One client connection. */
class WireConnection {
  private readonly reader: MessageReader;
  private held: Held | null = null;
  private acquiring = false;
  /** Client messages waiting for a connection (transaction mode), and their bytes. */
  private queue: Message[] = [];
  private queueBytes = 0;
  /** A refused cycle is still open: messages until its Sync are dropped (core `refuseCycles`). */
  private skipping = false;
  private readonly statements: NamedStatements | null;
  private closed = false;
  private idleTimer: ReturnType<typeof setTimeout> | undefined;
  /** A session-mode connection counts against the session-lease limit. */
  private sessionSlot = false;
  private readonly mode: PoolMode;
  readonly pid: number;
  readonly secret: number;
  readonly keyId: string;

  constructor(
    private readonly room: WireConnections,
    private readonly record: TenantRecord,
    private readonly open: WireOpen,
    private readonly socket: WebSocket,
  ) {
    this.mode = open.mode;
    this.pid = open.pid;
    this.secret = open.secret;
    this.keyId = open.proof.keyId;
    this.reader = new MessageReader(room.rt.config.maxBodyBytes + messageFramingBytes);
    this.statements = open.mode === "transaction" ? new NamedStatements() : null;
  }

  private get rt(): TenantRuntime {
    return this.room.rt;
  }

  /** Takes what the connection needs before its greeting: its lease in session mode, the server's parameters. */
  async start(): Promise<void> {
    const { room, record } = this;
    if (this.mode === "session") {
      this.room.sessions.holdForWire(record);
      this.sessionSlot = true;
      try {
        const { lease, client } = await this.lease();
        this.attach(lease, client);
      } catch (error) {
        this.sessionSlot = false;
        room.sessions.releaseForWire();
        throw error;
      }
    } else {
      room.recallParameters();
      if (room.parameters === null) {
        // The tenant's first wire connection: a pooled connection says what the server reports
        // (starting the pool, as the first query would). If none can be had (the budget is full),
        // the greeting says what every tenant connection is set to, and the query that follows
        // gets the refusal, as an ERROR it can retry.
        try {
          const { lease, client } = await this.lease();
          room.learnParameters(client);
          client.release();
          room.pool.release(lease);
        } catch {
          // Greeted with the fallback below.
        }
      }
    }
    this.greet();
  }

  /** Starts relaying the client's messages (the socket is accepted). */
  listen(): void {
    this.socket.addEventListener("message", (event) => this.fromClient(event.data));
    this.socket.addEventListener("close", () => this.close());
    this.socket.addEventListener("error", () => this.close());
    this.touch();
  }

  private greet(): void {
    const parameters = new Map(this.room.parameters ?? fallbackParameters);
    parameters.set("application_name", this.open.applicationName);
    this.send([
      authenticationOk(),
      ...[...parameters].map(([name, value]) => parameterStatus(name, value)),
      backendKeyData(this.pid, this.secret),
      readyForQuery("I"),
    ]);
  }

  /** A lease and a connection of the current generation (once more if a rotation moved it meanwhile). */
  private async lease(): Promise<{ lease: LiveLease; client: PoolClient }> {
    // An erase's gate closed (or it committed) while the connection was open: nothing new starts.
    const erase = this.rt.erase;
    if (erase !== null) {
      throw new LessorError(erase.state === "erasing" ? "tenant_erasing" : "tenant_erased", {
        retryAfterSeconds: 5,
      });
    }
    for (let attempt = 0; ; attempt++) {
      const lease = await this.room.pool.acquire(this.record);
      try {
        this.room.auth.refuseIfDisabled();
        const client = await this.room.pool.checkout(lease);
        this.room.learnParameters(client);
        return { lease, client };
      } catch (error) {
        this.room.pool.release(lease);
        if (!(error instanceof CredentialMoved) || attempt > 0) throw error;
      }
    }
  }

  // ── Client to server ─────────────────────────────────────────────────────────────────────────

  private fromClient(data: string | ArrayBuffer): void {
    if (this.closed) return;
    if (typeof data === "string") {
      this.refuse(
        new LessorError("protocol_violation", {
          publicMessage: "The Postgres wire protocol travels in binary WebSocket messages, not text.",
        }),
      );
      return;
    }
    this.touch();
    this.reader.push(new Uint8Array(data));
    const toServer: Uint8Array[] = [];
    for (;;) {
      const message = this.reader.next();
      if (message === null) break;
      if (isFrameProblem(message)) {
        this.refuse(
          message.problem === "oversized"
            ? new LessorError("payload_too_large", {
                publicMessage: `A message of ${message.declared} bytes is larger than this deployment accepts (LESSOR_MAX_BODY_BYTES); the connection is closed.`,
              })
            : new LessorError("protocol_violation"),
        );
        break;
      }
      this.onClientMessage(message, toServer);
      if (this.closed) break;
    }
    this.writeToServer(toServer);
  }

  private onClientMessage(message: Message, toServer: Uint8Array[]): void {
    if (!isFrontendMessage(message.type)) {
      this.refuse(
        new LessorError("protocol_violation", {
          publicMessage: `Unexpected message type 0x${message.type.toString(16)} after authentication; the connection is closed.`,
        }),
      );
      return;
    }
    if (message.type === frontend.terminate) {
      this.close();
      return;
    }
    const held = this.held;
    if (held) {
      this.relay(held, message, toServer);
      return;
    }
    if (this.skipping) {
      this.answerRefused([message], null);
      return;
    }
    // Nothing to synchronise with: a lone Sync is answered here, without a lease.
    if (message.type === frontend.sync && this.queue.length === 0 && !this.acquiring) {
      this.send([readyForQuery("I")]);
      return;
    }
    this.queue.push(message);
    this.queueBytes += message.bytes.byteLength;
    if (this.queueBytes > this.rt.config.maxBodyBytes + messageFramingBytes) {
      this.refuse(new LessorError("payload_too_large"));
      return;
    }
    if (!this.acquiring) void this.acquire();
  }

  private relay(held: Held, message: Message, toServer: Uint8Array[]): void {
    const { flight } = held;
    if (
      message.type === frontend.copyData &&
      flight.copyIn &&
      flight.copyInBytes + message.bytes.byteLength > this.rt.config.maxBodyBytes
    ) {
      this.refuse(
        new LessorError("payload_too_large", {
          publicMessage: `COPY FROM STDIN sent more than ${this.rt.config.maxBodyBytes} bytes (LESSOR_MAX_BODY_BYTES); the COPY did not commit and the connection is closed.`,
        }),
      );
      return;
    }
    const out = this.statements ? this.statements.fromClient(message) : [message.bytes];
    if (!Array.isArray(out)) {
      this.refuse(
        new LessorError(
          out.refuse === "too_many_statements" ? "prepared_statement_limit" : "protocol_violation",
        ),
      );
      return;
    }
    const wasIdle = flight.idle;
    flight.fromClient(message.type, message.bytes.byteLength);
    toServer.push(...out);
    if (wasIdle && !flight.idle) held.watchdog.arm();
  }

  private writeToServer(parts: Uint8Array[]): void {
    const held = this.held;
    if (!held || parts.length === 0 || held.abandoned) return;
    held.stream.write(concatBytes(parts));
  }

  /** Takes a lease for the queued messages (transaction mode), then relays them. */
  private async acquire(): Promise<void> {
    this.acquiring = true;
    let leased: { lease: LiveLease; client: PoolClient };
    try {
      leased = await this.lease();
    } catch (error) {
      this.acquiring = false;
      const refusal = asLessorError(this.rt.tenantId, error);
      logEventSampled("warn", "wire_lease_refused", this.rt.tenantId, {
        tenant: this.rt.tenantId,
        code: refusal.code,
      });
      const queued = this.queue;
      this.queue = [];
      this.queueBytes = 0;
      this.answerRefused(queued, refusal);
      return;
    }
    this.acquiring = false;
    if (this.closed) {
      leased.client.release();
      this.room.pool.release(leased.lease);
      return;
    }
    this.attach(leased.lease, leased.client);
    const queued = this.queue;
    this.queue = [];
    this.queueBytes = 0;
    const toServer: Uint8Array[] = [];
    for (const message of queued) {
      const held = this.held;
      if (this.closed || !held) break;
      this.relay(held, message, toServer);
    }
    this.writeToServer(toServer);
  }

  /** Answers messages that got no connection: ERROR per cycle, ReadyForQuery at its end. */
  private answerRefused(messages: readonly Message[], refusal: LessorError | null): void {
    const error = errorResponse(
      postgresFieldsOf((refusal ?? new LessorError("connection_lost")).toWire(), "ERROR"),
    );
    const { answer, skipping, terminate } = refuseCycles(messages, error, this.skipping);
    this.skipping = skipping;
    if (answer.length > 0) this.send(answer);
    if (terminate) this.close();
  }

  // ── Server to client ─────────────────────────────────────────────────────────────────────────

  private attach(lease: LiveLease, client: PoolClient): void {
    const connection = (client as unknown as { connection: { stream: DataStream } }).connection;
    const stream = connection.stream;
    const driverListeners = stream.listeners("data");
    for (const listener of driverListeners) stream.removeListener("data", listener);
    const held: Held = {
      lease,
      client,
      stream,
      driverListeners,
      reader: new MessageReader(this.rt.config.maxResponseBytes + floodSlackBytes),
      flight: new ServerFlight(),
      watchdog: new StatementWatchdog(
        this.rt,
        this.room.pool.credentials,
        this.record,
        lease.target,
        client,
        {
          onTimeout: () => this.refuse(this.timeoutRefusal()),
        },
      ),
      leasedAt: Date.now(),
      abandoned: false,
      suspect: false,
      preparedTransaction: false,
      fatalPassedOn: false,
      settled: false,
      lifetime: undefined,
      onData: (chunk) => this.fromServer(held, chunk),
      onClose: () => this.serverClosed(held),
    };
    stream.on("data", held.onData);
    stream.on("close", held.onClose);
    held.lifetime = setTimeout(
      () =>
        this.refuse(
          new LessorError("lease_expired", {
            publicMessage: `This connection held its database connection past LESSOR_LEASE_MAX_LIFETIME_MS (${this.rt.config.leaseMaxLifetimeMs} ms); its transaction did not commit and the connection is closed.`,
          }),
        ),
      this.rt.config.leaseMaxLifetimeMs,
    );
    this.statements?.attached();
    this.held = held;
  }

  private timeoutRefusal(): LessorError {
    return new LessorError("statement_timeout", {
      // The relay answers at the bound, without Postgres's word: an open transaction did not commit,
      // but a COMMIT (or a statement outside a transaction) whose answer was still on its way may have.
      publicMessage: `The statement ran longer than ${this.rt.config.statementTimeoutMs} ms (LESSOR_STATEMENT_TIMEOUT_MS) and was stopped; the connection is closed. An open transaction did not commit; a COMMIT, or a statement outside a transaction, whose answer had not come back may or may not have.`,
    });
  }

  private fromServer(held: Held, chunk: Uint8Array): void {
    if (held.settled) return;
    held.reader.push(chunk);
    const toClient: Uint8Array[] = [];
    for (;;) {
      const message = held.reader.next();
      if (message === null) break;
      if (isFrameProblem(message)) {
        // A row too large to wait for, or bytes that are not the protocol: the connection is cut.
        held.watchdog.cut();
        held.suspect = true;
        this.refuse(
          message.problem === "oversized"
            ? tooLarge(this.rt.config.maxResponseBytes)
            : new LessorError("connection_lost", { internal: "unreadable server message" }),
        );
        break;
      }
      held.flight.fromServer(message);
      if (held.abandoned) continue;
      if (!this.passOn(held, message, toClient)) continue;
      toClient.push(message.bytes);
    }
    if (toClient.length > 0) this.send(toClient);
    if (held.settled || !held.flight.idle) return;
    held.watchdog.pause();
    if (held.abandoned) {
      this.settle(held);
      return;
    }
    if (this.mode === "transaction" && held.flight.releasable && held.reader.buffered === 0) {
      this.held = null;
      this.settle(held);
    }
  }

  /** What a server message means for the connection; false when it is not passed on. */
  private passOn(held: Held, message: Message, toClient: Uint8Array[]): boolean {
    const usage = this.rt.usage;
    switch (message.type) {
      case backend.dataRow:
      case backend.copyData:
        if (message.type === backend.dataRow) usage.rowsReturned++;
        if (held.flight.answerBytes > this.rt.config.maxResponseBytes) {
          this.refuse(tooLarge(this.rt.config.maxResponseBytes));
          return false;
        }
        return true;
      case backend.commandComplete: {
        const tag = commandTag(message.body);
        if (tag === "PREPARE TRANSACTION") {
          held.preparedTransaction = true;
          this.refuse(new LessorError("prepared_transaction_refused"));
          return false;
        }
        if (tag === "LISTEN" && this.mode === "transaction") toClient.push(listenNotice);
        break;
      }
      case backend.errorResponse:
        usage.errors++;
        if (errorFields(message.body).get("S") === "FATAL") {
          held.suspect = true;
          held.fatalPassedOn = true;
        }
        break;
      case backend.readyForQuery:
        usage.queries++;
        break;
      case backend.copyBothResponse:
        this.refuse(
          new LessorError("protocol_violation", { publicMessage: "Replication is not available." }),
        );
        return false;
    }
    return this.statements ? this.statements.fromServer(message) : true;
  }

  /** The server connection closed under a held lease (its backend ended, or it was cut). */
  private serverClosed(held: Held): void {
    if (held.settled) return;
    if (this.held === held && !held.abandoned) {
      held.abandoned = true;
      this.held = null;
      // A FATAL the server sent is already on its way to the client; otherwise say what happened.
      this.refuse(
        new LessorError("connection_lost", { internal: "server connection closed" }),
        held.fatalPassedOn,
      );
    }
    this.settle(held, true);
  }

  /**
   * Gives a held connection back once the server owes nothing: reset and returned (a prepared
   * transaction rolled back first), or, if it is suspect or closed, terminated and destroyed so
   * its backend is gone before the pool may open another.
   */
  private settle(held: Held, closed = false): void {
    if (held.settled) return;
    held.settled = true;
    if (this.held === held) this.held = null;
    held.abandoned = true;
    held.watchdog.disarm();
    clearTimeout(held.lifetime);
    held.stream.removeListener("data", held.onData);
    held.stream.removeListener("close", held.onClose);
    if (held.reader.buffered > 0) held.suspect = true;
    for (const listener of held.driverListeners) held.stream.on("data", listener);
    noteTransactionStatus(held.client, held.flight.status);
    const { client } = held;
    const room = this.room;
    room.pool.release(held.lease);
    this.rt.usage.leaseMs += Date.now() - held.leasedAt;
    this.rt.noteUsage();
    if (closed || held.suspect) {
      markEndedOnPurpose(client);
      const ended = closed ? Promise.resolve() : terminateAndWait(client);
      this.rt.ctx.waitUntil(ended.then(() => client.release(new Error("wire connection ended"))));
      return;
    }
    const prepared = held.preparedTransaction;
    this.rt.ctx.waitUntil(
      (async () => {
        if (prepared) await rollBackPreparedTransactions(client).catch(() => undefined);
        client.release(await resetConnection(client));
      })(),
    );
  }

  // ── Bounds, cancels and the end ────────────────────────────────────────────────────────────────

  /** The client sent something: the idle clock starts again. */
  private touch(): void {
    clearTimeout(this.idleTimer);
    const ttl = this.rt.config.leaseMaxTtlMs;
    this.idleTimer = setTimeout(
      () =>
        this.refuse(
          new LessorError("lease_expired", {
            publicMessage: `This connection was idle past LESSOR_LEASE_MAX_TTL_MS (${ttl} ms) and is closed${this.held ? "; its transaction did not commit" : ""}.`,
          }),
        ),
      ttl,
    );
  }

  /** Sends the running statement a cancel (a client's CancelRequest); false if none runs. */
  cancelRunning(): boolean {
    const held = this.held;
    if (!held || held.abandoned || held.flight.idle) return false;
    // No grace and cut here: the client asked, and Postgres promises nothing of a cancel either.
    held.suspect = true;
    sendCancel(this.rt.config, held.lease.target, held.client, true);
    return true;
  }

  /** Ends the connection with `error` as a FATAL ErrorResponse (unless `silent`), then closes. */
  refuse(error: LessorError, silent = false): void {
    if (this.closed) return;
    if (!silent) this.send([errorResponse(postgresFieldsOf(error.toWire(), "FATAL"))]);
    logEventSampled("warn", "wire_connection_refused", this.rt.tenantId, {
      tenant: this.rt.tenantId,
      code: error.code,
    });
    this.close();
  }

  /**
   * Closes the connection. A held connection the server owes nothing is settled now (its transaction
   * rolled back by the reset); one still running is cancelled and settled once the server answers,
   * or cut at the end of the cancel's grace.
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.idleTimer);
    this.room.forget(this);
    // A socket the edge closed is already closed (the runtime answered); only an open one is closed.
    if (this.socket.readyState === WebSocket.OPEN) {
      try {
        this.socket.close(1000, "closed");
      } catch {
        // Closed meanwhile.
      }
    }
    if (this.sessionSlot) {
      this.sessionSlot = false;
      this.room.sessions.releaseForWire();
    }
    const held = this.held;
    if (!held) return;
    held.abandoned = true;
    if (held.flight.idle) {
      this.settle(held);
      return;
    }
    // Its PREPARE TRANSACTION must be rolled back on it, so it is not cancelled: the statement clock
    // still bounds what runs after it.
    if (!held.preparedTransaction) held.watchdog.cancel();
    held.suspect = held.suspect || !held.preparedTransaction;
  }

  private send(parts: readonly Uint8Array[]): void {
    if (this.closed) return;
    try {
      this.socket.send(concatBytes(parts));
    } catch {
      this.close();
    }
  }
}

function tooLarge(max: number): LessorError {
  return new LessorError("response_too_large", {
    publicMessage: `The answer is larger than ${max} bytes (LESSOR_MAX_RESPONSE_BYTES); select fewer rows or columns. The connection is closed.`,
  });
}
