/**
 * The HTTP protocol of the Neon serverless driver's `neon()` client, as Lessor speaks it on `/sql`.
 *
 * Request: `POST` with `{query, params}` or `{queries: [{query, params}, …]}` (a transaction), and
 * headers `Neon-Array-Mode`, `Neon-Raw-Text-Output` and, for transactions, `Neon-Batch-*`.
 * Answer: the driver always asks for raw text in array mode and parses types itself, so rows are
 * arrays of Postgres text values with the field list; a transaction answers `{results: […]}`.
 * A Postgres error is status 400 with the error's fields, which the driver turns into a NeonDbError.
 */

import { type OutputMode, outputModeOf } from "./result-shape.ts";

export type IsolationLevel = "ReadUncommitted" | "ReadCommitted" | "RepeatableRead" | "Serializable";

export interface Statement {
  query: string;
  /** Already serialised by the driver: strings (bytea as `\x…` hex, arrays as literals) or null. */
  params: (string | null)[];
}

export interface TransactionOptions {
  isolationLevel: IsolationLevel | null;
  readOnly: boolean | null;
  deferrable: boolean | null;
}

/** What the caller asked for; `output` is how results are shaped (result-shape.ts). */
export type SqlRequest = { output: OutputMode } & (
  | { kind: "single"; statement: Statement }
  | { kind: "transaction"; statements: Statement[]; options: TransactionOptions }
);

/** A field description as node-postgres and Neon report it. */
export interface FieldDescription {
  name: string;
  tableID: number;
  columnID: number;
  dataTypeID: number;
  dataTypeSize: number;
  dataTypeModifier: number;
  format: string;
}

/** The fields of a Postgres error that the driver copies onto NeonDbError. */
export const postgresErrorFields = [
  "severity",
  "code",
  "detail",
  "hint",
  "position",
  "internalPosition",
  "internalQuery",
  "where",
  "schema",
  "table",
  "column",
  "dataType",
  "constraint",
  "file",
  "line",
  "routine",
] as const;

export type PostgresErrorBody = { message: string } & Partial<
  Record<(typeof postgresErrorFields)[number], string>
>;

/** Limits that keep one request from occupying a connection with an unbounded batch. */
export const maxStatementsPerTransaction = 1000;
export const maxParamsPerStatement = 65_535;

const isolationLevels: Record<string, IsolationLevel> = {
  readuncommitted: "ReadUncommitted",
  readcommitted: "ReadCommitted",
  repeatableread: "RepeatableRead",
  serializable: "Serializable",
};

export type ParseProblem = { problem: string };

/** Validates a parsed JSON body and the batch headers into a SqlRequest. */
export function parseSqlRequest(
  body: unknown,
  headers: { get(name: string): string | null },
): SqlRequest | ParseProblem {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return { problem: "The body must be a JSON object with `query` or `queries`." };
  }
  const record = body as Record<string, unknown>;
  if ("queries" in record) {
    const queries = record.queries;
    // An empty batch is a valid (empty) transaction, as on Neon: `sql.transaction([])`.
    if (!Array.isArray(queries)) return { problem: "`queries` must be an array." };
    if (queries.length > maxStatementsPerTransaction) {
      return { problem: `A transaction holds at most ${maxStatementsPerTransaction} statements.` };
    }
    const statements: Statement[] = [];
    for (const [index, item] of queries.entries()) {
      const statement = parseStatement(item);
      if ("problem" in statement) return { problem: `queries[${index}]: ${statement.problem}` };
      statements.push(statement);
    }
    const options = parseTransactionOptions(headers);
    if ("problem" in options) return options;
    return { kind: "transaction", statements, options, output: outputModeOf(headers) };
  }
  const statement = parseStatement(record);
  if ("problem" in statement) return statement;
  return { kind: "single", statement, output: outputModeOf(headers) };
}

