/**
 * The bench Worker: Lessor itself, unchanged, plus the baselines that price what Lessor adds. Every
 * path that is not under `/bench/` falls through to Lessor's own fetch handler.
 *
 * The database baselines speak the same single-statement HTTP protocol as Lessor's `/sql` (the one
 * the official `neon()` client sends), so the client side of every database path is the same code:
 *
 * - `/bench/noop`: answers without touching a database (a canned `SELECT 1` answer to a POST, a
 *   word to a GET). The local server's floor.
 * - `/bench/newconn`: a new Neon `Client` per request, as a Worker without a broker does it.
 * - `/bench/bare`: a bare Durable Object that holds a Neon `Pool` and nothing else: no leases, no
 *   lifecycle, no authentication, no bookkeeping. What Lessor's own work costs is the difference.
 */

import { DurableObject } from "cloudflare:workers";
import { Client, neonConfig, Pool } from "@neondatabase/serverless";
import lessor from "./lessor-entry.js";

// Every Durable Object class Lessor exports (TenantObject, BudgetObject, …), bound in bench/wrangler.toml.
export * from "./lessor-entry.js";

/** One statement of the Neon HTTP protocol. */
interface Statement {
  query: string;
  params: (string | null)[];
}

interface QueryAnswer {
  command: string;
  rowCount: number | null;
  rows: (string | null)[][];
  fields: unknown[];
  rowAsArray: true;
}

type Outcome = { ok: true; body: QueryAnswer } | { ok: false; status: number; error: ErrorAnswer };

interface ErrorAnswer {
  message: string;
  code?: string;
}

/** The RPC surface of BareObject, as its stub exposes it. */
interface BareStub {
  run(statement: Statement): Promise<Outcome>;
}

interface BenchEnv {
  BARE: { getByName(name: string): BareStub };
  /** A login role on the bench tenant's database, for the baselines (written by bench/run.ts). */
  BENCH_DATABASE_URL: string;
  LESSOR_WS_PROXY: string;
}

interface WaitUntil {
  waitUntil(promise: Promise<unknown>): void;
}

let configuredProxy: string | undefined;

/** Same WebSocket settings as src/postgres/driver.ts `configureDriver` (the bundle shares neonConfig). */
function configureDriver(env: BenchEnv): void {
  if (configuredProxy === env.LESSOR_WS_PROXY) return;
  configuredProxy = env.LESSOR_WS_PROXY;
  if (env.LESSOR_WS_PROXY) {
    const proxy = env.LESSOR_WS_PROXY;
    neonConfig.wsProxy = (host, port) => `${proxy}/v2?address=${host}:${port}`;
    neonConfig.useSecureWebSocket = false;
    neonConfig.pipelineTLS = false;
    neonConfig.pipelineConnect = false;
  }
}

/** Every value stays Postgres text, as Lessor answers it: the Neon client parses types itself. */
const rawTextTypes = { getTypeParser: () => (value: string) => value };

interface Queryable {
  query(config: { text: string; values: unknown[]; rowMode: "array"; types: unknown }): Promise<unknown>;
}

interface RawField {
  name: string;
  tableID: number;
  columnID: number;
  dataTypeID: number;
  dataTypeSize: number;
  dataTypeModifier: number;
  format: string;
}

interface RawResult {
  command: string;
  rowCount: number | null;
  rows: (string | null)[][];
  fields: RawField[];
}

/**
 * One statement by the extended protocol (Parse, Bind, Describe, Execute, Sync), whatever its
 * parameters, as Lessor's `/sql` sends every statement (it admits exactly one). The driver's own
 * `query()` sends a statement without parameters by the simple protocol instead (one message, and it
 * would run `SELECT 1; SELECT 2` too): a baseline that did so would price the protocol, not
 * Lessor's work. Rows stay Postgres text, as `rawTextTypes` keeps them.
 */
class ExtendedStatement {
  readonly result: Promise<RawResult>;
  private resolve: (result: RawResult) => void = () => undefined;
  private reject: (error: unknown) => void = () => undefined;
  private fields: RawField[] = [];
  private readonly rows: (string | null)[][] = [];
  private command = "";
  private rowCount: number | null = null;
  private failed = false;
  private readonly statement: Statement;

