/**
 * Runs a tenant's statements on one pooled connection, bounded, the way Neon's HTTP endpoint does:
 *
 * - always the extended protocol with the unnamed statement (Parse, Bind, Describe, Execute, Sync
 *   in one flight, encoded at once by src/core/extended-flight.ts and written once), so a string
 *   holds exactly one statement, parameters are checked by Postgres's Bind, and nothing reaches the
 *   connection unseen;
 * - raw text values in array mode, with the field list (shape.ts turns them into what the caller
 *   asked for);
 * - each row is encoded as the JSON it is answered with as it arrives (src/core/result-shape.ts), so
 *   an answer is held once and measured in the bytes that travel; it stops growing at
 *   `LESSOR_MAX_RESPONSE_BYTES`: past it rows are read and dropped, not kept, so the connection goes
 *   back clean; a single row too big to wait for gets the connection cut (watchdog.ts);
 * - a prepared transaction is never left behind: a `PREPARE TRANSACTION` is rolled back at once and
 *   refused;
 * - an end user's statements (JWT mode) carry a prelude in the first statement's flight that sets the
 *   claims and the role for the transaction (docs/adr/012-end-user-jwts.md): before one Sync, so it
 *   costs no round trip and shares the statement's transaction, implicit or not.
 */
import type { PoolClient } from "@neondatabase/serverless";
import { extendedFlight } from "../core/extended-flight.ts";
import { FlightSplitter, type ResetReport } from "../core/flight-splitter.ts";
import {
  beginStatement,
  type FieldDescription,
  type SqlRequest,
  type Statement,
} from "../core/neon-protocol.ts";
import { textMessage } from "../core/pg-wire.ts";
import {
  driverOutputMode,
  type EncodedResult,
  type OutputMode,
  type RowEncoder,
  rowEncoder,
  utf8Length,
} from "../core/result-shape.ts";
import { LessorError } from "../errors/index.ts";
import { noteServerParameter } from "../postgres/index.ts";
import {
  chunkPart,
  type DriverConnection,
  type DriverStream,
  sendFlight,
  submitQuery,
} from "../postgres/internals.ts";
import { noteTransactionStatus, sessionResetSql } from "./pool/connection-state.ts";
import { rollBackPreparedTransactions } from "./prepared.ts";

/** A result's JSON beyond its fields and rows: its keys, command tag and counts, generously. */
const resultFrameBytes = 128;

/** One statement's result: its rows already encoded as the JSON they are answered with. */
export type RawResult = EncodedResult;

/**
 * Bytes an answer may still take, counted as the JSON that will travel (UTF-8, escapes and, in
 * object mode, every row's column names); shared by every statement of one request, which are all
 * answered in its `mode`.
 */
export class ResponseBudget {
  private used = 0;

  constructor(
    readonly max: number,
    readonly mode: OutputMode = driverOutputMode,
  ) {}

  /** Counts `bytes`; false once the answer is over the limit. */
  take(bytes: number): boolean {
    this.used += bytes;
    return this.used <= this.max;
  }

  get exceeded(): boolean {
    return this.used > this.max;
  }
}

/**
 * Why an answer overran: `too_large` once its rows pass the budget (the rest are read and dropped,
 * so the connection stays usable); `flood` once the bytes on the wire pass it by a margin (one row
 * too big to wait for: the connection must be cut).
 */
export type Overrun = "too_large" | "flood";

/** What the runner calls when an answer overruns (watchdog.ts decides what to do). */
export type OverrunHandler = (why: Overrun) => void;

/** Wire bytes beyond the budget after which a connection is cut rather than drained. */
const drainSlackBytes = 4 * 1024 * 1024;

/** The per-request reset as its Query message, encoded once. */
const resetQuery = textMessage(0x51, sessionResetSql);

/**
 * A driver `Submittable`: the client hands it the connection to write messages to and calls its
 * `handle…` methods with each backend message until ReadyForQuery (or an error).
 *
 * With `onResetReport`, the per-request reset rides in the same flight, as a simple query after the
 * statement's Sync: Postgres runs it right after the statement, whatever the statement did (its
 * error, its open transaction), and the connection is clean one ReadyForQuery later, without a
 * round trip of its own. The statement's result settles at its own ReadyForQuery (the caller is
 * answered then). The reset's answer never reaches the driver: `FlightSplitter` reads it off the
 * connection's bytes (docs/adr/025-reset-read-off-the-wire.md), and `resetDone` settles at its
 * ReadyForQuery. Until then the connection is not back in the pool (src/tenant-object/query.ts), so
 * nothing else is sent on it.
 */
