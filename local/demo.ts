/**
 * `npm run demo -- --tenants 20 --connection-budget 25 --concurrency 100`: the golden path,
 * measured end to end against a stack of its own.
 *
 * It starts a throwaway Postgres (`.lessor/demo-pg`), the WebSocket proxy and `wrangler dev` with
 * a connection budget of `--connection-budget` for pools (plus a reserve of 2 for maintenance) and pools of 5, provisions `--tenants`
 * tenants through the API, writes a sentinel row into each tenant's own database, and then runs
 * `--operations` (default: `--concurrency`) operations with at most `--concurrency` in flight, all
 * fired cold, each through the official `neon()` client: read the own tenant's sentinel and
 * `current_setting('application_name')`. Refusals are retried the way a client should: 503 after
 * its Retry-After, 409 stale_generation at once (bounded both ways).
 *
 * While the operations run, a sampler polls `GET /v1/capacity` and `pg_stat_activity` every ~50 ms,
 * and one or two session leases are held open and used on tenants that also get operations: a leased
 * pool must never be evicted. Every number printed is measured; none is assumed. Any broken
 * invariant prints `result=FAIL` and exits 1.
 *
 * With `--erase N`, the last N tenants are erased at the end (`DELETE /v1/tenants/:id?confirm=:id`,
 * then `GET …/erase` until each has committed), and what is left of them is counted behind Lessor:
 * rows of any control-plane table that name them (the tombstones and the audit log aside), and
 * their databases and roles on the host: `erased=N leftover_rows=0 leftover_databases=0`.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createWriteStream, mkdirSync, rmSync } from "node:fs";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { neon, neonConfig } from "@neondatabase/serverless";
import pg from "pg";
import {
  freePort,
  freshWorkerSecrets,
  type LocalStack,
  localWorkerVars,
  root,
  startLocalStack,
  wranglerDevArgs,
  writeEnvFile,
} from "./stack.ts";
import { outputTail, waitForWorker } from "./worker-ready.ts";
import { quietWranglerEnv } from "./wrangler-env.ts";

const poolSize = 5;
const tier = "standard";
/** The host name the stack's LESSOR_HOSTS uses. */
const hostName = "local";

// ── Arguments ────────────────────────────────────────────────────────────────────────────────────

function usage(problem: string): never {
  console.error(`${problem}
usage: npm run demo -- [--tenants N] [--connection-budget C] [--concurrency K] [--operations OPS] [--erase N]
  --tenants            tenants to provision (default 20, at most 2000)
  --connection-budget  connections pools may hold on the host (default 25, at least ${poolSize})
  --concurrency        operations in flight at once (default 100, at most 5000)
  --operations         operations in all (default: the concurrency)
  --erase              tenants to erase at the end, and count what is left of them (default 0)`);
  process.exit(2);
}

function intOption(
  raw: string | undefined,
  name: string,
  fallback: number,
  min: number,
  max: number,
): number {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < min || value > max) {
    usage(`--${name} must be an integer from ${min} to ${max}`);
  }
  return value;
}

let parsed: ReturnType<typeof parseOptions>;
function parseOptions() {
  return parseArgs({
    options: {
      tenants: { type: "string" },
      "connection-budget": { type: "string" },
      concurrency: { type: "string" },
      operations: { type: "string" },
      erase: { type: "string" },
    },
    strict: true,
  }).values;
}
try {
  parsed = parseOptions();
} catch (error) {
  usage(error instanceof Error ? error.message : String(error));
}
const tenantCount = intOption(parsed.tenants, "tenants", 20, 1, 2_000);
/** The maintenance reserve kept beside the pools' budget (provisioning and migrations draw on it). */
const demoReserve = 2;
const budget = intOption(parsed["connection-budget"], "connection-budget", 25, poolSize, 10_000);
const concurrency = intOption(parsed.concurrency, "concurrency", 100, 1, 5_000);
const operationCount = intOption(parsed.operations, "operations", concurrency, 1, 100_000);
const eraseCount = intOption(parsed.erase, "erase", 0, 0, tenantCount);
/**
 * Pools held by a session lease through the run: one (two on a budget of 10 pools or more), and
 * never so many that the other tenants have no room left.
 */
