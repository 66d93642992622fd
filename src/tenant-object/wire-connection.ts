/**
 * One client connection of the wire endpoint (the room is src/tenant-object/wire.ts): the client's
 * messages, relayed to a leased server connection (wire-server.ts) within the bounds of
 * src/core/wire-flow.ts, and the server's answers relayed back through the edge (wire-link.ts).
 *
 * A message goes to the server only when the gate lets it: a new cycle waits while the server owes
 * past the high-water mark or while the client's side has not taken what it was sent, and what
 * waits is not acknowledged to the edge, which holds the rest. The answers of one pipeline together
 * stay within the answer bound. Past its lifetime, the connection ends at its next quiet boundary
 * (idle, outside a transaction) with FATAL 57P01 `wire_lifetime`, which a driver's pool answers by
 * opening another connection.
 */
import type { PoolClient } from "@neondatabase/serverless";
import {
  errorResponse,
  frontend,
  isFrameProblem,
  isFrontendMessage,
  type Message,
  MessageReader,
  NamedStatements,
  type PoolMode,
  readyForQuery,
  refuseCycles,
} from "../core/pg-wire.ts";
import { Fifo, type WireGauge } from "../core/wire-buffers.ts";
import { AnswerBudget, type WireBounds } from "../core/wire-flow.ts";
import { LessorError, postgresFieldsOf } from "../errors/index.ts";
import { logEventSampled } from "../log/index.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import type { WireOpen } from "../rpc/wire.ts";
import { asLessorError } from "./answers.ts";
import type { LiveLease } from "./pool/index.ts";
import type { TenantRuntime } from "./runtime.ts";
import type { WireConnections } from "./wire.ts";
import {
  type AnswerTarget,
  endsConnection,
  greeting,
  idleReached,
  lifetimeReached,
  notReading,
  pipelineLimit,
  readProblem,
  ServerAnswers,
} from "./wire-answers.ts";
import { EdgeLink } from "./wire-link.ts";
import { ServerLeg } from "./wire-server.ts";

/**
 * Past its lifetime a connection ends at a boundary it has been quiet at this long: a pool's client
 * that just got its answer is back in its pool by then, and the pool drops it on the FATAL.
 */
const lifetimeQuietMs = 250;
export class WireConnection implements AnswerTarget {
  private readonly reader: MessageReader;
  readonly link: EdgeLink;
  held: ServerLeg | null = null;
  private readonly serverSide = new ServerAnswers(this);
  private acquiring = false;
  /** Client messages read and not yet sent on (waiting for a connection, or held back by the gate). */
  private readonly waiting = new Fifo<Message>();
  private waitingBytes = 0;
  /** A refused cycle is still open: messages until its Sync are dropped (core `refuseCycles`). */
  private skipping = false;
  readonly statements: NamedStatements | null;
  readonly answers: AnswerBudget;
  closed = false;
  private finished = false;
  private idleTimer: ReturnType<typeof setTimeout> | undefined;
  private lifetimeTimer: ReturnType<typeof setTimeout> | undefined;
  private quietTimer: ReturnType<typeof setTimeout> | undefined;
  private lifetimeSpent: "time" | "frames" | null = null;
  /** A session-mode connection counts against the session-lease limit. */
  private sessionSlot = false;
  readonly mode: PoolMode;
  readonly pid: number;
  readonly secret: number;
  readonly keyId: string;
  /** Leaves the holder registry (kernel/holders.ts), once admitted. */
  leave: () => void = () => undefined;