function parseStatement(item: unknown): Statement | ParseProblem {
  if (typeof item !== "object" || item === null) return { problem: "a statement is an object with `query`." };
  const { query, params } = item as Record<string, unknown>;
  if (typeof query !== "string" || query.trim() === "")
    return { problem: "`query` must be a non-empty string." };
  if (params === undefined || params === null) return { query, params: [] };
  if (!Array.isArray(params)) return { problem: "`params` must be an array." };
  if (params.length > maxParamsPerStatement) return { problem: "too many parameters." };
  const out: (string | null)[] = [];
  for (const value of params) {
    if (value === null || typeof value === "string") out.push(value);
    else if (typeof value === "number" || typeof value === "boolean") out.push(String(value));
    else if (Array.isArray(value)) out.push(arrayLiteral(value));
    else if (typeof value === "object") out.push(JSON.stringify(value));
    else return { problem: "a parameter must be a string, number, boolean, object or null." };
  }
  return { query, params: out };
}

/**
 * A JSON array as a Postgres array literal, as Neon's endpoint turns one (`[1, null, "a\"b"]` →
 * `{1,NULL,"a\"b"}`): null is NULL, strings are quoted and escaped, objects become quoted JSON,
 * nested arrays nest. The official driver sends arrays already as literals; curl users send JSON.
 */
export function arrayLiteral(values: readonly unknown[]): string {
  const quote = (text: string) => `"${text.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}"`;
  const items = values.map((value): string => {
    if (value === null || value === undefined) return "NULL";
    if (Array.isArray(value)) return arrayLiteral(value);
    if (typeof value === "string") return quote(value);
    if (typeof value === "number" || typeof value === "boolean") return String(value);
    return quote(JSON.stringify(value));
  });
  return `{${items.join(",")}}`;
}

function parseTransactionOptions(headers: {
  get(name: string): string | null;
}): TransactionOptions | ParseProblem {
  const rawIsolation = headers.get("Neon-Batch-Isolation-Level");
  let isolationLevel: IsolationLevel | null = null;
  if (rawIsolation) {
    const level = isolationLevels[rawIsolation.replaceAll(/[\s_-]/g, "").toLowerCase()];
    if (!level) return { problem: "Neon-Batch-Isolation-Level is not an isolation level." };
    isolationLevel = level;
  }
  const readOnly = parseBooleanHeader(headers.get("Neon-Batch-Read-Only"));
  const deferrable = parseBooleanHeader(headers.get("Neon-Batch-Deferrable"));
  if (readOnly === "invalid" || deferrable === "invalid") {
    return { problem: "Neon-Batch-Read-Only and Neon-Batch-Deferrable take true or false." };
  }
  return { isolationLevel, readOnly, deferrable };
}

function parseBooleanHeader(raw: string | null): boolean | null | "invalid" {
  if (raw === null || raw === "") return null;
  if (raw === "true") return true;
  if (raw === "false") return false;
  return "invalid";
}

const isolationSql: Record<IsolationLevel, string> = {
  ReadUncommitted: "READ UNCOMMITTED",
  ReadCommitted: "READ COMMITTED",
  RepeatableRead: "REPEATABLE READ",
  Serializable: "SERIALIZABLE",
};

/** The `BEGIN` that opens a transaction batch with its options. */
export function beginStatement(options: TransactionOptions): string {
  const parts = ["BEGIN"];
  if (options.isolationLevel) parts.push(`ISOLATION LEVEL ${isolationSql[options.isolationLevel]}`);
  if (options.readOnly !== null) parts.push(options.readOnly ? "READ ONLY" : "READ WRITE");
  if (options.deferrable !== null) parts.push(options.deferrable ? "DEFERRABLE" : "NOT DEFERRABLE");
  return parts.join(" ");
}

/** Copies the Postgres fields of a driver error into the body the Neon client expects. */
export function postgresErrorBody(error: unknown): PostgresErrorBody | null {
  if (typeof error !== "object" || error === null) return null;
  const source = error as Record<string, unknown>;
  // Only errors that Postgres itself raised are the caller's to see: a five-character SQLSTATE and
  // a severity (system errors such as EPIPE also have five capital letters, but no severity).
  if (typeof source.code !== "string" || !/^[0-9A-Z]{5}$/.test(source.code)) return null;
  if (typeof source.severity !== "string") return null;
  const body: PostgresErrorBody = { message: typeof source.message === "string" ? source.message : "" };
  for (const field of postgresErrorFields) {
    const value = source[field];
    if (typeof value === "string" || typeof value === "number") body[field] = String(value);
  }
  return body;
}
