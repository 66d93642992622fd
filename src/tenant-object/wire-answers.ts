/**
 * The server's side of a wire connection (src/tenant-object/wire-connection.ts): what a held
 * connection of the pool sends (wire-server.ts) read off its bytes and passed on to the client
 * through the edge, within the pipeline's answer bound; the connection given back at the first
 * ReadyForQuery that says idle with nothing owed (transaction mode); and what the client is told
 * when a bound ends it.
 */
import {
  authenticationOk,
  backend,
  backendKeyData,
  commandTag,
  errorFields,
  type FrameProblem,
  isFrameProblem,
  type Message,
  type NamedStatements,
  noticeResponse,
  type PoolMode,
  parameterStatus,
  readyForQuery,
} from "../core/pg-wire.ts";
import type { AnswerBudget, WireBounds } from "../core/wire-flow.ts";
import { type ErrorCode, LessorError } from "../errors/index.ts";
import type { TenantRuntime } from "./runtime.ts";
import type { EdgeLink } from "./wire-link.ts";
import { type ServerLeg, type ServerLegOwner, tooLarge } from "./wire-server.ts";

/** Said once per LISTEN in transaction mode: its notifications end with the transaction's connection. */
const listenNotice = noticeResponse({
  severity: "WARNING",
  code: "01000",
  message:
    "LISTEN lasts only until this transaction ends in Lessor's transaction mode (the connection is reset then); use session mode (options=-c lessor.pool_mode=session) to receive notifications.",
});

/** What the server's side needs of its wire connection. */
export interface AnswerTarget {
  readonly rt: TenantRuntime;
  readonly mode: PoolMode;
  readonly link: EdgeLink;
  readonly answers: AnswerBudget;
  readonly statements: NamedStatements | null;
  readonly closed: boolean;
  /** The connection of the pool the wire connection holds now. */
  held: ServerLeg | null;
  refuse(error: LessorError, silent?: boolean): void;
  /** Moves waiting client messages on (the server answered a cycle: the gate may open). */
  pump(): void;
  measure(): void;
  /** Everything the connection held is released. */
  finish(): void;
}

export class ServerAnswers implements ServerLegOwner {
  constructor(private readonly to: AnswerTarget) {}

  fromServer(held: ServerLeg, chunk: Uint8Array): void {
    if (held.settled) return;
    const { to } = this;
    held.reader.push(chunk);
    const toClient: Uint8Array[] = [];
    let answered = false;
    for (;;) {
      const message = held.reader.next();
      if (message === null) break;
      if (isFrameProblem(message)) {
        // A row too large to wait for, or bytes that are not the protocol: the connection is cut.
        held.watchdog.cut();
        held.suspect = true;
        to.refuse(
          message.problem === "oversized"
            ? tooLarge(to.rt.config.maxResponseBytes)
            : new LessorError("connection_lost", { internal: "unreadable server message" }),
        );
        break;
      }
      held.flight.fromServer(message);
      if (message.type === backend.readyForQuery) {
        held.gate.answered();
        answered = true;
      }
      if (held.abandoned) continue;
      if (!this.passOn(held, message, toClient)) continue;
      toClient.push(message.bytes);
    }
    if (toClient.length > 0) to.link.send(toClient);
    if (!held.settled && held.flight.idle) {
      held.watchdog.pause();
      if (held.abandoned) held.settle();
      else if (to.mode === "transaction" && held.flight.releasable && held.reader.buffered === 0) {
        to.held = null;
        held.settle();
      }
    }
    if (answered && !to.closed) to.pump();
    else to.measure();
  }