  constructor(
    private readonly room: WireConnections,
    private readonly record: TenantRecord,
    private readonly open: WireOpen,
    socket: WebSocket,
    private readonly bounds: WireBounds,
    private readonly gauge: WireGauge,
  ) {
    this.mode = open.mode;
    this.pid = open.pid;
    this.secret = open.secret;
    this.keyId = open.proof.keyId;
    this.reader = new MessageReader(bounds.maxCycleBytes, false, true);
    this.statements = open.mode === "transaction" ? new NamedStatements() : null;
    this.answers = new AnswerBudget(room.rt.config.maxResponseBytes);
    this.link = new EdgeLink(socket, bounds, room.rt.config.maxResponseBytes + bounds.downWindowBytes, {
      data: (chunk) => this.fromClient(chunk),
      caughtUp: () => this.pump(),
      lifetime: () => this.spendLifetime("frames"),
      notDraining: (reason) => this.refuse(notReading(reason, bounds)),
      broken: () =>
        this.refuse(new LessorError("protocol_violation", { internal: "the edge broke the relay's credit" })),
      closed: () => this.close(),
    });
  }

  get rt(): TenantRuntime {
    return this.room.rt;
  }

  /** Takes what the connection needs before its greeting: its lease in session mode, the server's parameters. */
  async start(): Promise<void> {
    const { room, record } = this;
    if (this.mode === "session") {
      room.sessions.holdForWire(record);
      this.sessionSlot = true;
      try {
        const { lease, client } = await room.lease(record, this.keyId);
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
          const { lease, client } = await room.lease(record, this.keyId);
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
    this.link.listen();
    this.touch();
    this.lifetimeTimer = setTimeout(() => this.spendLifetime("time"), this.bounds.lifetimeMs);
  }

  private greet(): void {
    this.link.send(greeting(this.room.parameters, this.open.applicationName, this.pid, this.secret));
  }

  // ── Client to server ─────────────────────────────────────────────────────────────────────────

  private fromClient(chunk: Uint8Array): void {
    if (this.closed) return;
    this.touch();
    clearTimeout(this.quietTimer);
    this.quietTimer = undefined;
    this.reader.push(chunk);
    this.pump();
  }

  /**
   * Moves client messages on as far as the bounds allow: to the server while a connection is held
   * and the gate lets them, into the wait for a connection otherwise. Reads no further while the
   * gate holds a message back: the rest stays in the reader, unacknowledged, and the edge holds
   * what comes after.
   */
  pump(): void {
    const toServer: Uint8Array[] = [];
    while (!this.closed) {
      const held = this.held;
      const message = held ? this.waiting.peek() : undefined;
      if (held && message) {
        const relayed = this.relay(held, message, toServer);
        if (relayed === "hold") break;
        this.waiting.shift();
        this.waitingBytes -= message.bytes.byteLength;
        this.link.took(message.bytes.byteLength);
        if (relayed === "end") break;
        continue;
      }
      const next = this.reader.next();
      if (next === null) break;
      if (isFrameProblem(next)) {
        this.refuse(readProblem(next, this.rt.config.maxBodyBytes));
        break;
      }
      if (!this.take(next)) break;
    }
    this.held?.write(toServer);
    // Messages wait with no connection (the last one went back at its ReadyForQuery): lease another.
    if (!this.held && !this.acquiring && !this.closed && this.waiting.size > 0) void this.acquire();
    this.answers.settle(this.outstanding);
    this.checkLifetime();
    this.measure();
  }

  /** A message just read, with no connection or behind others that wait; false to stop reading. */
  private take(message: Message): boolean {
    if (!isFrontendMessage(message.type)) {
      this.refuse(
        new LessorError("protocol_violation", {
          publicMessage: `Unexpected message type 0x${message.type.toString(16)} after authentication; the connection is closed.`,
        }),
      );
      return false;
    }
    if (message.type === frontend.terminate) {
      this.link.took(message.bytes.byteLength);
      this.close();
      return false;
    }
    if (!this.held && this.skipping) {
      this.link.took(message.bytes.byteLength);
      this.answerRefused([message], null);
      return true;
    }
    // Nothing to synchronise with: a lone Sync is answered here, without a lease.
    if (!this.held && message.type === frontend.sync && this.waiting.size === 0 && !this.acquiring) {
      this.link.took(message.bytes.byteLength);
      this.link.send([readyForQuery("I")]);
      return true;
    }
    this.waiting.push(message);
    this.waitingBytes += message.bytes.byteLength;
    if (!this.held && !this.acquiring) void this.acquire();
    return true;
  }

  /** One message towards the held connection: sent, held back by the gate, or the connection ended. */
  private relay(held: ServerLeg, message: Message, toServer: Uint8Array[]): "sent" | "hold" | "end" {
    const { flight, gate } = held;
    const { maxBodyBytes } = this.rt.config;
    const size = message.bytes.byteLength;
    if (message.type === frontend.copyData && flight.copyIn && flight.copyInBytes + size > maxBodyBytes) {
      this.refuse(
        new LessorError("payload_too_large", {
          publicMessage: `COPY FROM STDIN sent more than ${maxBodyBytes} bytes (LESSOR_MAX_BODY_BYTES); the COPY did not commit and the connection is closed.`,
        }),
      );
      return "end";
    }
    const decision = gate.decide(message.type, size, flight.copyIn, this.link.behind);
    if (decision === "hold") return "hold";
    if (decision === "refuse") {
      this.refuse(
        pipelineLimit(`one statement's messages, up to its Sync, pass ${this.bounds.maxCycleBytes} bytes`),
      );
      return "end";
    }
    const out = this.statements ? this.statements.fromClient(message) : [message.bytes];
    if (!Array.isArray(out)) {
      this.refuse(
        new LessorError(
          out.refuse === "too_many_statements" ? "prepared_statement_limit" : "protocol_violation",
        ),
      );
      return "end";
    }
    const wasIdle = flight.idle;
    // A CopyDone ends COPY in the flight; it still belongs to the COPY's cycle.
    const copyIn = flight.copyIn;
    flight.fromClient(message.type, size);
    for (const part of out) gate.forwarded(part[0] ?? 0, part.byteLength, copyIn);
    toServer.push(...out);
    if (wasIdle && !flight.idle) held.watchdog.arm();
    return "sent";
  }

  /** Takes a lease for the waiting messages (transaction mode), then relays them. */
  private async acquire(): Promise<void> {
    this.acquiring = true;
    let leased: { lease: LiveLease; client: PoolClient };
    try {
      leased = await this.room.lease(this.record, this.keyId);
    } catch (error) {
      this.acquiring = false;
      const refusal = asLessorError(this.rt.tenantId, error);
      logEventSampled("warn", "wire_lease_refused", this.rt.tenantId, {
        tenant: this.rt.tenantId,
        code: refusal.code,
      });
      // The connection itself no longer serves (its key, its tenant's status or owner): a FATAL.
      if (endsConnection(refusal.code)) {
        this.refuse(refusal);
        return;
      }
      // Everything read so far got no connection: one ERROR per cycle, as for the first.
      const refused = this.waiting.takeAll();
      this.waitingBytes = 0;
      for (let next = this.reader.next(); next !== null && !isFrameProblem(next); next = this.reader.next()) {
        refused.push(next);
      }
      for (const message of refused) this.link.took(message.bytes.byteLength);
      this.answerRefused(refused, refusal);
      this.pump();
      return;
    }
    this.acquiring = false;
    if (this.closed) {
      leased.client.release();
      this.room.pool.release(leased.lease);
      return;
    }
    this.attach(leased.lease, leased.client);
    this.pump();
  }

  /** Answers messages that got no connection: ERROR per cycle, ReadyForQuery at its end. */
  private answerRefused(messages: readonly Message[], refusal: LessorError | null): void {
    const error = errorResponse(
      postgresFieldsOf((refusal ?? new LessorError("connection_lost")).toWire(), "ERROR"),
    );
    const { answer, skipping, terminate } = refuseCycles(messages, error, this.skipping);
    this.skipping = skipping;
    if (answer.length > 0) this.link.send(answer);
    if (terminate) this.close();
  }

  /** The client has something outstanding: a cycle owed, or messages Lessor has not sent on. */
  private get outstanding(): boolean {
    return (
      this.acquiring ||
      this.waiting.size > 0 ||
      this.reader.buffered > 0 ||
      (this.held !== null && !this.held.flight.idle)
    );
  }

  // ── Server to client ─────────────────────────────────────────────────────────────────────────

  private attach(lease: LiveLease, client: PoolClient): void {
    const { rt, room, record, bounds, serverSide } = this;
    this.held = new ServerLeg(rt, room.pool, record, lease, client, bounds, serverSide);
    this.statements?.attached();
  }

  // ── Bounds, cancels, lifetime and the end ──────────────────────────────────────────────────────

  /** The client sent something: the idle clock starts again. */
  private touch(): void {
    clearTimeout(this.idleTimer);
    const ttl = this.rt.config.leaseMaxTtlMs;
    this.idleTimer = setTimeout(() => this.refuse(idleReached(ttl, this.held !== null)), ttl);
  }

  private spendLifetime(why: "time" | "frames"): void {
    this.lifetimeSpent ??= why;
    this.checkLifetime();
  }

  /** Past its lifetime, a connection quiet at a boundary (idle, outside a transaction, all sent) ends. */
  private checkLifetime(): void {
    if (this.lifetimeSpent === null || this.closed || this.quietTimer !== undefined) return;
    const held = this.held;
    const atBoundary =
      !this.outstanding && !this.link.behind && (held === null || held.flight.status === "I");
    if (!atBoundary) return;
    this.quietTimer = setTimeout(() => {
      this.quietTimer = undefined;
      const why = this.lifetimeSpent;
      if (why !== null && !this.outstanding && !this.link.behind)
        this.refuse(lifetimeReached(why, this.bounds));
    }, lifetimeQuietMs);
  }

  /** Sends the running statement a cancel (a client's CancelRequest); false if none runs. */
  cancelRunning(): boolean {
    return this.held?.cancelRunning() ?? false;
  }

  /** Ends the connection with `error` as a FATAL ErrorResponse (unless `silent`), then closes. */
  refuse(error: LessorError, silent = false): void {
    if (this.closed) return;
    if (!silent) {
      // A client that does not read is not sent the rest of a message it stopped inside of.
      this.link.last(
        errorResponse(postgresFieldsOf(error.toWire(), "FATAL")),
        error.code !== "client_not_reading",
      );
    }
    logEventSampled("warn", "wire_connection_refused", this.rt.tenantId, {
      tenant: this.rt.tenantId,
      code: error.code,
    });
    this.close();
  }

  /**
   * Closes the connection and drops what it held. A held connection the server owes nothing is
   * settled now (its transaction rolled back by the reset); one still running is cancelled and
   * settled once the server answers, or cut at the end of the cancel's grace.
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.leave();
    clearTimeout(this.idleTimer);
    clearTimeout(this.lifetimeTimer);
    clearTimeout(this.quietTimer);
    this.room.forget(this);
    this.link.close();
    this.reader.clear();
    this.waiting.clear();
    this.waitingBytes = 0;
    if (this.sessionSlot) {
      this.sessionSlot = false;
      this.room.sessions.releaseForWire();
    }
    const held = this.held;
    if (!held) {
      this.finish();
      return;
    }
    held.abandoned = true;
    if (held.flight.idle) {
      held.settle();
      return;
    }
    // Its PREPARE TRANSACTION must be rolled back on it, so it is not cancelled: the statement clock
    // still bounds what runs after it.
    if (!held.preparedTransaction) held.watchdog.cancel();
    held.suspect = held.suspect || !held.preparedTransaction;
    this.measure();
  }

  /** Everything the connection held is released: its counts are read once more and kept. */
  finish(): void {
    if (this.finished) return;
    this.finished = true;
    this.measure();
    this.room.ledger.close(this.gauge);
  }

  /** What the connection holds now, per direction and hop (src/core/wire-flow.ts `WireGauge`). */
  measure(): void {
    const held = this.held;
    this.gauge.set("toServerObject", this.reader.buffered + this.waitingBytes);
    this.gauge.set("toServerOwed", held?.gate.owedBytes ?? 0);
    this.gauge.set("toClientObject", this.link.held + (held?.reader.buffered ?? 0));
    this.gauge.set("toClientInFlight", this.link.inFlight);
  }
}