  constructor(statement: Statement) {
    this.statement = statement;
    this.result = new Promise((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
  }

  submit(connection: ExtendedConnection): null {
    connection.parse({ text: this.statement.query, name: "", types: [] });
    connection.bind({ portal: "", statement: "", values: this.statement.params });
    connection.describe({ type: "P", name: "" });
    connection.execute({ portal: "", rows: 0 });
    connection.sync();
    return null;
  }

  handleRowDescription(message: { fields: RawField[] }): void {
    this.fields = message.fields;
  }

  handleDataRow(message: { fields: (string | null)[] }): void {
    this.rows.push(message.fields);
  }

  handleCommandComplete(message: { text?: string }): void {
    const match = /^([A-Za-z]+)(?: (\d+))?(?: (\d+))?/.exec(message.text ?? "");
    this.command = match?.[1] ?? "";
    this.rowCount = match?.[3] ? Number(match[3]) : match?.[2] ? Number(match[2]) : null;
  }

  handleEmptyQuery(): void {}

  handlePortalSuspended(): void {}

  handleError(error: unknown): void {
    this.failed = true;
    this.reject(error);
  }

  handleReadyForQuery(): void {
    if (this.failed) return;
    this.resolve({ command: this.command, rowCount: this.rowCount, rows: this.rows, fields: this.fields });
  }
}

interface ExtendedConnection {
  parse(config: { text: string; name: string; types: number[] }): void;
  bind(config: { portal: string; statement: string; values: (string | null)[] }): void;
  describe(config: { type: "P"; name: string }): void;
  execute(config: { portal: string; rows: number }): void;
  sync(): void;
}

/** The bare object's statement: the extended protocol on one pooled connection, then back. */
async function runExtended(pool: Pool, statement: Statement): Promise<QueryAnswer> {
  const client = await pool.connect();
  let broken: Error | undefined;
  try {
    const submitted = new ExtendedStatement(statement);
    (client as unknown as { query(submittable: ExtendedStatement): void }).query(submitted);
    return shapeAnswer(await submitted.result);
  } catch (error) {
    // A Postgres error leaves the connection usable; anything else does not.
    if (typeof (error as { severity?: unknown }).severity !== "string") broken = error as Error;
    throw error;
  } finally {
    client.release(broken);
  }
}

async function runStatement(client: Queryable, statement: Statement): Promise<QueryAnswer> {
  const result = (await client.query({
    text: statement.query,
    values: statement.params,
    rowMode: "array",
    types: rawTextTypes,
  })) as RawResult;
  return shapeAnswer(result);
}

function shapeAnswer(result: RawResult): QueryAnswer {
  return {
    command: result.command,
    rowCount: result.rowCount,
    rows: result.rows,
    // Plain objects, as Lessor shapes them: the driver's Field instances cannot cross RPC.
    fields: result.fields.map((field) => ({
      name: field.name,
      tableID: field.tableID,
      columnID: field.columnID,
      dataTypeID: field.dataTypeID,
      dataTypeSize: field.dataTypeSize,
      dataTypeModifier: field.dataTypeModifier,
      format: field.format,
    })),
    rowAsArray: true,
  };
}

function failure(error: unknown): Outcome {
  const code = (error as { code?: unknown }).code;
  const message = error instanceof Error ? error.message : "query failed";
  // A Postgres error (five-character SQLSTATE) is the caller's, as on /sql; anything else is ours.
  if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) {
    return { ok: false, status: 400, error: { message, code } };
  }
  return { ok: false, status: 500, error: { message } };
}

async function readStatement(request: Request): Promise<Statement | null> {
  const body = (await request.json()) as { query?: unknown; params?: unknown };
  if (typeof body.query !== "string") return null;
  const params = Array.isArray(body.params) ? body.params : [];
  return {
    query: body.query,
    params: params.map((value: unknown) => (value === null ? null : String(value))),
  };
}

function answer(outcome: Outcome): Response {
  return outcome.ok ? Response.json(outcome.body) : Response.json(outcome.error, { status: outcome.status });
}

/** The answer Postgres gives to `SELECT 1 AS n`, as raw text in array mode. */
const cannedSelectOne = JSON.stringify({
  command: "SELECT",
  rowCount: 1,
  rows: [["1"]],
  fields: [
    {
      name: "n",
      tableID: 0,
      columnID: 0,
      dataTypeID: 23,
      dataTypeSize: 4,
      dataTypeModifier: -1,
      format: "text",
    },
  ],
  rowAsArray: true,
});

async function noop(request: Request): Promise<Response> {
  if (request.method !== "POST") return new Response("bench-noop");
  await request.text();
  return new Response(cannedSelectOne, { headers: { "content-type": "application/json" } });
}

async function newConnection(request: Request, env: BenchEnv, ctx: WaitUntil): Promise<Response> {
  const statement = await readStatement(request);
  if (!statement) return Response.json({ message: "query must be a string" }, { status: 400 });
  configureDriver(env);
  const client = new Client({
    connectionString: env.BENCH_DATABASE_URL,
    application_name: "bench:newconn",
    connectionTimeoutMillis: 10_000,
  });
  client.on("error", () => undefined);
  try {
    await client.connect();
    return answer({ ok: true, body: await runStatement(client, statement) });
  } catch (error) {
    return answer(failure(error));
  } finally {
    // The pattern Neon documents for a Worker: close after the response, inside waitUntil.
    ctx.waitUntil(client.end().catch(() => undefined));
  }
}

async function bare(request: Request, env: BenchEnv): Promise<Response> {
  const statement = await readStatement(request);
  if (!statement) return Response.json({ message: "query must be a string" }, { status: 400 });
  return answer(await env.BARE.getByName("bench").run(statement));
}

export default {
  async fetch(request: Request, env: BenchEnv, ctx: WaitUntil): Promise<Response> {
    const { pathname } = new URL(request.url);
    switch (pathname) {
      case "/bench/noop":
        return noop(request);
      case "/bench/newconn":
        return newConnection(request, env, ctx);
      case "/bench/bare":
        return bare(request, env);
      default:
        return lessor.fetch(request, env, ctx);
    }
  },
};

/**
 * A Durable Object that holds a Neon pool the way Lessor's TenantObject does (same size as the
 * `standard` tier, connections kept until the object goes), and nothing else.
 */
export class BareObject extends DurableObject<BenchEnv> {
  private pool: Pool | null = null;

  async run(statement: Statement): Promise<Outcome> {
    try {
      return { ok: true, body: await runExtended(this.openPool(), statement) };
    } catch (error) {
      return failure(error);
    }
  }

  private openPool(): Pool {
    if (this.pool) return this.pool;
    configureDriver(this.env);
    const pool = new Pool({
      connectionString: this.env.BENCH_DATABASE_URL,
      max: 5,
      idleTimeoutMillis: 0,
      connectionTimeoutMillis: 10_000,
      application_name: "bench:bare",
    });
    // An idle pooled connection that dies is replaced on the next checkout; never throw it.
    pool.on("error", () => undefined);
    this.pool = pool;
    return pool;
  }
}