  /** What a server message means for the connection; false when it is not passed on. */
  private passOn(held: ServerLeg, message: Message, toClient: Uint8Array[]): boolean {
    const { to } = this;
    const usage = to.rt.usage;
    switch (message.type) {
      case backend.dataRow:
      case backend.copyData:
        if (message.type === backend.dataRow) usage.rowsReturned++;
        if (!to.answers.add(message.bytes.byteLength)) {
          to.refuse(tooLarge(to.rt.config.maxResponseBytes));
          return false;
        }
        return true;
      case backend.commandComplete: {
        const tag = commandTag(message.body);
        if (tag === "PREPARE TRANSACTION") {
          held.preparedTransaction = true;
          to.refuse(new LessorError("prepared_transaction_refused"));
          return false;
        }
        if (tag === "LISTEN" && to.mode === "transaction") toClient.push(listenNotice);
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
        to.refuse(new LessorError("protocol_violation", { publicMessage: "Replication is not available." }));
        return false;
    }
    return to.statements ? to.statements.fromServer(message) : true;
  }

  /** The server connection closed under a held lease (its backend ended, or it was cut). */
  serverClosed(held: ServerLeg): void {
    if (held.settled) return;
    const { to } = this;
    if (to.held === held && !held.abandoned) {
      held.abandoned = true;
      to.held = null;
      // A FATAL the server sent is already on its way to the client; otherwise say what happened.
      to.refuse(
        new LessorError("connection_lost", { internal: "server connection closed" }),
        held.fatalPassedOn,
      );
    }
    held.settle(true);
  }

  timedOut(held: ServerLeg): void {
    const { to } = this;
    if (to.held !== held) return;
    to.refuse(
      new LessorError("statement_timeout", {
        // The relay answers at the bound, without Postgres's word: an open transaction did not commit,
        // but a COMMIT (or a statement outside a transaction) whose answer was still on its way may have.
        publicMessage: `The statement ran longer than ${to.rt.config.statementTimeoutMs} ms (LESSOR_STATEMENT_TIMEOUT_MS) and was stopped; the connection is closed. An open transaction did not commit; a COMMIT, or a statement outside a transaction, whose answer had not come back may or may not have.`,
      }),
    );
  }

  leaseExpired(held: ServerLeg): void {
    const { to } = this;
    if (to.held !== held) return;
    to.refuse(
      new LessorError("lease_expired", {
        publicMessage: `This connection held its database connection past LESSOR_LEASE_MAX_LIFETIME_MS (${to.rt.config.leaseMaxLifetimeMs} ms); its transaction did not commit and the connection is closed.`,
      }),
    );
  }

  settled(held: ServerLeg): void {
    const { to } = this;
    if (to.held === held) to.held = null;
    if (to.closed) to.finish();
  }
}

// ── What the client is told ─────────────────────────────────────────────────────────────────────

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

/** A wire connection's greeting: authenticated, the server's parameters, its cancel key, ready. */
export function greeting(
  parameters: ReadonlyMap<string, string> | null,
  applicationName: string,
  pid: number,
  secret: number,
): Uint8Array[] {
  const reported = new Map(parameters ?? fallbackParameters);
  reported.set("application_name", applicationName);
  return [
    authenticationOk(),
    ...[...reported].map(([name, value]) => parameterStatus(name, value)),
    backendKeyData(pid, secret),
    readyForQuery("I"),
  ];
}

/** The refusal of a pipeline past a bound, naming it. */
export function pipelineLimit(what: string): LessorError {
  return new LessorError("pipeline_limit", {
    publicMessage: `The client pipelined past Lessor's bound: ${what}; the connection is closed.`,
  });
}

/** The client's side did not take what was sent to it. */
export function notReading(reason: "time" | "bytes", bounds: WireBounds): LessorError {
  return new LessorError("client_not_reading", {
    publicMessage:
      reason === "time"
        ? `The client did not take the answers sent to it within ${bounds.drainMs} ms (LESSOR_WIRE_DRAIN_MS); the connection is closed.`
        : "The client did not take the answers sent to it, and Lessor holds no more of them; the connection is closed.",
  });
}

/** The refusal of a client stream that cannot be read on. */
export function readProblem(problem: FrameProblem, maxBodyBytes: number): LessorError {
  switch (problem.problem) {
    case "oversized":
      return new LessorError("payload_too_large", {
        publicMessage: `A message of ${problem.declared} bytes is larger than this deployment accepts (LESSOR_MAX_BODY_BYTES, ${maxBodyBytes}); the connection is closed.`,
      });
    case "fragmented":
      return new LessorError("frame_limit", {
        publicMessage: `A message of ${problem.declared} bytes came in more than ${problem.frames - 1} WebSocket frames; Lessor takes a message in at most 16 frames and one more per 4 KiB of it. The connection is closed.`,
      });
    case "malformed":
      return new LessorError("protocol_violation");
  }
}

/** The refusal at a connection's lifetime: what a pool answers by opening another connection. */
export function lifetimeReached(why: "time" | "frames", bounds: WireBounds): LessorError {
  return new LessorError("wire_lifetime", {
    retryAfterSeconds: 1,
    publicMessage:
      why === "time"
        ? `This connection reached its lifetime (LESSOR_WIRE_MAX_LIFETIME_MS, ${bounds.lifetimeMs} ms); open another (a pool does so by itself).`
        : `This connection relayed its share of frames (LESSOR_WIRE_MAX_FRAMES, ${bounds.lifetimeFrames}); open another (a pool does so by itself).`,
  });
}

/** The refusal of a connection idle past `LESSOR_LEASE_MAX_TTL_MS`. */
export function idleReached(ttl: number, inTransaction: boolean): LessorError {
  return new LessorError("lease_expired", {
    publicMessage: `This connection was idle past LESSOR_LEASE_MAX_TTL_MS (${ttl} ms) and is closed${inTransaction ? "; its transaction did not commit" : ""}.`,
  });
}

/**
 * Refusals at a lease that end the connection with a FATAL rather than an ERROR per cycle: the
 * connection itself no longer has access (its key, its tenant's status) or its tenant moved away.
 */
export function endsConnection(code: ErrorCode): boolean {
  return (
    code === "key_revoked" || code === "key_expired" || code === "tenant_disabled" || code === "tenant_moved"
  );
}
