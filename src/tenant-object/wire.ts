/**
 * Wire connections: the Postgres wire protocol over a WebSocket, after the edge (src/routes/wire.ts)
 * answered the startup and checked the key (docs/adr/017-wire-protocol.md). Each connection relays
 * a client's messages to a pooled connection of the tenant and the server's answers back; the
 * protocol's decisions come from src/core/pg-wire.ts, the bounds from src/core/wire-flow.ts, and the
 * room only moves bytes and leases:
 *
 * - **Transaction mode** (default): a lease and a connection are taken when a client message arrives
 *   with none held, and given back (reset, off the client's path) at the first ReadyForQuery that
 *   says idle with nothing owed. Named prepared statements follow the client (core `NamedStatements`).
 * - **Session mode**: one lease and connection for the connection's life, counted with the session
 *   leases against the pool size, reset when it ends.
 *
 * One client connection is a `WireConnection` (wire-connection.ts); the connection of the pool it
 * holds is a `ServerLeg` (wire-server.ts); the hop to the edge, with its credit, is an `EdgeLink`
 * (wire-link.ts). What each holds is counted per connection in `wireObjectLedger`.
 */
import type { PoolClient } from "@neondatabase/serverless";
import { type WireBufferSnapshot, WireLedger } from "../core/wire-buffers.ts";
import { wireBounds } from "../core/wire-flow.ts";
import { serverParameters } from "../postgres/index.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import { type WireOpen, wireBoundsHeader } from "../rpc/wire.ts";
import { asLessorError } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { admitHolder, requireAccess } from "./kernel/access.ts";
import { gateError } from "./kernel/gate.ts";
import { CredentialMoved, type LiveLease, type TenantPool } from "./pool/index.ts";
import type { TenantRuntime } from "./runtime.ts";
import type { SessionLeases } from "./sessions.ts";
import { WireConnection } from "./wire-connection.ts";

/**
 * What the wire connections of this isolate's tenant objects hold, per connection (by process id):
 * exposed so that tests read the bytes a connection holds, never a clock (and the last connections
 * that ended, read after they released everything).
 */
export const wireObjectLedger = new WireLedger();

/** One wire connection's counts on the object's side, live or recently ended; null if unknown. */
export function wireObjectBuffers(pid: number): WireBufferSnapshot | null {
  return wireObjectLedger.find(pid);
}

/** Where the object keeps the server's parameters for the greetings of its next instances (kv). */

/** The room: every wire connection of the tenant this object serves. */
export class WireConnections {
  private readonly live = new Map<number, WireConnection>();
  readonly ledger = wireObjectLedger;
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
      const bounds = wireBounds(this.rt.config);
      const gauge = this.ledger.open(open.pid);
      const connection = new WireConnection(this, record, open, here, bounds, gauge);
      try {
        await connection.start();
      } catch (error) {
        here.close(1000, "refused");
        this.ledger.close(gauge);
        throw error;
      }
      try {
        connection.leave = admitHolder(this.rt, {
          kind: open.mode === "session" ? "wire_session" : "wire_transaction",
          keyId: open.proof.keyId,
          leased: () => connection.held !== null,
          end: (error) => connection.refuse(error),
        });
      } catch (error) {
        connection.close();
        throw error;
      }
      this.live.set(open.pid, connection);
      connection.listen();
      return new Response(null, {
        status: 101,
        webSocket: edge,
        headers: { [wireBoundsHeader]: JSON.stringify(bounds) },
      });
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

  /** A lease and a connection of the current generation (once more if a rotation moved it meanwhile). */
  async lease(record: TenantRecord, keyId: string): Promise<{ lease: LiveLease; client: PoolClient }> {
    // Access is re-checked at every lease, never remembered from the connection's start: a key
    // revoked or expired, or a tenant disabled, since, ends the connection (kernel/access.ts).
    requireAccess(this.rt, keyId);
    // The tenant moved away, or an erase's gate closed, while the connection was open: nothing new
    // starts (the gate's table, purpose `acquire`). Moved, it ends with a FATAL its driver answers
    // by reconnecting, which reaches the new owner.
    const refused = gateError(this.rt, "acquire", record.tenantId);
    if (refused) throw refused;
    for (let attempt = 0; ; attempt++) {
      const lease = await this.pool.acquire(record);
      try {
        this.auth.refuseIfDisabled();
        const client = await this.pool.checkout(lease);
        this.learnParameters(client);
        return { lease, client };
      } catch (error) {
        this.pool.release(lease);
        if (!(error instanceof CredentialMoved) || attempt > 0) throw error;
      }
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
      this.rt.storage.write("wireParameters", entries);
  }

  /** The parameters a previous instance learned, if this one has none yet. */
  recallParameters(): void {
    if (this.parameters !== null || !this.rt.storage.isOpen) return;
    const kept = this.rt.storage.read("wireParameters");
    if (kept) this.parameters = new Map(kept);
  }
}
