/**
 * A pooled connection of the tenant while a wire connection holds it (src/tenant-object/wire.ts):
 * its traffic bypasses the driver's parser (the driver's `data` listeners are set aside and put back
 * when it returns), what it owes is followed (`ServerFlight`, `PipelineGate`), and it is given back
 * once the server owes nothing: reset and returned, or, if it is suspect or closed, terminated and
 * destroyed so its backend is gone before the pool may open another.
 */
import type { PoolClient } from "@neondatabase/serverless";
import { concatBytes, MessageReader, ServerFlight } from "../core/pg-wire.ts";
import { PipelineGate, type WireBounds } from "../core/wire-flow.ts";
import { LessorError } from "../errors/index.ts";
import { sendCancel, terminateAndWait } from "../postgres/index.ts";
import { type DriverStream, driverStream, sendFlight } from "../postgres/internals.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import { markEndedOnPurpose, noteTransactionStatus, resetConnection } from "./pool/connection-state.ts";
import type { LiveLease, TenantPool } from "./pool/index.ts";
import { rollBackPreparedTransactions } from "./prepared.ts";
import type { TenantRuntime } from "./runtime.ts";
import { StatementWatchdog } from "./watchdog.ts";

/** Server messages larger than the answer bound by this much are not waited for: the connection is cut. */
export const floodSlackBytes = 4 * 1024 * 1024;

/** What the wire connection holding a server connection hears from it. */
export interface ServerLegOwner {
  fromServer(leg: ServerLeg, chunk: Uint8Array): void;
  serverClosed(leg: ServerLeg): void;
  /** The statement ran past its bound, or the lease past its lifetime. */
  timedOut(leg: ServerLeg): void;
  leaseExpired(leg: ServerLeg): void;
  /** The leg was given back (or destroyed): nothing it held is left. */
  settled(leg: ServerLeg): void;
}

export class ServerLeg {
  readonly stream: DriverStream;
  /** The driver's own `data` listeners, set aside while the traffic is relayed. */
  private readonly driverListeners: ((chunk: Uint8Array) => void)[];
  readonly reader: MessageReader;
  readonly flight = new ServerFlight();
  readonly gate: PipelineGate;
  readonly watchdog: StatementWatchdog;
  private readonly leasedAt = Date.now();
  /** Its client is gone or refused: nothing more is relayed; it is settled once the server owes nothing. */
  abandoned = false;
  /** A cancel was sent at it (or it was cut): it is never reused. */
  suspect = false;
  /** A `PREPARE TRANSACTION` ran on it: rolled back before the connection is reset. */
  preparedTransaction = false;
  /** The server sent a FATAL ErrorResponse (passed on): the client knows why it ends. */
  fatalPassedOn = false;
  /** Given back (or destroyed): nothing more happens to it. */
  settled = false;
  /** Ends its lifetime as a lease (transaction mode: per transaction; session mode: per connection). */
  private readonly lifetime: ReturnType<typeof setTimeout>;
  private readonly onData = (chunk: Uint8Array) => this.owner.fromServer(this, chunk);
  private readonly onClose = () => this.owner.serverClosed(this);

  constructor(
    private readonly rt: TenantRuntime,
    private readonly pool: TenantPool,
    record: TenantRecord,
    readonly lease: LiveLease,
    readonly client: PoolClient,
    bounds: WireBounds,
    private readonly owner: ServerLegOwner,
  ) {
    this.stream = driverStream(client);
    this.driverListeners = this.stream.listeners("data");
    for (const listener of this.driverListeners) this.stream.removeListener("data", listener);
    this.reader = new MessageReader(rt.config.maxResponseBytes + floodSlackBytes);
    this.gate = new PipelineGate(bounds);
    this.watchdog = new StatementWatchdog(rt, pool.credentials, record, lease.target, client, {
      onTimeout: () => owner.timedOut(this),
    });
    this.stream.on("data", this.onData);
    this.stream.on("close", this.onClose);
    this.lifetime = setTimeout(() => owner.leaseExpired(this), rt.config.leaseMaxLifetimeMs);
  }

  /** Writes client messages to the server, in one frame, past the driver's write coalescing. */
  write(parts: readonly Uint8Array[]): void {
    if (parts.length === 0 || this.abandoned || this.settled) return;
    sendFlight(this.stream, concatBytes(parts));
  }

  /** Sends the running statement a cancel (a client's CancelRequest); false if none runs. */
  cancelRunning(): boolean {
    // One cancel per statement: a connection that was sent one is never reused, so more do nothing.
    if (this.abandoned || this.flight.idle || this.suspect) return false;
    this.suspect = true;
    sendCancel(this.rt.config, this.lease.target, this.client, true);
    return true;
  }

  /**
   * Gives the connection back once the server owes nothing: reset and returned (a prepared
   * transaction rolled back first), or, if it is suspect or closed, terminated and destroyed.
   */
  settle(closed = false): void {
    if (this.settled) return;
    this.settled = true;
    this.abandoned = true;
    this.watchdog.disarm();
    clearTimeout(this.lifetime);
    this.stream.removeListener("data", this.onData);
    this.stream.removeListener("close", this.onClose);
    if (this.reader.buffered > 0) this.suspect = true;
    this.reader.clear();
    this.gate.reset();
    for (const listener of this.driverListeners) this.stream.on("data", listener);
    noteTransactionStatus(this.client, this.flight.status);
    const { client } = this;
    this.pool.release(this.lease);
    this.rt.usage.leaseMs += Date.now() - this.leasedAt;
    this.rt.noteUsage();
    if (closed || this.suspect) {
      markEndedOnPurpose(client);
      const ended = closed ? Promise.resolve() : terminateAndWait(client);
      this.rt.ctx.waitUntil(ended.then(() => client.release(new Error("wire connection ended"))));
    } else {
      const prepared = this.preparedTransaction;
      this.rt.ctx.waitUntil(
        (async () => {
          if (prepared) await rollBackPreparedTransactions(client).catch(() => undefined);
          client.release(await resetConnection(client));
        })(),
      );
    }
    this.owner.settled(this);
  }
}

/** The refusal of an answer past the bound, for a pipeline or one statement. */
export function tooLarge(max: number): LessorError {
  return new LessorError("response_too_large", {
    publicMessage: `The answer is larger than ${max} bytes (LESSOR_MAX_RESPONSE_BYTES; the answers of statements pipelined together count together); select fewer rows or columns. The connection is closed.`,
  });
}