const leasedCount = Math.min(budget >= 10 * poolSize ? 2 : 1, Math.floor(budget / poolSize) - 1, tenantCount);

// ── Small tools ──────────────────────────────────────────────────────────────────────────────────

function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

/** Runs `work` over `items` with at most `limit` in flight; results keep the input order. */
async function mapConcurrent<T, R>(
  items: readonly T[],
  limit: number,
  work: (item: T, index: number) => Promise<R>,
): Promise<R[]> {
  const results = new Array<R>(items.length);
  let next = 0;
  async function worker(): Promise<void> {
    while (next < items.length) {
      const index = next++;
      results[index] = await work(items[index] as T, index);
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}

const stateDir = resolve(root, ".lessor");
const pgDir = resolve(stateDir, "demo-pg");
const wranglerDir = resolve(stateDir, "demo-wrangler");
const envFile = resolve(stateDir, "demo.vars");
/** Everything `wrangler dev` printed during the last demo, for when a run needs explaining. */
const wranglerLog = resolve(stateDir, "demo-wrangler.log");
const secrets = freshWorkerSecrets();
const adminKey = secrets.adminKey;

let stack: LocalStack | undefined;
let wrangler: ChildProcess | undefined;
const wranglerOutput = outputTail();
let baseUrl = "";

async function stopEverything(): Promise<void> {
  const child = wrangler;
  wrangler = undefined;
  if (child && child.exitCode === null && child.signalCode === null) {
    const exited = new Promise<void>((done) => child.once("exit", () => done()));
    child.kill("SIGTERM");
    const killed = await Promise.race([exited.then(() => true), sleep(15_000).then(() => false)]);
    if (!killed) child.kill("SIGKILL");
  }
  const running = stack;
  stack = undefined;
  await running?.stop().catch(() => undefined);
  rmSync(wranglerDir, { recursive: true, force: true });
  rmSync(envFile, { force: true });
}

process.on("SIGINT", () => {
  void stopEverything().then(() => process.exit(130));
});

// ── Talking to Lessor ────────────────────────────────────────────────────────────────────────────

async function api(path: string, init: { method?: string; key?: string; json?: unknown } = {}) {
  const headers: Record<string, string> = { Authorization: `Bearer ${init.key ?? adminKey}` };
  if (init.json !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(`${baseUrl}${path}`, {
    method: init.method ?? "GET",
    headers,
    ...(init.json === undefined ? {} : { body: JSON.stringify(init.json) }),
    signal: AbortSignal.timeout(60_000),
  });
  const text = await response.text();
  let body: unknown = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = text;
  }
  return { status: response.status, body, retryAfter: response.headers.get("Retry-After") };
}

interface HostCapacity {
  host: string;
  budget: number;
  reserve: number;
  poolCapacity: number;
  allocated: number;
  reserved: number;
  draining: number;
  waiters: number;
  evictions: number;
  saturations: number;
  admissions: number;
}

async function capacity(): Promise<HostCapacity> {
  const { status, body } = await api("/v1/capacity");
  const host = (body as { hosts?: HostCapacity[] } | null)?.hosts?.find((h) => h.host === hostName);
  if (status !== 200 || !host) throw new Error(`GET /v1/capacity answered ${status}`);
  return host;
}

// The Neon driver's HTTP requests go to the local Worker; each operation learns its own answer's
// status and Retry-After through this store (the driver's error carries neither header).
interface HttpOutcome {
  status: number;
  retryAfter: string | null;
}
const httpOutcome = new AsyncLocalStorage<HttpOutcome>();
neonConfig.fetchEndpoint = () => `${baseUrl}/sql`;
neonConfig.fetchFunction = async (url: string, init: RequestInit) => {
  const response = await fetch(url, { ...init, signal: AbortSignal.timeout(60_000) });
  const store = httpOutcome.getStore();
  if (store) {
    store.status = response.status;
    store.retryAfter = response.headers.get("Retry-After");
  }
  return response;
};

// ── The stack ────────────────────────────────────────────────────────────────────────────────────

async function startStack(): Promise<void> {
  mkdirSync(stateDir, { recursive: true });
  rmSync(wranglerDir, { recursive: true, force: true });
  const [pgPort, port, inspectorPort] = [await freePort(), await freePort(), await freePort()];
  stack = await startLocalStack({
    dataDir: pgDir,
    pgPort,
    pgPassword: randomBytes(18).toString("base64url"),
    persistent: false,
    // Only trouble: a FATAL or PANIC, but not the connections a shutdown ends on purpose.
    log: (chunk) => {
      for (const line of chunk.split("\n")) {
        if (/FATAL|PANIC/.test(line) && !/administrator command/.test(line))
          console.error(`# [postgres] ${line}`);
      }
    },
  });
  // wrangler reads the demo's settings from an env file; single quotes keep the JSON literal.
  writeEnvFile(
    envFile,
    localWorkerVars(stack, secrets, {
      LESSOR_BUDGETS: JSON.stringify({ "*": { connections: budget + demoReserve, reserve: demoReserve } }),
      LESSOR_POOL_SIZES: JSON.stringify({ [tier]: poolSize }),
    }),
  );
  baseUrl = `http://127.0.0.1:${port}`;
  const child = spawn(
    process.execPath,
    wranglerDevArgs({ port, envFile, persistTo: wranglerDir, inspectorPort }),
    {
      cwd: root,
      stdio: ["ignore", "pipe", "pipe"],
      env: quietWranglerEnv({ ...process.env, CI: "1" }),
    },
  );
  wrangler = child;
  const log = createWriteStream(wranglerLog, { mode: 0o600 });
  child.once("exit", () => log.end());
  const keep = (chunk: Buffer) => {
    log.write(chunk);
    wranglerOutput.push(chunk);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  await waitForWorker({ url: `${baseUrl}/`, child, output: wranglerOutput.text, timeoutMs: 120_000 });
}

// ── Tenants ──────────────────────────────────────────────────────────────────────────────────────

interface DemoTenant {
  id: string;
  key: string;
  connectionString: string;
  sentinel: string;
  /** The tenant's opaque database (and role) name: what its connections are named after. */
  database: string;
}

async function provision(controlPlane: pg.Client): Promise<DemoTenant[]> {
  const ids = Array.from({ length: tenantCount }, (_, i) => `demo-${String(i).padStart(4, "0")}`);
  let provisioned = 0;
  const created = await mapConcurrent(ids, 8, async (id) => {
    let answer: { status: number; body: unknown; retryAfter: string | null } = {
      status: 0,
      body: null,
      retryAfter: null,
    };
    // Creates share the host's maintenance reserve: a 503 (maintenance_busy) is retried after its
    // Retry-After, as any client should; anything else a few times.
    for (let attempt = 0; attempt < 40 && answer.status !== 201; attempt++) {
      if (attempt > 0) await sleep(answer.status === 503 ? Number(answer.retryAfter ?? 1) * 1_000 : 500);
      answer = await api("/v1/tenants", { method: "POST", json: { id, tier } });
      if (answer.status !== 201 && answer.status !== 503 && attempt >= 4) break;
    }
    provisioned++;
    if (provisioned % Math.max(1, Math.ceil(tenantCount / 10)) === 0 || provisioned === tenantCount) {
      console.log(`# provisioning: ${provisioned}/${tenantCount} tenants`);
    }
    if (answer.status !== 201)
      throw new Error(`create ${id}: ${answer.status} ${JSON.stringify(answer.body)}`);
    const { key, connectionString } = answer.body as { key: string; connectionString: string };
    return { id, key, connectionString };
  });
  const { rows } = await controlPlane.query<{ id: string; database_name: string }>(
    "SELECT id, database_name FROM tenants WHERE id = ANY($1)",
    [ids],
  );
  const databases = new Map(rows.map((row) => [row.id, row.database_name]));
  // The sentinel goes straight into the tenant's own database, so the pools stay cold for the run.
  return mapConcurrent(created, 8, async (tenant) => {
    const database = databases.get(tenant.id);
    if (!database) throw new Error(`no database recorded for ${tenant.id}`);
    const sentinel = `sentinel:${tenant.id}:${randomBytes(6).toString("hex")}`;
    const tenantDb = new pg.Client({ connectionString: stackUrl(database), application_name: "demo-setup" });
    await tenantDb.connect();
    try {
      await tenantDb.query("INSERT INTO notes (body) VALUES ($1)", [sentinel]);
    } finally {
      await tenantDb.end();
    }
    return { ...tenant, sentinel, database };
  });
}

function stackUrl(database: string): string {
  if (!stack) throw new Error("stack not started");
  return stack.pg.url(database);
}

// ── Sampling ─────────────────────────────────────────────────────────────────────────────────────

interface Sampling {
  ledgerSamples: number;
  backendSamples: number;
  /** Ledger samples that could not be taken (GET /v1/capacity failed). */
  failures: number;
  maxLedger: number;
  maxBackends: number;
  violations: string[];
}

/**
 * Samples the ledger and pg_stat_activity, each in its own loop (~50 ms apart), so that a slow
 * answer from one never thins out the other.
 */
function startSampler(poolCapacity: number): { stop: () => Promise<Sampling> } {
  const result: Sampling = {
    ledgerSamples: 0,
    backendSamples: 0,
    failures: 0,
    maxLedger: 0,
    maxBackends: 0,
    violations: [],
  };
  let running = true;
  // Bounded: at most ~10 minutes of samples each.
  const ledgerLoop = (async () => {
    for (let i = 0; running && i < 12_000; i++) {
      try {
        const ledger = await capacity();
        const used = ledger.allocated + ledger.reserved + ledger.draining;
        result.ledgerSamples++;
        result.maxLedger = Math.max(result.maxLedger, used);
        if (used > poolCapacity) result.violations.push(`ledger ${used} > ${poolCapacity}`);
      } catch {
        result.failures++;
      }
      await sleep(50);
    }
  })();
  const backendLoop = (async () => {
    const client = new pg.Client({
      connectionString: stackUrl("postgres"),
      application_name: "demo-sampler",
    });
    await client.connect();
    try {
      for (let i = 0; running && i < 12_000; i++) {
        const { rows } = await client.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE 'lessor:%'",
        );
        const live = Number(rows[0]?.n ?? 0);
        result.backendSamples++;
        result.maxBackends = Math.max(result.maxBackends, live);
        // Pools plus maintenance (provisioning, migrations) never exceed the host's connections.
        const cap = budget + demoReserve;
        if (live > cap) result.violations.push(`pg_stat_activity: ${live} lessor:* backends > ${cap}`);
        await sleep(50);
      }
    } finally {
      await client.end().catch(() => undefined);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await Promise.all([ledgerLoop, backendLoop]);
      return result;
    },
  };
}

// ── Leases held through the run ──────────────────────────────────────────────────────────────────

interface HeldLease {
  tenant: DemoTenant;
  token: string;
  generation: number;
  uses: number;
  /** Why the lease stopped working, if it did: its pool was evicted (or restarted) under it. */
  broken: string | null;
}

async function useLease(lease: HeldLease): Promise<void> {
  const response = await api(`/v1/leases/${lease.token}/sql`, {
    method: "POST",
    key: lease.tenant.key,
    json: { query: "SELECT current_setting('application_name')", params: [] },
  });
  if (response.status !== 200) {
    lease.broken ??= `${response.status} ${JSON.stringify(response.body)}`;
    return;
  }
  const app = (response.body as { rows?: (string | null)[][] }).rows?.[0]?.[0];
  const expected = `lessor:${lease.tenant.database}:${lease.generation}`;
  if (app !== expected) lease.broken ??= `ran on ${app}, not ${expected}`;
  lease.uses++;
}

function keepLeasesBusy(leases: HeldLease[]): { stop: () => Promise<void> } {
  let running = true;
  const done = (async () => {
    for (let i = 0; running && i < 6_000; i++) {
      await Promise.all(leases.filter((l) => l.broken === null).map(useLease));
      await sleep(100);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await done;
    },
  };
}

// ── Operations ───────────────────────────────────────────────────────────────────────────────────

interface Attempt {
  sentAt: number;
  doneAt: number;
  generation: number | null;
}

interface Operation {
  tenant: DemoTenant;
  ok: boolean;
  bleed: string | null;
  error: string | null;
  attempts: Attempt[];
  staleRetries: number;
  saturatedRetries: number;
}

const maxAttempts = 60;
const operationDeadlineMs = 240_000;

async function runOperation(tenant: DemoTenant): Promise<Operation> {
  const op: Operation = {
    tenant,
    ok: false,
    bleed: null,
    error: null,
    attempts: [],
    staleRetries: 0,
    saturatedRetries: 0,
  };
  const sql = neon(tenant.connectionString);
  const deadline = Date.now() + operationDeadlineMs;
  for (let attempt = 0; attempt < maxAttempts && Date.now() < deadline; attempt++) {
    const outcome: HttpOutcome = { status: 0, retryAfter: null };
    const sentAt = Date.now();
    try {
      const rows = await httpOutcome.run(
        outcome,
        () => sql`SELECT body, current_setting('application_name') AS app, current_database() AS db
          FROM notes WHERE body LIKE 'sentinel:%'`,
      );
      const app = String(rows[0]?.app ?? "");
      const generation = Number(app.split(":").at(-1));
      op.attempts.push({
        sentAt,
        doneAt: Date.now(),
        generation: Number.isInteger(generation) ? generation : null,
      });
      const bodies = rows.map((row) => row.body);
      // Database and role names are opaque (`t_<16 hex>`, the same name for both): the pool's
      // connections are `lessor:<role>:<generation>`.
      if (
        bodies.length !== 1 ||
        bodies[0] !== tenant.sentinel ||
        rows[0]?.db !== tenant.database ||
        !app.startsWith(`lessor:${tenant.database}:`)
      ) {
        op.bleed = `${tenant.id} read ${JSON.stringify(bodies)} on ${app} (${String(rows[0]?.db)})`;
        return op;
      }
      op.ok = true;
      return op;
    } catch (error) {
      op.attempts.push({ sentAt, doneAt: Date.now(), generation: null });
      const message = error instanceof Error ? error.message : String(error);
      const status = outcome.status || Number(/HTTP status (\d+)/.exec(message)?.[1] ?? 0);
      const code = /"code":"([a-z_]+)"/.exec(message)?.[1] ?? null;
      if (status === 409 && code === "stale_generation") {
        op.staleRetries++;
        await sleep(25 + Math.random() * 25);
        continue;
      }
      if (status === 503) {
        op.saturatedRetries++;
        // Honour Retry-After (whole seconds), plus up to a second of jitter so that refused
        // operations do not all come back in the same instant.
        const seconds = Math.min(10, Math.max(1, Number(outcome.retryAfter) || 1));
        await sleep(seconds * 1_000 + Math.random() * 1_000);
        continue;
      }
      op.error = `${status} ${code ?? message.slice(0, 200)}`;
      return op;
    }
  }
  op.error = `gave up after ${op.attempts.length} attempts`;
  return op;
}

// ── After the run: what the control plane recorded ───────────────────────────────────────────────

interface LifecycleRow {
  tenant_id: string;
  seq: number;
  generation: number;
  from_state: string;
  to_state: string;
  reason: string;
  at: Date;
}

/**
 * Starts of a generation while another generation of the same tenant was still live (starting,
 * ready or draining), walking each tenant's lifecycle events in order.
 */
function countDuplicateStarts(events: readonly LifecycleRow[]): number {
  const live = new Map<string, Set<number>>();
  let duplicates = 0;
  for (const event of events) {
    const set = live.get(event.tenant_id) ?? new Set<number>();
    live.set(event.tenant_id, set);
    if (event.to_state === "starting") {
      if ([...set].some((g) => g !== event.generation)) duplicates++;
      set.add(event.generation);
    } else if (event.to_state === "stopped" || event.to_state === "failed") {
      set.delete(event.generation);
    }
  }
  return duplicates;
}

/**
 * Requests that joined an in-flight start instead of starting one, measured from the outside: for
 * each generation started during the run, the successful attempts it served that were already
 * sent before its first answer came back all waited on that start; one of them triggered it, the
 * rest joined it. (An attempt sent in the millisecond between the pool becoming ready and that
 * first answer would be counted too; the lifecycle events only say when the start began.)
 */
function countSharedStartWaiters(
  operations: readonly Operation[],
  startedDuringRun: ReadonlySet<string>,
): number {
  const byGeneration = new Map<string, Attempt[]>();
  for (const op of operations) {
    for (const attempt of op.attempts) {
      if (attempt.generation === null) continue;
      const key = `${op.tenant.id}:${attempt.generation}`;
      if (!startedDuringRun.has(key)) continue;
      const list = byGeneration.get(key) ?? [];
      list.push(attempt);
      byGeneration.set(key, list);
    }
  }
  let joined = 0;
  for (const attempts of byGeneration.values()) {
    const firstAnswer = Math.min(...attempts.map((a) => a.doneAt));
    const waited = attempts.filter((a) => a.sentAt < firstAnswer).length;
    joined += Math.max(0, waited - 1);
  }
  return joined;
}

// ── Erase ────────────────────────────────────────────────────────────────────────────────────────

interface EraseOutcome {
  erased: number;
  leftoverRows: number;
  leftoverDatabases: number;
  problems: string[];
}

/**
 * Erases `tenants` through the API (a few at a time), waits (bounded) for each erase to commit, and
 * counts what is left of them behind Lessor: rows of every control-plane table (found through
 * information_schema) whose text names a tenant id or its opaque database name, the tombstones
 * and the audit log aside; their databases and roles on the host.
 */
async function eraseTenants(controlPlane: pg.Client, tenants: readonly DemoTenant[]): Promise<EraseOutcome> {
  const problems: string[] = [];
  const ids = tenants.map((tenant) => tenant.id);
  const { rows: placed } = await controlPlane.query<{ id: string; database_name: string; role_name: string }>(
    "SELECT id, database_name, role_name FROM tenants WHERE id = ANY($1)",
    [ids],
  );
  const outcomes = await mapConcurrent(tenants, 4, async (tenant) => {
    const asked = await api(`/v1/tenants/${tenant.id}?confirm=${tenant.id}`, { method: "DELETE" });
    if (asked.status !== 202) {
      problems.push(`DELETE ${tenant.id}: ${asked.status} ${JSON.stringify(asked.body)}`);
      return false;
    }
    // Bounded: about three minutes per tenant (the cron trigger and the alarm resume a stuck one).
    for (let attempt = 0; attempt < 720; attempt++) {
      const view = await api(`/v1/tenants/${tenant.id}/erase`);
      const state = (view.body as { state?: string } | null)?.state;
      if (view.status === 200 && state === "erased") return true;
      await sleep(250);
    }
    const last = await api(`/v1/tenants/${tenant.id}/erase`);
    problems.push(`${tenant.id} not erased: ${JSON.stringify(last.body)}`);
    return false;
  });
  const needles = [...ids, ...placed.map((row) => row.database_name)];
  const { rows: tables } = await controlPlane.query<{ table_name: string }>(
    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE' AND table_name NOT IN ('tenant_erasures', 'audit_log')",
  );
  let leftoverRows = 0;
  for (const { table_name: table } of tables) {
    const { rows } = await controlPlane.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM "${table}" t WHERE EXISTS (SELECT 1 FROM unnest($1::text[]) AS needle WHERE strpos(t::text, needle) > 0)`,
      [needles],
    );
    const n = Number(rows[0]?.n ?? 0);
    if (n > 0) problems.push(`${n} row(s) of ${table} still name an erased tenant`);
    leftoverRows += n;
  }
  const host = new pg.Client({ connectionString: stackUrl("postgres"), application_name: "demo-setup" });
  await host.connect();
  let leftoverDatabases = 0;
  try {
    const { rows } = await host.query<{ n: number }>(
      `SELECT (SELECT count(*) FROM pg_database WHERE datname = ANY($1))::int
            + (SELECT count(*) FROM pg_roles WHERE rolname = ANY($2))::int AS n`,
      [placed.map((row) => row.database_name), placed.map((row) => row.role_name)],
    );
    leftoverDatabases = Number(rows[0]?.n ?? 0);
  } finally {
    await host.end().catch(() => undefined);
  }
  return { erased: outcomes.filter(Boolean).length, leftoverRows, leftoverDatabases, problems };
}

// ── Main ─────────────────────────────────────────────────────────────────────────────────────────

/** Runs the demo; returns the summary lines, printed once the stack is down (nothing follows them). */
async function main(): Promise<{ summary: string[]; pass: boolean }> {
  console.log(
    `# demo: ${tenantCount} tenants, pools of ${poolSize}, connection budget ${budget} (+ reserve ${demoReserve}), ` +
      `${operationCount} operations at concurrency ${concurrency}, ${leasedCount} session lease(s) held`,
  );
  await startStack();
  if (!stack) throw new Error("stack not started");
  const controlPlane = new pg.Client({
    connectionString: stack.controlPlaneUrl,
    application_name: "demo-setup",
  });
  await controlPlane.connect();
  try {
    const before = await capacity();
    if (before.poolCapacity !== budget || before.reserve !== demoReserve) {
      throw new Error(
        `the Worker runs with pool capacity ${before.poolCapacity}/reserve ${before.reserve}, not ${budget}/${demoReserve}`,
      );
    }
    const setupStarted = Date.now();
    const tenants = await provision(controlPlane);
    console.log(
      `# provisioned ${tenants.length} tenants with a sentinel row each in ${Date.now() - setupStarted} ms`,
    );

    // Session leases on the first tenants: their pools start now and must survive the whole run.
    const leases: HeldLease[] = [];
    for (const tenant of tenants.slice(0, leasedCount)) {
      const opened = await api(`/v1/tenants/${tenant.id}/leases`, {
        method: "POST",
        key: tenant.key,
        json: { ttlMs: 120_000 },
      });
      if (opened.status !== 201) throw new Error(`lease on ${tenant.id}: ${opened.status}`);
      const { lease, generation } = opened.body as { lease: string; generation: number };
      leases.push({ tenant, token: lease, generation, uses: 0, broken: null });
    }

    const ledgerBefore = await controlPlane.query<{ tenant_id: string; generation: number }>(
      "SELECT tenant_id, generation FROM generation_ledger",
    );
    const known = new Set(ledgerBefore.rows.map((r) => `${r.tenant_id}:${r.generation}`));
    const evictionsBefore = (await capacity()).evictions;

    const sampler = startSampler(before.poolCapacity);
    const leaseKeeper = keepLeasesBusy(leases);
    const runStarted = Date.now();
    const plan = Array.from({ length: operationCount }, (_, i) => tenants[i % tenants.length] as DemoTenant);
    let done = 0;
    // Progress every 5 s: operations done of the total, pool starts ("repos") and evictions so far.
    const progress = setInterval(() => {
      void capacity()
        .then((status) => {
          console.log(
            `# progress: ${done}/${operationCount} operations, ${status.admissions} pool starts granted, ` +
              `${status.evictions - evictionsBefore} evictions, ${status.waiters} starts waiting`,
          );
        })
        .catch(() => undefined);
    }, 5_000);
    const operations = await mapConcurrent(plan, concurrency, async (tenant) => {
      const op = await runOperation(tenant);
      done++;
      return op;
    }).finally(() => clearInterval(progress));
    const runMs = Date.now() - runStarted;
    await leaseKeeper.stop();
    // One last use of every lease after the storm, then give them back.
    await Promise.all(leases.filter((l) => l.broken === null).map(useLease));
    const sampling = await sampler.stop();
    const evictions = (await capacity()).evictions - evictionsBefore;
    for (const lease of leases) {
      await api(`/v1/leases/${lease.token}`, { method: "DELETE", key: lease.tenant.key });
    }

    const ledgerAfter = await controlPlane.query<{ tenant_id: string; generation: number }>(
      "SELECT tenant_id, generation FROM generation_ledger",
    );
    const startedDuringRun = new Set(
      ledgerAfter.rows.map((r) => `${r.tenant_id}:${r.generation}`).filter((key) => !known.has(key)),
    );
    const events = await controlPlane.query<LifecycleRow>(
      "SELECT tenant_id, seq, generation, from_state, to_state, reason, at FROM lifecycle_events ORDER BY tenant_id, seq",
    );
    // A leased pool that was evicted shows up as a broken lease, or as an eviction event of the
    // leased generation in the lifecycle log.
    const leasedEvictions = leases.filter(
      (lease) =>
        lease.broken !== null ||
        events.rows.some(
          (e) =>
            e.tenant_id === lease.tenant.id && e.generation === lease.generation && e.reason === "evicted",
        ),
    );

    const succeeded = operations.filter((op) => op.ok).length;
    const bleed = operations.filter((op) => op.bleed !== null);
    const failed = operations.filter((op) => !op.ok && op.bleed === null);
    const duplicateStarts = countDuplicateStarts(events.rows);
    const sharedStartWaiters = countSharedStartWaiters(operations, startedDuringRun);
    const staleRetries = operations.reduce((n, op) => n + op.staleRetries, 0);
    const saturatedRetries = operations.reduce((n, op) => n + op.saturatedRetries, 0);
    const maxAllocated = Math.max(sampling.maxLedger, sampling.maxBackends);
    // No samples would be a run that measured nothing: that counts as a violation too.
    const violations =
      sampling.violations.length + (sampling.ledgerSamples === 0 || sampling.backendSamples === 0 ? 1 : 0);

    console.log(
      `# run took ${runMs} ms; ${saturatedRetries} retries after 503 (Retry-After honoured); ` +
        `ledger sampled ${sampling.ledgerSamples} times (${sampling.failures} failed), max ${sampling.maxLedger}; ` +
        `pg_stat_activity sampled ${sampling.backendSamples} times, max ${sampling.maxBackends} lessor:* backends`,
    );
    for (const lease of leases) {
      console.log(
        `# lease on ${lease.tenant.id} (generation ${lease.generation}): used ${lease.uses} times, ${lease.broken ?? "never broken"}`,
      );
    }
    for (const op of [...bleed, ...failed].slice(0, 10)) {
      console.log(`# ${op.bleed ? "BLEED" : "FAILED"} ${op.tenant.id}: ${op.bleed ?? op.error}`);
    }
    for (const violation of sampling.violations.slice(0, 10)) console.log(`# VIOLATION ${violation}`);

    let erasure: EraseOutcome | null = null;
    if (eraseCount > 0) {
      const started = Date.now();
      erasure = await eraseTenants(controlPlane, tenants.slice(tenants.length - eraseCount));
      console.log(`# erased ${erasure.erased} of ${eraseCount} tenants in ${Date.now() - started} ms`);
      for (const problem of erasure.problems.slice(0, 10)) console.log(`# ERASE ${problem}`);
    }

    const pass =
      (erasure === null ||
        (erasure.erased === eraseCount && erasure.leftoverRows === 0 && erasure.leftoverDatabases === 0)) &&
      succeeded === operationCount &&
      bleed.length === 0 &&
      duplicateStarts === 0 &&
      violations === 0 &&
      leasedEvictions.length === 0;
    if (!pass) console.log(`# the Worker's log of this run: ${wranglerLog}`);
    const summary = [
      `operations=${operationCount} succeeded=${succeeded} tenant_bleed=${bleed.length}`,
      `repo_starts=${startedDuringRun.size} shared_start_waiters=${sharedStartWaiters} duplicate_starts=${duplicateStarts}`,
      `max_connections_allocated=${maxAllocated} budget=${budget} violations=${violations}`,
      `evictions=${evictions} active_repo_evictions=${leasedEvictions.length}`,
      `stale_generation_retries=${staleRetries}`,
      ...(erasure === null
        ? []
        : [
            `erased=${erasure.erased} leftover_rows=${erasure.leftoverRows} leftover_databases=${erasure.leftoverDatabases}`,
          ]),
      `result=${pass ? "PASS" : "FAIL"}`,
    ];
    return { summary, pass };
  } finally {
    await controlPlane.end().catch(() => undefined);
  }
}

let outcome: { summary: string[]; pass: boolean } = { summary: ["result=FAIL"], pass: false };
try {
  outcome = await main();
} catch (error) {
  console.error(`# demo could not run: ${error instanceof Error ? error.message : String(error)}`);
} finally {
  await stopEverything();
}
for (const line of outcome.summary) console.log(line);
process.exit(outcome.pass ? 0 : 1);