class BoundedStatement {
  readonly result: Promise<RawResult>;
  /** Settles when the pipelined reset has run: undefined if clean, the error if not; null without one. */
  readonly resetDone: Promise<Error | undefined> | null;
  private resolveReset: (failed: Error | undefined) => void = () => undefined;
  private statementSettled = false;
  private resetSettled = false;
  private resolve: (result: RawResult) => void = () => undefined;
  private reject: (error: unknown) => void = () => undefined;
  private fields: FieldDescription[] = [];
  private fieldsJson: string | undefined;
  private encode: RowEncoder | null = null;
  private rows: string[] = [];
  private command = "";
  private rowCount: number | null = null;
  private overran = false;
  private wireBytes = 0;
  private stream: DriverStream | null = null;
  /** The prelude's results are not the caller's: its rows and its command tag are skipped. */
  private inPrelude: boolean;
  private readonly onData = (chunk: Uint8Array) => {
    this.wireBytes += chunk.byteLength;
    if (this.wireBytes > this.budget.max + drainSlackBytes) {
      this.overrun();
      this.onOverrun("flood");
    }
  };

  constructor(
    private readonly statement: Statement,
    private readonly budget: ResponseBudget,
    private readonly onOverrun: OverrunHandler,
    private readonly prelude: Statement | null = null,
    /** Given what the pipelined reset's answer said (its status, its parameters); null: no pipelined reset. */
    private readonly onResetReport: ((report: ResetReport) => void) | null = null,
  ) {
    this.inPrelude = prelude !== null;
    this.result = new Promise<RawResult>((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
    this.resetDone =
      onResetReport === null
        ? null
        : new Promise<Error | undefined>((resolve) => {
            this.resolveReset = resolve;
          });
  }

  private finishReset(failed: Error | undefined): void {
    if (this.resetSettled) return;
    this.resetSettled = true;
    this.resolveReset(failed);
  }

  submit(connection: DriverConnection): null {
    const stream = connection.stream;
    if (this.onResetReport) this.splitReset(stream, this.onResetReport);
    this.stream = stream;
    stream.on("data", this.onData);
    // The whole flight in one write (src/core/extended-flight.ts): the prelude, the statement, and
    // the reset if it rides along.
    sendFlight(stream, extendedFlight(this.statement, this.prelude, this.onResetReport ? resetQuery : null));
    return null;
  }

  /**
   * Puts a `FlightSplitter` between the connection's bytes and the driver: the statement's answer
   * passes through, the reset's is read and reported, and the driver's listeners are back once it
   * has ended (or the connection has).
   */
  private splitReset(stream: DriverStream, report: (report: ResetReport) => void): void {
    const driverListeners = stream.listeners("data");
    for (const listener of driverListeners) stream.removeListener("data", listener);
    const splitter = new FlightSplitter();
    const forward = (bytes: Uint8Array) => {
      for (const listener of driverListeners) listener(bytes);
    };
    const finish = () => {
      stream.removeListener("data", onChunk);
      stream.removeListener("close", finish);
      for (const listener of driverListeners) stream.on("data", listener);
      const said = splitter.report();
      report(said);
      this.finishReset(said.failure === null ? undefined : new Error(said.failure));
    };
    const onChunk = (chunk: Uint8Array) => {
      const cut = splitter.push(chunk);
      if (cut.statementEnd > 0)
        forward(cut.statementEnd === chunk.byteLength ? chunk : chunkPart(chunk, 0, cut.statementEnd));
      if (cut.resetEnd === null) return;
      finish();
      if (cut.resetEnd < chunk.byteLength) forward(chunkPart(chunk, cut.resetEnd));
    };
    stream.on("data", onChunk);
    stream.on("close", finish);
  }

  private overrun(): void {
    if (this.overran) return;
    this.overran = true;
    // Dropped at once: an answer that will not be sent holds no memory while the rest drains.
    this.rows = [];
    this.onOverrun("too_large");
  }

  private settle(): void {
    this.stream?.removeListener("data", this.onData);
    this.stream = null;
  }

  handleRowDescription(message: { fields: FieldDescription[] }): void {
    if (this.inPrelude) return;
    this.fields = message.fields.map((field) => ({
      name: field.name,
      tableID: field.tableID,
      columnID: field.columnID,
      dataTypeID: field.dataTypeID,
      dataTypeSize: field.dataTypeSize,
      dataTypeModifier: field.dataTypeModifier,
      format: field.format,
    }));
    this.encode = rowEncoder(this.fields, this.budget.mode);
    // The field list travels too (and the result's frame: command, counts, keys); its JSON is made
    // once, here, and reused for the answer.
    this.fieldsJson = JSON.stringify(this.fields);
    if (!this.budget.take(utf8Length(this.fieldsJson) + resultFrameBytes)) this.overrun();
  }

  handleDataRow(message: { fields: (string | null)[] }): void {
    if (this.overran || this.inPrelude) return;
    const row = (this.encode ?? rowEncoder([], this.budget.mode))(message.fields);
    // The row as it will travel, and the comma before the next one.
    if (!this.budget.take(utf8Length(row) + 1)) {
      this.overrun();
      return;
    }
    this.rows.push(row);
  }

  handleCommandComplete(message: { text?: string; command?: string }): void {
    if (this.inPrelude) {
      this.inPrelude = false;
      return;
    }
    const tag = message.text ?? message.command ?? "";
    const match = /^([A-Za-z]+)(?: (\d+))?(?: (\d+))?/.exec(tag);
    this.command = tag === "PREPARE TRANSACTION" ? tag : (match?.[1] ?? "");
    this.rowCount = match?.[3] ? Number(match[3]) : match?.[2] ? Number(match[2]) : null;
  }

  handleEmptyQuery(): void {
    this.command = "";
  }

  handlePortalSuspended(): void {
    // Never asked for (Execute fetches every row); nothing to do.
  }

  handleCopyInResponse(connection: DriverConnection): void {
    connection.sendCopyFail("COPY FROM STDIN is not supported through Lessor");
  }

  handleCopyData(message: { chunk?: Uint8Array }): void {
    // COPY TO STDOUT: nothing of it is answered, but it still counts against the budget.
    if (!this.budget.take(message.chunk?.byteLength ?? 0)) this.overrun();
  }

  handleError(error: unknown): void {
    if (this.statementSettled) return;
    this.statementSettled = true;
    this.settle();
    this.reject(this.overran ? tooLarge(this.budget.max) : error);
    // A server's ErrorResponse ends the statement only: its Sync's ReadyForQuery and the reset
    // follow. Anything else (the connection died) ends the whole flight.
    if (!isServerError(error)) this.finishReset(asError(error));
  }

  handleReadyForQuery(): void {
    if (this.statementSettled) return;
    this.statementSettled = true;
    this.settle();
    if (this.overran || this.budget.exceeded) {
      this.reject(tooLarge(this.budget.max));
      return;
    }
    this.resolve({
      command: this.command,
      rowCount: this.rowCount,
      fields: this.fields,
      ...(this.fieldsJson === undefined ? {} : { fieldsJson: this.fieldsJson }),
      rows: this.rows,
      rowAsArray: this.budget.mode.arrayMode,
    });
  }
}

/** An ErrorResponse the server sent (the connection lives on), as opposed to a dead connection. */
function isServerError(error: unknown): boolean {
  return typeof (error as { severity?: unknown } | null)?.severity === "string";
}

function asError(error: unknown): Error {
  return error instanceof Error ? error : new Error("the connection failed");
}

function tooLarge(max: number): LessorError {
  return new LessorError("response_too_large", {
    publicMessage: `The answer is larger than ${max} bytes (LESSOR_MAX_RESPONSE_BYTES); select fewer rows or columns.`,
  });
}

/**
 * Runs one statement. A `PREPARE TRANSACTION` is rolled back at once and refused: a prepared
 * transaction outlives the lease, the pool and a restart, and pins the host's horizon.
 */
export async function runStatement(
  client: PoolClient,
  statement: Statement,
  budget: ResponseBudget,
  onOverrun: OverrunHandler,
  prelude: Statement | null = null,
  pipelinedReset: ((done: Promise<Error | undefined>) => void) | null = null,
): Promise<RawResult> {
  // COPY changes the protocol's state mid-flight (a CopyInResponse waits for data the pipelined
  // query would be taken for): a statement that may be one is reset the plain way, after.
  const pipeline = pipelinedReset !== null && !mayCopy(statement) && (prelude === null || !mayCopy(prelude));
  const bounded = new BoundedStatement(
    statement,
    budget,
    onOverrun,
    prelude,
    pipeline
      ? (report) => {
          // What the driver did not see of the connection: where the reset left it.
          if (report.status !== null) noteTransactionStatus(client, report.status);
          for (const [name, value] of report.parameters) noteServerParameter(client, name, value);
        }
      : null,
  );
  if (pipeline && bounded.resetDone) pipelinedReset(bounded.resetDone);
  submitQuery(client, bounded);
  const result = await bounded.result;
  if (result.command === "PREPARE TRANSACTION") {
    await rollBackPreparedTransactions(client);
    throw new LessorError("prepared_transaction_refused");
  }
  return result;
}

/** Whether a statement's text could be a COPY (a cheap, conservative test: any "copy" in it). */
function mayCopy(statement: Statement): boolean {
  return /copy/i.test(statement.query);
}

/**
 * Executes the request. A Postgres error propagates with its fields; a failed transaction is rolled
 * back before the error propagates. With `pipelinedReset`, a single statement carries the
 * per-request reset in its flight and hands over the promise of its end (a batch's transaction is
 * reset the plain way, after). `prelude` (JWT mode) runs in the first statement's flight, inside
 * its transaction.
 */
export async function executeSqlRequest(
  client: PoolClient,
  request: SqlRequest,
  budget: ResponseBudget,
  onOverrun: OverrunHandler,
  prelude: Statement | null = null,
  pipelinedReset: ((done: Promise<Error | undefined>) => void) | null = null,
): Promise<RawResult[]> {
  if (request.kind === "single") {
    return [await runStatement(client, request.statement, budget, onOverrun, prelude, pipelinedReset)];
  }
  if (request.statements.length === 0) return [];
  await client.query(beginStatement(request.options));
  const results: RawResult[] = [];
  try {
    for (const [index, statement] of request.statements.entries()) {
      results.push(await runStatement(client, statement, budget, onOverrun, index === 0 ? prelude : null));
    }
    await client.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw error;
  }
  return results;
}
