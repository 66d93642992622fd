/**
 * Runs a `/sql` request on one pooled connection and shapes the answer the way the Neon driver
 * expects it: raw text values in array mode, with the field list.
 */
import type { PoolClient } from "@neondatabase/serverless";
import {
  beginStatement,
  type FieldDescription,
  type QueryResultBody,
  type SqlRequest,
  type SqlResponseBody,
  type Statement,
} from "../core/neon-protocol.ts";

/** Every value stays Postgres text: the Neon client parses types itself. */
const rawTextTypes = { getTypeParser: () => (value: string) => value };

interface PgField {
  name: string;
  tableID: number;
  columnID: number;
  dataTypeID: number;
  dataTypeSize: number;
  dataTypeModifier: number;
  format: string;
}

interface PgResult {
  command: string;
  rowCount: number | null;
  rows: (string | null)[][];
  fields: PgField[];
}

function shape(result: PgResult): QueryResultBody {
  return {
    command: result.command,
    rowCount: result.rowCount,
    rows: result.rows,
    fields: result.fields.map(
      (field): FieldDescription => ({
        name: field.name,
        tableID: field.tableID,
        columnID: field.columnID,
        dataTypeID: field.dataTypeID,
        dataTypeSize: field.dataTypeSize,
        dataTypeModifier: field.dataTypeModifier,
        format: field.format,
      }),
    ),
    rowAsArray: true,
  };
}

/** Runs one statement and shapes its result. */
export async function runStatement(client: PoolClient, statement: Statement): Promise<QueryResultBody> {
  const raw = (await client.query({
    text: statement.query,
    values: statement.params,
    rowMode: "array",
    types: rawTextTypes,
  })) as unknown as PgResult | PgResult[];
  // A parameterless string with several statements runs over the simple protocol and yields one
  // result per statement; like psql, the answer is the last one.
  const result = Array.isArray(raw) ? raw[raw.length - 1] : raw;
  if (!result) return { command: "", rowCount: null, rows: [], fields: [], rowAsArray: true };
  return shape(result);
}

/**
 * Executes the request. A Postgres error propagates with its fields; a failed transaction is rolled
 * back before the error propagates.
 */
export async function executeSqlRequest(client: PoolClient, request: SqlRequest): Promise<SqlResponseBody> {
  if (request.kind === "single") return runStatement(client, request.statement);
  await client.query(beginStatement(request.options));
  const results: QueryResultBody[] = [];
  try {
    for (const statement of request.statements) results.push(await runStatement(client, statement));
    await client.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw error;
  }
  return { results };
}

/**
 * Commands that, at the start of a statement, can leave session state behind on a pooled
 * connection (`DO` and `EXECUTE` because their bodies can run any of them).
 */
const sessionCommand = /^\s*(set|reset|prepare|listen|unlisten|declare|load|discard|do|execute|call)\b/i;
/** Anywhere in a statement: temp tables, advisory locks and `set_config` also leave state behind. */
const sessionFunction = /\btemp(orary)?\b|advisory_(xact_)?lock|set_config/i;

/**
 * Whether the request may leave session state on its connection. A match costs one `DISCARD ALL`
 * before the connection is reused; a miss would let state pass from one request to the next (of the
 * same tenant), so this errs on the side of matching. Every `;`-separated segment is checked, since
 * a parameterless string may hold several statements.
 */
export function mayLeaveSessionState(request: SqlRequest): boolean {
  const statements = request.kind === "single" ? [request.statement] : request.statements;
  return statements.some(
    ({ query }) =>
      sessionFunction.test(query) || query.split(";").some((segment) => sessionCommand.test(segment)),
  );
}
