/**
 * A `/sql` statement's flight carries the per-request reset after its Sync (src/tenant-object/
 * execute.ts), so its answer comes back as two answers, each ended by a ReadyForQuery: the
 * statement's, then the reset's. `FlightSplitter` finds where the first ends in the bytes as they
 * arrive, whatever the chunking:
 *
 * - the statement's answer goes to the driver unread (it is the caller's);
 * - the reset's answer is nobody's: it is read here, at the cost of its framing, instead of being
 *   parsed by the driver into a dozen message objects and events (a NoticeResponse, nine
 *   CommandCompletes, a row description and a row). That parse was a sixth of the isolate's CPU per
 *   warm request (issue 25, docs/adr/025-reset-read-off-the-wire.md).
 *
 * Of the reset's answer it keeps what decides the connection's fate: its first ErrorResponse, the
 * transaction status of its ReadyForQuery, and the parameters it reported (ParameterStatus:
 * `RESET ALL` reports what it puts back). Anything it cannot frame (a length below 4, a kept message
 * past its bound) ends the split as a failure: the connection is then destroyed, never reused.
 *
 * Pure: bytes in, offsets and a report out.
 */
import {
  errorFields,
  parameterStatusOf,
  readInt32,
  readyForQueryStatus,
  type TransactionStatus,
} from "./pg-wire.ts";

const headerBytes = 5;
/** The largest reset message whose body is kept (errors, parameters, ReadyForQuery); all are tiny. */
const maxKeptBodyBytes = 64 * 1024;
const readyForQueryType = 0x5a; // 'Z'
const errorResponseType = 0x45; // 'E'
const parameterStatusType = 0x53; // 'S'

/** What the reset's answer said. */
export interface ResetReport {
  /** Why the connection is not clean (the reset's error, a status other than idle, bad framing); null if it is. */
  failure: string | null;
  /** The transaction status its ReadyForQuery reported, if it got that far. */
  status: TransactionStatus | null;
  /** The parameters it reported, in order. */
  parameters: [name: string, value: string][];
}

/** Where a chunk splits: `[0, statementEnd)` is the statement's; from `resetEnd` on it is the driver's again. */
export interface Cut {
  statementEnd: number;
  /** Where the reset's answer ended in this chunk, or null if it has not ended yet. */
  resetEnd: number | null;
}

type Phase = "statement" | "reset" | "done";

export class FlightSplitter {
  private phase: Phase = "statement";
  /** A header split across chunks, while it is put together (rare: made only then). */
  private header: Uint8Array | null = null;
  private headerHave = 0;
  private type = 0;
  /** Body bytes still to come of the current message; -1 while its header is read. */
  private bodyLeft = -1;
  private body: Uint8Array | null = null;
  private bodyHave = 0;
  private failure: string | null = null;
  private status: TransactionStatus | null = null;
  private parameters: [string, string][] | null = null;

  /** Whether the reset's answer has ended (or could not be read): nothing more is taken. */
  get done(): boolean {
    return this.phase === "done";
  }

  report(): ResetReport {
    const failure =
      this.failure ??
      (this.phase !== "done"
        ? "the reset did not finish"
        : this.status !== "I"
          ? `the reset left the connection in transaction status ${this.status ?? "?"}`
          : null);
    return { failure, status: this.status, parameters: this.parameters ?? [] };
  }

  /** Takes the next chunk of what the server sent; says which part of it is whose. */
  push(chunk: Uint8Array): Cut {
    const length = chunk.byteLength;
    let statementEnd = this.phase === "statement" ? length : 0;
    let at = 0;
    while (at < length && this.phase !== "done") {
      if (this.bodyLeft < 0) {
        let declared: number;
        if (this.headerHave === 0 && at + headerBytes <= length) {
          this.type = chunk[at] ?? 0;
          declared = readInt32(chunk, at + 1);
          at += headerBytes;
        } else {
          this.header ??= new Uint8Array(headerBytes);
          while (this.headerHave < headerBytes && at < length)
            this.header[this.headerHave++] = chunk[at++] ?? 0;
          if (this.headerHave < headerBytes) break;
          this.headerHave = 0;
          this.type = this.header[0] ?? 0;
          declared = readInt32(this.header, 1);
        }
        if (declared < 4) return this.broken("a message length below 4", statementEnd, length);
        this.bodyLeft = declared - 4;
        this.body = null;
        this.bodyHave = 0;
        if (this.phase === "reset" && isKept(this.type)) {
          // The reset's ReadyForQuery, whole in this chunk (the usual case): read where it lies.
          if (this.type === readyForQueryType && this.bodyLeft === 1 && at < length) {
            this.status = readyForQueryStatus(chunk.subarray(at, at + 1));
            this.phase = "done";
            return { statementEnd, resetEnd: at + 1 };
          }
          if (this.bodyLeft > maxKeptBodyBytes)
            return this.broken("a reset message past its bound", statementEnd, length);
          this.body = new Uint8Array(this.bodyLeft);
        }
      }
      const take = Math.min(this.bodyLeft, length - at);
      if (this.body && take > 0) this.body.set(chunk.subarray(at, at + take), this.bodyHave);
      this.bodyHave += take;
      at += take;
      this.bodyLeft -= take;
      if (this.bodyLeft > 0) break;
      this.bodyLeft = -1;
      if (this.phase === "statement") {
        if (this.type === readyForQueryType) {
          this.phase = "reset";
          statementEnd = at;
        }
        continue;
      }
      this.completeResetMessage(this.body ?? new Uint8Array(0));
      if (this.done) return { statementEnd, resetEnd: at };
    }
    return { statementEnd, resetEnd: null };
  }

  private completeResetMessage(body: Uint8Array): void {
    switch (this.type) {
      case errorResponseType: {
        if (this.failure !== null) return;
        const fields = errorFields(body);
        this.failure = `the reset failed: ${fields.get("C") ?? "?"} ${fields.get("M") ?? ""}`.trim();
        return;
      }
      case parameterStatusType: {
        const parameter = parameterStatusOf(body);
        if (!parameter) this.failure ??= "a malformed ParameterStatus in the reset's answer";
        else if (this.parameters) this.parameters.push(parameter);
        else this.parameters = [parameter];
        return;
      }
      case readyForQueryType:
        this.status = readyForQueryStatus(body);
        this.phase = "done";
        return;
      default:
        // CommandComplete, NoticeResponse, RowDescription, DataRow, NotificationResponse: nobody's.
        return;
    }
  }

  /** Framing failed: the split ends; whatever is left is the driver's, which fails on it in turn. */
  private broken(why: string, statementEnd: number, length: number): Cut {
    const wasStatement = this.phase === "statement";
    this.failure ??= `the server's answer could not be framed: ${why}`;
    this.phase = "done";
    // Inside the statement's answer, the rest goes to the driver (whose parser fails on it); inside
    // the reset's, it is dropped with the connection.
    return { statementEnd: wasStatement ? length : statementEnd, resetEnd: length };
  }
}

function isKept(type: number): boolean {
  return type === errorResponseType || type === parameterStatusType || type === readyForQueryType;
}
