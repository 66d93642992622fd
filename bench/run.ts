/**
 * `npm run bench`: Lessor side by side with the alternatives, in one run, on the real local stack.
 *
 * It starts a throwaway Postgres (bench/stack.ts), `wrangler dev` with the bench Worker
 * (bench/worker.ts: Lessor plus the baseline routes), provisions tenants through Lessor's own API,
 * and measures, at concurrency 1, 8 and 64, `SELECT 1` and a small indexed read through:
 *
 * - Lessor's warm path: `/sql` with the official `neon()` client, its tenant on the local host over
 *   the direct TCP path (`connect()` + STARTTLS, docs/adr/027); `lessor-ws`: the same, its tenant
 *   on a host that the same Postgres serves through the WebSocket (the local proxy, Neon's path);
 * - `/bench/newconn`: a new Neon client per request (the usual pattern without a broker);
 * - `/bench/bare`: a bare Durable Object holding a pool (prices Lessor's own work);
 * - `/bench/noop`: no database at all (the local server's floor);
 * - a `pg` pool straight from Node (the database's floor);
 *
 * then a cold-start storm, and where the dev server's time goes. Results go to
 * bench/results/<date>.json and to stdout as markdown. Any error or wrong answer fails the run.
 * See bench/README.md for the method.
 */
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { cpus, loadavg, release, totalmem } from "node:os";
import { resolve } from "node:path";
import { neon, neonConfig } from "@neondatabase/serverless";
import pg from "pg";
import {
  burstFetch,
  closeConnections,
  type LoadResult,
  lightFetch,
  percentile,
  requestTimeoutMs,
  runLoad,
} from "./load.ts";
import { outboxFlushRowsPerCycle, priceModel, priceTable } from "./price.ts";
import {
  buildWorker,
  type CpuGroups,
  type CpuSample,
  cpuDelta,
  descendants,
  findWranglerLayout,
  freePort,
  type RunningStack,
  type RunningWrangler,
  root,
  sampleCpu,
  startStack,
  startWrangler,
  within,
} from "./processes.ts";
import { type ProfileSummary, profileWhile, SourceMap, summarise as summariseProfile } from "./profile.ts";
import {
  type AdmissionResult,
  admissionTable,
  contendedCores,
  find,
  judgeTargets,
  type Measurement,
  measurementsTable,
  type PathName,
  profileSourcesTable,
  profileTable,
  type QueryName,
  ratios,
  ratiosTable,
  type Spec,
  type StormResult,
  stormTable,
  type Target,
  targetsTable,
  topFunctionsTable,
  verdictLine,
} from "./report.ts";

// ── Settings ─────────────────────────────────────────────────────────────────────────────────────

/** Bounded overrides for a quicker (or longer) run; the defaults are what the results record. */
function setting(name: string, fallback: number, min: number, max: number): number {
  const raw = process.env[name];
  const value = raw === undefined || raw === "" ? fallback : Number(raw);
  if (!Number.isFinite(value) || value < min || value > max) {
    throw new Error(`${name} must be a number from ${min} to ${max}`);
  }
  return value;
}

const concurrencies = [1, 8, 64] as const;
const queries: readonly QueryName[] = ["select1", "indexed"];
const warmupMs = setting("BENCH_WARMUP_MS", 500, 0, 10_000);
const durationMs = setting("BENCH_DURATION_MS", 8_000, 200, 30_000);
const maxRequests = 50_000;
/**
 * Each group of paths is measured in this many interleaved rounds. Lessor's ratio to a baseline is
 * judged on the median of the rounds' paired ratios (round i of Lessor against round i of the
 * baseline, measured seconds apart), with their spread beside it: one second of either path moves
 * by up to a quarter from the next on this machine, whatever the code. The cells the goals judge
 * (the warm paths, direct) take `rounds` rounds of `durationMs`; the others (the dev server's proxy
 * and floors, reported only) half of each. With four rounds of one second, the same code's median
 * moved by up to 0.27 between runs (2026-12-02); eight halve the variance of their mean.
 */
const rounds = setting("BENCH_ROUNDS", 8, 2, 12);
/**
 * `BENCH_ONLY=profile`: only the CPU profiles of the warm paths (after provisioning), for looking at
 * where the isolate's time goes; it writes no results file and judges nothing.
 */
const profileOnly = process.env.BENCH_ONLY === "profile";
if (process.env.BENCH_ONLY !== undefined && !profileOnly) {
  throw new Error(`BENCH_ONLY=${process.env.BENCH_ONLY}: the only value is "profile"`);
}

/** How long a group is measured: the judged cells in full, the reported-only ones at half. */
interface Shape {
  rounds: number;
  durationMs: number;
}
const judged: Shape = { rounds, durationMs };
const reportedOnly: Shape = { rounds: Math.max(2, Math.floor(rounds / 2)), durationMs: durationMs / 2 };
const stormRequested = setting("BENCH_STORM", 1_000, 10, 1_000);
/**
 * Lessor's pool checkout waits at most 10 s (src/postgres/driver.ts `connectTimeoutOf`, then `lease_timeout`). A storm
 * larger than this machine can serve within half of that would measure the bound, not the start.
 */
const stormBudgetSeconds = 5;
const coldSamples = 5;
const tableRows = 10_000;
/** The pool size of Lessor's default tier, also used for the bare object and the pg floor. */
const poolSize = 5;

/**
 * Admission: a second host name, `tight`, on the same Postgres, whose budget holds exactly two
 * pools of the default size. Bounded: a fixed number of requests, and the phase has a deadline.
 */
const tightHost = "tight";
const tightBudget = { connections: 2 * poolSize + 1, reserve: 1 };
const admissionTenants = Array.from({ length: 6 }, (_, i) => `bench-adm-${i + 1}`);
const evictingSamples = setting("BENCH_ADMISSION_SAMPLES", 20, 4, 60);
const saturatedRounds = setting("BENCH_ADMISSION_ROUNDS", 5, 1, 10);
const capacitySampleMs = 200;

const warmTenant = "bench";
/** The same Postgres by the WebSocket path (through the local proxy, as a `neon` host is reached). */
const wsHost = "ws";
const warmWsTenant = "bench-ws";
const stormTenant = "bench-storm";
const coldTenants = Array.from({ length: coldSamples }, (_, i) => `bench-cold-${i + 1}`);
const baselineRole = "lessor_bench";

const indexedQuery = "SELECT id, label, amount FROM bench_items WHERE id = $1";

// ── Cleanup: nothing this run starts outlives it ─────────────────────────────────────────────────

const stateDir = resolve(root, ".lessor");
const envFile = resolve(stateDir, "bench.vars");
const running: { stack: RunningStack | null; wrangler: RunningWrangler | null } = {
  stack: null,
  wrangler: null,
};
const pgPools: pg.Pool[] = [];

async function cleanup(): Promise<void> {
  closeConnections();
  await Promise.all(pgPools.splice(0).map((pool) => pool.end().catch(() => undefined)));
  await running.wrangler?.stop().catch(() => undefined);
  running.wrangler = null;
  await running.stack?.stop().catch(() => undefined);
  running.stack = null;
  rmSync(envFile, { force: true });
}
// Last resort. The stack process stops its Postgres by itself when this process's IPC channel closes.
process.on("exit", () => {
  running.wrangler?.killNow();
  rmSync(envFile, { force: true });
});
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    console.error(`\nbench: ${signal}, stopping`);
    void cleanup().finally(() => process.exit(130));
  });
}

const runStarted = performance.now();

function progress(line: string): void {
  const seconds = ((performance.now() - runStarted) / 1000).toFixed(0).padStart(4);
  process.stderr.write(`[${seconds}s] ${line}\n`);
}

// ── Configuration from ../wrangler.toml ──────────────────────────────────────────────────────────

/** The `[vars]` of a wrangler.toml: `KEY = "value"` or `KEY = 'value'` lines, nothing fancier. */
function wranglerVars(toml: string): Record<string, string> {
  const vars: Record<string, string> = {};
  let inVars = false;
  for (const raw of toml.split("\n")) {
    const line = raw.trim();
    if (line.startsWith("[")) {
      inVars = line === "[vars]";
      continue;
    }
    if (!inVars || line === "" || line.startsWith("#")) continue;
    const match = /^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?:"([^"\\]*)"|'([^']*)')\s*(?:#.*)?$/.exec(line);
    if (!match?.[1]) throw new Error(`wrangler.toml [vars]: cannot read "${line}" (plain strings only)`);
    vars[match[1]] = match[2] ?? match[3] ?? "";
  }
  return vars;
}

/**
 * The stack's hosts plus `tight`, the same Postgres under a second host name, and `ws`, the same
 * Postgres by its loopback address on the WebSocket path (the TCP hosts use `localhost`, the name
 * its certificate names).
 */
function withTightHost(hostsJson: string): Record<string, string | { url: string; path: string }> {
  const hosts = JSON.parse(hostsJson) as Record<string, string>;
  const first = Object.values(hosts)[0];
  if (!first || tightHost in hosts || wsHost in hosts)
    throw new Error(`cannot add hosts ${tightHost}, ${wsHost} to ${Object.keys(hosts).join(", ")}`);
  return {
    ...hosts,
    [tightHost]: first,
    [wsHost]: { url: first.replace("@localhost:", "@127.0.0.1:"), path: "websocket" },
  };
}

/** Refuses to run if ../wrangler.toml binds a Durable Object or has a migration this config lacks. */
function checkBenchConfig(mainToml: string, benchToml: string): void {
  const classes = (toml: string) => [...toml.matchAll(/class_name\s*=\s*"([^"]+)"/g)].map((m) => m[1]);
  const tags = (toml: string) => [...toml.matchAll(/^\s*tag\s*=\s*"([^"]+)"/gm)].map((m) => m[1]);
  const missing = [
    ...classes(mainToml).filter((c) => !classes(benchToml).includes(c)),
    ...tags(mainToml).filter((t) => !tags(benchToml).includes(t)),
  ];
  if (missing.length > 0) {
    throw new Error(
      `bench/wrangler.toml lacks Durable Object bindings or migrations of wrangler.toml: ${missing.join(", ")}`,
    );
  }
}

// ── Answers ──────────────────────────────────────────────────────────────────────────────────────

function preview(value: unknown): string {
  return JSON.stringify(value)?.slice(0, 200) ?? String(value);
}

/** The id a request reads: spread over the table, deterministic per worker and sequence. */
function pickId(worker: number, sequence: number): number {
  return 1 + ((sequence * 7_919 + worker * 104_729) % tableRows);
}

/** Throws unless `rows` is the right answer: a fast wrong answer is not a result. */
function check(query: QueryName, rows: unknown, id: number): void {
  if (!Array.isArray(rows) || rows.length !== 1) throw new Error(`wrong answer: ${preview(rows)}`);
  const row = rows[0] as Record<string, unknown>;
  const right =
    query === "select1"
      ? row.n === 1
      : row.id === id && row.label === `item-${id}` && row.amount === (id * 7) % 1_000;
  if (!right) throw new Error(`wrong answer for ${query} (id ${id}): ${preview(rows)}`);
}

// ── Endpoints for the neon() client ──────────────────────────────────────────────────────────────

/**
 * The `neon()` client takes its endpoint from `neonConfig.fetchEndpoint`, a function of the
 * connection string's host. Each path gets a host name of its own (`lessor-direct`, …) that maps to
 * its URL; Lessor reads only the user, key and database of the connection string.
 */
const endpoints = new Map<string, string>();
neonConfig.fetchEndpoint = (host) => endpoints.get(host) ?? `http://127.0.0.1:9/unknown-bench-host/${host}`;
neonConfig.fetchFunction = lightFetch;

const routePaths: Record<Exclude<PathName, "pg">, string> = {
  lessor: "/sql",
  "lessor-ws": "/sql",
  bare: "/bench/bare",
  newconn: "/bench/newconn",
  noop: "/bench/noop",
};

function registerEndpoints(ports: Record<"direct" | "proxy", number>): void {
  for (const [path, urlPath] of Object.entries(routePaths)) {
    for (const [route, port] of Object.entries(ports)) {
      endpoints.set(`${path}-${route}`, `http://127.0.0.1:${port}${urlPath}`);
    }
  }
}

interface TenantCredentials {
  id: string;
  key: string;
}

function sqlFor(tenant: TenantCredentials, host: string) {
  return neon(`postgres://${tenant.id}:${tenant.key}@${host}/${tenant.id}`);
}

// ── Measuring ────────────────────────────────────────────────────────────────────────────────────

let cpuGroups: CpuGroups | null = null;
const measurements: Measurement[] = [];

function zeroCpu(): CpuSample {
  return {
    wranglerNode: 0,
    workerdProxy: 0,
    workerdWorker: 0,
    wsProxy: 0,
    postgres: 0,
    benchClient: 0,
    machine: 0,
  };
}

function summarise(spec: Spec, result: LoadResult, cpu: CpuSample, roundRps: number[] = []): Measurement {
  const elapsedS = result.elapsedMs / 1000;
  const perRequest = zeroCpu();
  let busy = 0;
  for (const key of Object.keys(cpu) as (keyof CpuSample)[]) {
    perRequest[key] = result.completed ? (cpu[key] * 1000) / result.completed : 0;
    if (key !== "machine") busy += cpu[key];
  }
  const extras = [spec.transport === "undici" ? "fetch" : "", spec.logLevel === "info" ? "" : spec.logLevel]
    .filter(Boolean)
    .join(",");
  return {
    label: `${spec.path}${extras ? `[${extras}]` : ""} ${spec.route} ${spec.path === "noop" ? "-" : spec.query} c=${spec.concurrency}`,
    ...spec,
    requests: result.completed,
    errors: result.errors,
    errorSamples: result.errorSamples,
    elapsedS,
    rps: result.completed / elapsedS,
    p50Ms: percentile(result.latenciesMs, 50),
    p99Ms: percentile(result.latenciesMs, 99),
    meanMs: result.latenciesMs.reduce((a, b) => a + b, 0) / Math.max(1, result.latenciesMs.length),
    cpuMsPerRequest: perRequest,
    coresBusy: busy / elapsedS,
    otherCoresBusy: Math.max(0, (cpu.machine - busy) / elapsedS),
    loadavg1: loadavg()[0] ?? 0,
    contended: Math.max(0, (cpu.machine - busy) / elapsedS) > contendedCores,
    roundRps,
  };
}

type Call = (worker: number, sequence: number) => Promise<void>;

/**
 * Measures a group of paths at one concurrency, interleaved: each round gives every path a slice of
 * the duration in turn, starting with the next path each round (A B, B A), so drift in the machine's
 * speed and what one slice leaves behind fall on all of them alike instead of on whichever path
 * happened to run during it or after it. The first slice of each path is preceded by the full
 * warmup, later slices by a short one.
 */
async function measureGroup(
  group: { spec: Spec; call: Call }[],
  shape: Shape = reportedOnly,
): Promise<Measurement[]> {
  const groups = cpuGroups;
  if (!groups) throw new Error("the process layout is not known yet");
  const merged = group.map(() => ({
    result: {
      concurrency: 0,
      completed: 0,
      errors: 0,
      errorSamples: [] as string[],
      elapsedMs: 0,
      latenciesMs: [] as number[],
    } satisfies LoadResult,
    cpu: zeroCpu(),
    roundRps: [] as number[],
  }));
  for (let round = 0; round < shape.rounds; round++) {
    // Each round starts with the next path (A B, B A, …): whatever a slice leaves behind (garbage
    // to collect, connections closing) falls on every path in turn, not always on the one after it.
    for (let turn = 0; turn < group.length; turn++) {
      const index = (round + turn) % group.length;
      const member = group[index];
      if (!member) continue;
      const { spec, call } = member;
      const into = merged[index];
      if (!into) continue;
      const cpu = { before: zeroCpu(), after: zeroCpu() };
      const slice = await runLoad(
        {
          concurrency: spec.concurrency,
          warmupMs: round === 0 ? warmupMs : Math.min(warmupMs, 200),
          durationMs: shape.durationMs / shape.rounds,
          maxRequests: maxRequests / shape.rounds,
          call,
        },
        {
          before: () => {
            cpu.before = sampleCpu(groups);
          },
          after: () => {
            cpu.after = sampleCpu(groups);
          },
        },
      );
      const delta = cpuDelta(cpu.before, cpu.after);
      for (const key of Object.keys(delta) as (keyof CpuSample)[]) into.cpu[key] += delta[key];
      into.roundRps.push(slice.elapsedMs > 0 ? (slice.completed * 1000) / slice.elapsedMs : 0);
      into.result.concurrency = slice.concurrency;
      into.result.completed += slice.completed;
      into.result.errors += slice.errors;
      into.result.errorSamples.push(...slice.errorSamples.slice(0, 5 - into.result.errorSamples.length));
      into.result.elapsedMs += slice.elapsedMs;
      into.result.latenciesMs.push(...slice.latenciesMs);
    }
  }
  const out = group.map(({ spec }, index) => {
    const into = merged[index];
    if (!into) throw new Error("lost a measurement");
    return summarise(spec, into.result, into.cpu, into.roundRps);
  });
  for (const measurement of out) {
    measurements.push(measurement);
    progress(
      `  ${measurement.label.padEnd(40)} ${measurement.rps.toFixed(0).padStart(6)} req/s  p50 ${measurement.p50Ms
        .toFixed(2)
        .padStart(
          8,
        )} ms  p99 ${measurement.p99Ms.toFixed(2).padStart(8)} ms  others ${measurement.otherCoresBusy.toFixed(2)} cores${
        measurement.errors ? `  ${measurement.errors} ERRORS: ${measurement.errorSamples[0]}` : ""
      }`,
    );
  }
  return out;
}

function neonCall(tenant: TenantCredentials, host: string, query: QueryName) {
  const sql = sqlFor(tenant, host);
  return async (worker: number, sequence: number) => {
    const id = pickId(worker, sequence);
    const rows: unknown =
      query === "select1" ? await sql.query("SELECT 1 AS n") : await sql.query(indexedQuery, [id]);
    check(query, rows, id);
  };
}

function pgCall(pool: pg.Pool, query: QueryName) {
  return async (worker: number, sequence: number) => {
    const id = pickId(worker, sequence);
    const result =
      query === "select1" ? await pool.query("SELECT 1 AS n") : await pool.query(indexedQuery, [id]);
    check(query, result.rows, id);
  };
}

// ── Lessor's API ─────────────────────────────────────────────────────────────────────────────────

async function admin(base: string, adminKey: string, path: string, body?: unknown): Promise<unknown> {
  const response = await lightFetch(`${base}${path}`, {
    method: body === undefined ? "GET" : "POST",
    headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status} ${text.slice(0, 300)}`);
  return JSON.parse(text) as unknown;
}

async function provision(
  base: string,
  adminKey: string,
  id: string,
  host?: string,
): Promise<TenantCredentials> {
  const body = (await admin(base, adminKey, "/v1/tenants", host === undefined ? { id } : { id, host })) as {
    key?: unknown;
  };
  if (typeof body.key !== "string") throw new Error(`provisioning ${id} returned no key`);
  return { id, key: body.key };
}

interface Runtime {
  state: string;
  generation: number;
  /** Rows the tenant object's storage wrote since its instance started. */
  storageRowsWritten: number;
}

async function runtimeOf(base: string, adminKey: string, id: string): Promise<Runtime> {
  const body = (await admin(base, adminKey, `/v1/tenants/${id}`)) as { runtime?: Partial<Runtime> };
  const runtime = body.runtime;
  if (!runtime || typeof runtime.state !== "string" || typeof runtime.generation !== "number") {
    throw new Error(`GET /v1/tenants/${id} returned no runtime`);
  }
  return {
    state: runtime.state,
    generation: runtime.generation,
    storageRowsWritten: typeof runtime.storageRowsWritten === "number" ? runtime.storageRowsWritten : 0,
  };
}

// ── Superuser access to the bench's Postgres ─────────────────────────────────────────────────────

async function asSuperuser<T>(url: string, work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url, query_timeout: requestTimeoutMs });
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

function databaseUrl(superuserUrl: string, database: string): string {
  const url = new URL(superuserUrl);
  url.pathname = `/${database}`;
  return url.toString();
}

// ── Phases ───────────────────────────────────────────────────────────────────────────────────────

/**
 * How many concurrent first requests this machine can serve within the storm budget: Lessor's warm
 * path is probed at concurrency 64 first.
 */
async function sizeStorm(warm: TenantCredentials): Promise<{ size: number; probeRps: number; note: string }> {
  const probe = await runLoad({
    concurrency: 64,
    warmupMs: 300,
    durationMs: 1_500,
    maxRequests,
    call: neonCall(warm, "lessor-direct", "select1"),
  });
  if (probe.errors > 0) throw new Error(`storm sizing probe: ${probe.errorSamples.join(" | ")}`);
  const probeRps = probe.completed / (probe.elapsedMs / 1000);
  const fits = Math.floor(probeRps * stormBudgetSeconds);
  if (fits >= stormRequested) {
    return { size: stormRequested, probeRps, note: `${stormRequested} as requested` };
  }
  const size = Math.max(10, Math.min(stormRequested, Math.floor(fits / 10) * 10));
  return {
    size,
    probeRps,
    note: `${stormRequested} is not possible on this machine now: Lessor's warm path serves ${probeRps.toFixed(0)} req/s here (concurrency 64), so ${stormRequested} requests would queue ${(stormRequested / probeRps).toFixed(1)} s for the tenant's ${poolSize} connections, past Lessor's 10 s pool checkout bound (lease_timeout). The storm uses ${size}, what fits in ${stormBudgetSeconds} s.`,
  };
}

async function coldStartsAndStorm(
  base: string,
  adminKey: string,
  superuserUrl: string,
  controlPlaneUrl: string,
  warm: TenantCredentials,
  cold: TenantCredentials[],
  storm: TenantCredentials,
): Promise<StormResult> {
  progress("sizing the storm: Lessor's warm path at concurrency 64 for 1.5 s");
  const sizing = await sizeStorm(warm);
  const stormSize = sizing.size;
  progress(`  ${sizing.note}`);
  // First requests come on connections of their own.
  neonConfig.fetchFunction = burstFetch;
  try {
    return await coldAndStorm(base, adminKey, superuserUrl, controlPlaneUrl, cold, storm, stormSize, sizing);
  } finally {
    neonConfig.fetchFunction = lightFetch;
  }
}

async function coldAndStorm(
  base: string,
  adminKey: string,
  superuserUrl: string,
  controlPlaneUrl: string,
  cold: TenantCredentials[],
  storm: TenantCredentials,
  stormSize: number,
  sizing: { probeRps: number; note: string },
): Promise<StormResult> {
  progress(`cold starts: ${cold.length} fresh tenants, one request each`);
  const singleColdMs: number[] = [];
  const singleColdCpu: CpuSample[] = [];
  const rowsPerStart: number[] = [];
  const rowsPerStop: number[] = [];
  for (const tenant of cold) {
    const before = await runtimeOf(base, adminKey, tenant.id);
    if (before.state !== "stopped" || before.generation !== 0) {
      throw new Error(`${tenant.id} is not a fresh stopped tenant: ${preview(before)}`);
    }
    const sql = sqlFor(tenant, "lessor-direct");
    const groups = cpuGroups;
    const cpuBefore = groups ? sampleCpu(groups) : zeroCpu();
    const begin = performance.now();
    check("select1", await sql.query("SELECT 1 AS n"), 0);
    singleColdMs.push(performance.now() - begin);
    singleColdCpu.push(groups ? cpuDelta(cpuBefore, sampleCpu(groups)) : zeroCpu());
    // What the start wrote to the object's storage, and what stopping the pool again writes (an
    // operator drain of an idle pool takes the idle stop's path).
    const started = await runtimeOf(base, adminKey, tenant.id);
    rowsPerStart.push(started.storageRowsWritten - before.storageRowsWritten);
    await admin(base, adminKey, `/v1/tenants/${tenant.id}/drain`, {});
    const drained = await runtimeOf(base, adminKey, tenant.id);
    rowsPerStop.push(drained.storageRowsWritten - started.storageRowsWritten);
  }
  progress(
    `  storage rows written: per start ${rowsPerStart.join(", ")}; per stop ${rowsPerStop.join(", ")}`,
  );
  progress(`  single cold starts: ${singleColdMs.map((v) => v.toFixed(0)).join(", ")} ms`);
  const coldCpuMs = (pick: (cpu: CpuSample) => number) =>
    singleColdCpu.map((cpu) => Math.round(pick(cpu) * 1000));
  progress(
    `  their CPU ms: workerd (Worker + objects) ${coldCpuMs((c) => c.workerdWorker).join(", ")}; Postgres (control plane + tenant host) ${coldCpuMs((c) => c.postgres).join(", ")}`,
  );

  const before = await runtimeOf(base, adminKey, storm.id);
  if (before.state !== "stopped" || before.generation !== 0) {
    throw new Error(`${storm.id} is not a fresh stopped tenant: ${preview(before)}`);
  }
  progress(`storm: ${stormSize} concurrent first requests to ${storm.id}`);
  const burst = async () => {
    const sql = sqlFor(storm, "lessor-direct");
    const latencies: number[] = [];
    const errorSamples: string[] = [];
    let errors = 0;
    let firstAnswerAt = Number.POSITIVE_INFINITY;
    const start = performance.now();
    await Promise.all(
      Array.from({ length: stormSize }, async () => {
        const begin = performance.now();
        try {
          check("select1", await sql.query("SELECT 1 AS n"), 0);
          const now = performance.now();
          firstAnswerAt = Math.min(firstAnswerAt, now);
          latencies.push(now - begin);
        } catch (error) {
          errors++;
          if (errorSamples.length < 5)
            errorSamples.push(error instanceof Error ? error.message : String(error));
        }
      }),
    );
    const firstAnswerMs = Number.isFinite(firstAnswerAt) ? firstAnswerAt - start : 0;
    return { latencies, errors, errorSamples, wallMs: performance.now() - start, firstAnswerMs };
  };
  const first = await burst();
  const runtime = await runtimeOf(base, adminKey, storm.id);
  // Pooled connections are named `lessor:<role>:<generation>`, and the role's name is opaque: the
  // catalog says which it is.
  const role = await asSuperuser(controlPlaneUrl, async (client) => {
    const { rows } = await client.query<{ role: string }>(
      "SELECT role_name AS role FROM tenants WHERE id = $1",
      [storm.id],
    );
    return rows[0]?.role ?? null;
  });
  if (!role) throw new Error(`${storm.id} has no role in the catalog`);
  const applicationNames = await asSuperuser(superuserUrl, async (client) => {
    const { rows } = await client.query<{ n: number }>(
      "SELECT count(DISTINCT application_name)::int AS n FROM pg_stat_activity WHERE application_name LIKE $1",
      [`lessor:${role}:%`],
    );
    return rows[0]?.n ?? -1;
  });
  const ledgerRows = await asSuperuser(controlPlaneUrl, async (client) => {
    const { rows } = await client.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM generation_ledger WHERE tenant_id = $1",
      [storm.id],
    );
    return rows[0]?.n ?? -1;
  });
  const warm = await burst();
  const sortedCold = [...singleColdMs].sort((a, b) => a - b);
  const result: StormResult = {
    tenant: storm.id,
    requested: stormRequested,
    requests: stormSize,
    sizing: { probeRps: sizing.probeRps, budgetSeconds: stormBudgetSeconds, note: sizing.note },
    errors: first.errors,
    errorSamples: first.errorSamples,
    p50Ms: percentile(first.latencies, 50),
    p99Ms: percentile(first.latencies, 99),
    maxMs: percentile(first.latencies, 100),
    wallMs: first.wallMs,
    firstAnswerMs: first.firstAnswerMs,
    starts: {
      runtimeGeneration: runtime.generation,
      applicationNames,
      generationLedgerRows: ledgerRows,
    },
    singleColdMs,
    singleColdMedianMs: sortedCold[Math.floor(sortedCold.length / 2)] ?? 0,
    singleColdCpuMs: {
      workerdWorker: coldCpuMs((c) => c.workerdWorker),
      postgres: coldCpuMs((c) => c.postgres),
      wsProxy: coldCpuMs((c) => c.wsProxy),
    },
    singleColdStorageRows: { start: rowsPerStart, stop: rowsPerStop },
    warmBurst: {
      requests: stormSize,
      errors: warm.errors,
      p50Ms: percentile(warm.latencies, 50),
      p99Ms: percentile(warm.latencies, 99),
      wallMs: warm.wallMs,
      firstAnswerMs: warm.firstAnswerMs,
    },
  };
  progress(
    `  storm: ${result.errors} errors, generation ${runtime.generation}, ${applicationNames} application_name(s), ${ledgerRows} ledger row(s), p50 ${result.p50Ms.toFixed(0)} ms, p99 ${result.p99Ms.toFixed(0)} ms; warm burst p99 ${result.warmBurst.p99Ms.toFixed(0)} ms`,
  );
  if (warm.errors > 0) progress(`  warm burst errors: ${warm.errorSamples.join(" | ")}`);
  return result;
}

async function warmPaths(warm: TenantCredentials, warmWs: TenantCredentials, pgPool: pg.Pool): Promise<void> {
  progress("warm paths, direct to the Worker's workerd (paths interleaved in rounds)");
  for (const concurrency of concurrencies) {
    const common = { route: "direct", transport: "light", logLevel: "info", concurrency } as const;
    await measureGroup([
      { spec: { ...common, path: "noop", query: "select1" }, call: neonCall(warm, "noop-direct", "select1") },
    ]);
    for (const query of queries) {
      // Lessor and the bare object in a group of their own: the new-connection path leaves work
      // behind it in the isolate (clients ending, sockets closing, garbage), which fell on whichever
      // path followed it in the round, always Lessor's until 2026-12-02.
      await measureGroup(
        (["lessor", "bare"] as const).map((path) => ({
          spec: { ...common, path, query },
          call: neonCall(warm, `${path}-direct`, query),
        })),
        judged,
      );
      // The two connection paths side by side (docs/adr/027): the same Lessor, the same Postgres,
      // one tenant's pool over TCP with TLS, the other's over the WebSocket through the local proxy.
      await measureGroup(
        (["lessor", "lessor-ws"] as const).map((path) => ({
          spec: { ...common, path, query },
          call: neonCall(path === "lessor" ? warm : warmWs, `${path}-direct`, query),
        })),
        reportedOnly,
      );
      await measureGroup(
        [
          {
            spec: { ...common, path: "newconn", query },
            call: neonCall(warm, "newconn-direct", query),
          },
          {
            spec: { path: "pg", route: "node", query, transport: "pg", logLevel: "info", concurrency },
            call: pgCall(pgPool, query),
          },
        ],
        judged,
      );
    }
  }
  progress("warm paths, through wrangler dev's proxy");
  for (const concurrency of concurrencies) {
    const common = {
      route: "proxy",
      transport: "light",
      logLevel: "info",
      concurrency,
      query: "select1",
    } as const;
    await measureGroup(
      (["noop", "lessor", "bare"] as const).map((path) => ({
        spec: { ...common, path },
        call: neonCall(warm, `${path}-proxy`, "select1"),
      })),
    );
  }
}

/** The floor as a plain client sees it: Node's global fetch, which asks for gzip. */
async function fetchFloor(warm: TenantCredentials): Promise<void> {
  progress("dev server floor with Node's global fetch");
  neonConfig.fetchFunction = fetch;
  try {
    for (const concurrency of [8, 64]) {
      await measureGroup(
        (["proxy", "direct"] as const).map((route) => ({
          spec: { path: "noop", route, query: "select1", transport: "undici", logLevel: "info", concurrency },
          call: neonCall(warm, `noop-${route}`, "select1"),
        })),
      );
    }
  } finally {
    neonConfig.fetchFunction = lightFetch;
  }
}

/** The same floor and warm path with wrangler's per-request log line turned off. */
async function quietFloor(warm: TenantCredentials): Promise<void> {
  progress("dev server floor with --log-level warn (no per-request log line)");
  const common = { transport: "light", logLevel: "warn", concurrency: 64, query: "select1" } as const;
  await measureGroup([
    { spec: { ...common, path: "noop", route: "proxy" }, call: neonCall(warm, "noop-proxy", "select1") },
    { spec: { ...common, path: "noop", route: "direct" }, call: neonCall(warm, "noop-direct", "select1") },
  ]);
}

/**
 * CPU profiles of the Worker's isolate while Lessor, the bare object and the floor each run alone
 * (SELECT 1, concurrency 8), summarised by source. Profiling slows the isolate, so these runs are
 * not part of the throughput numbers. The raw profiles open in Chrome DevTools.
 */
async function profilePaths(
  warm: TenantCredentials,
  warmWs: TenantCredentials,
  inspectorPort: number,
  sourceMapPath: string,
): Promise<Record<string, ProfileSummary>> {
  progress("CPU profiles of the Worker's isolate (SELECT 1, c=8; not part of the throughput numbers)");
  const map = existsSync(sourceMapPath) ? new SourceMap(sourceMapPath) : null;
  const profileDir = resolve(stateDir, "bench-profiles");
  mkdirSync(profileDir, { recursive: true });
  const out: Record<string, ProfileSummary> = {};
  // `lessor-ws`: the same warm path, its tenant's host reached over the WebSocket (issue 43).
  for (const path of ["lessor", "lessor-ws", "bare", "newconn", "noop"] as const) {
    const call = neonCall(path === "lessor-ws" ? warmWs : warm, `${path}-direct`, "select1");
    const run: { result: LoadResult | null } = { result: null };
    const profile = await profileWhile(`ws://127.0.0.1:${inspectorPort}/ws`, async () => {
      // No warmup inside the profile: the path has just been measured, and every request the profile
      // covers must be counted.
      run.result = await runLoad({
        concurrency: 8,
        warmupMs: 0,
        durationMs: reportedOnly.durationMs,
        maxRequests,
        call,
      });
    });
    if (!run.result) throw new Error("the profiled run did not finish");
    const { completed, errors, errorSamples } = run.result;
    if (errors > 0) throw new Error(`profiling ${path}: ${errors} errors: ${errorSamples.join(" | ")}`);
    writeFileSync(resolve(profileDir, `${path}-select1-c8.cpuprofile`), JSON.stringify(profile));
    out[path] = summariseProfile(profile, map, completed);
    const busyPerRequest = (out[path]?.busyMs ?? 0) / Math.max(1, completed);
    progress(`  ${path}: ${completed} requests, ${busyPerRequest.toFixed(3)} ms of isolate CPU per request`);
  }
  return out;
}

// ── Admission under saturation ───────────────────────────────────────────────────────────────────

interface RawAnswer {
  status: number;
  retryAfter: string | null;
  body: unknown;
  ms: number;
}

/** One `POST /sql` (`SELECT 1`) on a connection of its own, answer kept raw: status, Retry-After, body. */
async function rawSelect1(base: string, tenant: TenantCredentials): Promise<RawAnswer> {
  const begin = performance.now();
  const response = await burstFetch(`${base}/sql`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "neon-connection-string": `postgres://${tenant.id}:${tenant.key}@lessor-direct/${tenant.id}`,
    },
    body: JSON.stringify({ query: "SELECT 1 AS n", params: [] }),
  });
  const text = await response.text();
  const ms = performance.now() - begin;
  let body: unknown = text;
  try {
    body = JSON.parse(text) as unknown;
  } catch {
    // kept as text
  }
  return { status: response.status, retryAfter: response.headers.get("retry-after"), body, ms };
}

function isOne(answer: RawAnswer): boolean {
  const rows = (answer.body as { rows?: unknown } | null)?.rows;
  if (answer.status !== 200 || !Array.isArray(rows) || rows.length !== 1) return false;
  const row = rows[0] as Record<string, unknown> | unknown[];
  const n = Array.isArray(row) ? row[0] : row.n;
  return n === 1 || n === "1";
}

interface HostCapacity {
  host: string;
  poolCapacity: number;
  allocated: number;
  reserved: number;
  draining: number;
  waiters: number;
  evictions: number;
  saturations: number;
}

async function capacityOf(base: string, adminKey: string, host: string): Promise<HostCapacity> {
  const body = (await admin(base, adminKey, "/v1/capacity")) as { hosts?: HostCapacity[] };
  const found = body.hosts?.find((h) => h.host === host);
  if (!found) throw new Error(`GET /v1/capacity has no host ${host}: ${preview(body)}`);
  return found;
}

/**
 * (a) first requests admitted by evicting the least recently used idle pool, and (b) first requests
 * refused while session leases hold both pools of the `tight` host, with GET /v1/capacity sampled
 * throughout. Every request is a first request to a stopped tenant.
 */
async function admission(
  base: string,
  adminKey: string,
  tenants: TenantCredentials[],
  admissionWaitMs: number,
): Promise<AdmissionResult> {
  const at = (i: number): TenantCredentials => {
    const tenant = tenants[i % tenants.length];
    if (!tenant) throw new Error("no admission tenants");
    return tenant;
  };
  const initial = await capacityOf(base, adminKey, tightHost);
  if (
    initial.poolCapacity !== 2 * poolSize ||
    initial.allocated + initial.reserved + initial.draining !== 0
  ) {
    throw new Error(`host ${tightHost} is not an empty two-pool budget: ${preview(initial)}`);
  }

  // The sampler: one GET /v1/capacity at a time, every 200 ms, until stopped.
  const capacity = { samples: 0, maxAR: 0, maxARD: 0, maxWaiters: 0, violations: 0, failures: 0 };
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      try {
        const c = await capacityOf(base, adminKey, tightHost);
        capacity.samples++;
        capacity.maxAR = Math.max(capacity.maxAR, c.allocated + c.reserved);
        capacity.maxARD = Math.max(capacity.maxARD, c.allocated + c.reserved + c.draining);
        capacity.maxWaiters = Math.max(capacity.maxWaiters, c.waiters);
        if (c.allocated + c.reserved + c.draining > c.poolCapacity) capacity.violations++;
      } catch {
        capacity.failures++;
      }
      await new Promise((r) => setTimeout(r, capacitySampleMs));
    }
  })();

  const leases: string[] = [];
  const leaseOwners: TenantCredentials[] = [];
  try {
    // Fill the budget: two first requests that find room.
    progress(
      `admission: filling ${tightHost}'s budget (${tightBudget.connections} connections) with two pools`,
    );
    const withRoomMs: number[] = [];
    for (const i of [0, 1]) {
      const answer = await rawSelect1(base, at(i));
      if (!isOne(answer))
        throw new Error(`first request to ${at(i).id}: ${answer.status} ${preview(answer.body)}`);
      withRoomMs.push(answer.ms);
    }

    // (a) Round robin over six tenants: each request goes to a stopped tenant while both pools are
    // idle, so it is admitted only by evicting the least recently used one.
    progress(`admission (a): ${evictingSamples} first requests that must evict an idle pool`);
    const evictionsBefore = (await capacityOf(base, adminKey, tightHost)).evictions;
    const evicting: number[] = [];
    const evictingErrors: string[] = [];
    let evictingErrorCount = 0;
    for (let i = 2; i < 2 + evictingSamples; i++) {
      const tenant = at(i);
      const before = await runtimeOf(base, adminKey, tenant.id);
      if (before.state !== "stopped") throw new Error(`${tenant.id} is not stopped: ${preview(before)}`);
      const answer = await rawSelect1(base, tenant);
      if (isOne(answer)) {
        evicting.push(answer.ms);
      } else {
        evictingErrorCount++;
        if (evictingErrors.length < 5) evictingErrors.push(`${answer.status} ${preview(answer.body)}`);
      }
    }
    const evictions = (await capacityOf(base, adminKey, tightHost)).evictions - evictionsBefore;
    progress(
      `  p50 ${percentile(evicting, 50).toFixed(0)} ms, p99 ${percentile(evicting, 99).toFixed(0)} ms, ${evictions} evictions, ${evictingErrorCount} errors`,
    );

    // (b) Session leases on both live pools, then rounds of concurrent first requests to the other
    // four tenants: nothing can be evicted, so each must wait out the admission deadline and be
    // refused with 503 capacity_saturated and Retry-After.
    const last = 2 + evictingSamples - 1;
    for (const i of [last - 1, last]) {
      const owner = at(i);
      const response = await lightFetch(`${base}/v1/tenants/${owner.id}/leases`, {
        method: "POST",
        headers: { authorization: `Bearer ${owner.key}`, "content-type": "application/json" },
        body: JSON.stringify({ ttlMs: 120_000 }),
      });
      const text = await response.text();
      if (response.status !== 201) throw new Error(`lease on ${owner.id}: HTTP ${response.status} ${text}`);
      const lease = (JSON.parse(text) as { lease?: unknown }).lease;
      if (typeof lease !== "string") throw new Error(`lease on ${owner.id} returned no token`);
      leases.push(lease);
      leaseOwners.push(owner);
    }
    const heldBefore = await Promise.all(leaseOwners.map((o) => runtimeOf(base, adminKey, o.id)));
    const others = tenants.filter((t) => !leaseOwners.includes(t));
    progress(
      `admission (b): leases on both pools; ${saturatedRounds} rounds of ${others.length} concurrent first requests (expect 503 after ~${admissionWaitMs} ms)`,
    );
    const saturationsBefore = (await capacityOf(base, adminKey, tightHost)).saturations;
    const refused: number[] = [];
    const retryAfter: string[] = [];
    const saturatedErrors: string[] = [];
    let saturatedErrorCount = 0;
    for (let round = 0; round < saturatedRounds; round++) {
      const answers = await Promise.all(others.map((t) => rawSelect1(base, t)));
      for (const answer of answers) {
        refused.push(answer.ms);
        const code = (answer.body as { code?: unknown } | null)?.code;
        if (answer.status === 503 && code === "capacity_saturated" && answer.retryAfter) {
          retryAfter.push(answer.retryAfter);
        } else {
          saturatedErrorCount++;
          if (saturatedErrors.length < 5)
            saturatedErrors.push(`${answer.status} retry-after=${answer.retryAfter} ${preview(answer.body)}`);
        }
      }
    }
    const saturations = (await capacityOf(base, adminKey, tightHost)).saturations - saturationsBefore;
    const heldAfter = await Promise.all(leaseOwners.map((o) => runtimeOf(base, adminKey, o.id)));
    const leasedPoolsKept = heldAfter.every(
      (r, i) => r.state === "ready" && r.generation === heldBefore[i]?.generation,
    );
    progress(
      `  p50 ${percentile(refused, 50).toFixed(0)} ms, p99 ${percentile(refused, 99).toFixed(0)} ms, ${refused.length - saturatedErrorCount} of ${refused.length} were 503 capacity_saturated, ${saturations} saturations`,
    );

    // Release the leases: each must answer 204.
    let leasesReleased = 0;
    while (leases.length > 0) {
      const lease = leases.shift();
      const owner = leaseOwners.shift();
      if (!lease || !owner) break;
      const response = await lightFetch(`${base}/v1/leases/${lease}`, {
        method: "DELETE",
        headers: { authorization: `Bearer ${owner.key}` },
      });
      await response.text();
      if (response.status === 204) leasesReleased++;
    }

    sampling = false;
    await sampler;
    if (capacity.samples === 0) throw new Error("GET /v1/capacity answered no sample");
    progress(
      `  GET /v1/capacity: ${capacity.samples} samples, max allocated+reserved ${capacity.maxAR}, +draining ${capacity.maxARD} of ${initial.poolCapacity}`,
    );
    return {
      host: tightHost,
      budget: { ...tightBudget, poolCapacity: initial.poolCapacity, poolSize },
      admissionWaitMs,
      tenants: tenants.length,
      withRoomMs,
      evicting: {
        requests: evictingSamples,
        errors: evictingErrorCount,
        errorSamples: evictingErrors,
        p50Ms: percentile(evicting, 50),
        p99Ms: percentile(evicting, 99),
        maxMs: percentile(evicting, 100),
        evictions,
      },
      saturated: {
        rounds: saturatedRounds,
        concurrency: others.length,
        requests: refused.length,
        errors: saturatedErrorCount,
        errorSamples: saturatedErrors,
        retryAfter,
        p50Ms: percentile(refused, 50),
        p99Ms: percentile(refused, 99),
        minMs: percentile(refused, 0),
        maxMs: percentile(refused, 100),
        saturations,
        leasedPoolsKept,
        leasesReleased,
      },
      capacity: {
        samples: capacity.samples,
        maxAllocatedPlusReserved: capacity.maxAR,
        maxAllocatedPlusReservedPlusDraining: capacity.maxARD,
        maxWaiters: capacity.maxWaiters,
        violations: capacity.violations,
      },
    };
  } finally {
    sampling = false;
    await sampler;
    for (const [i, lease] of leases.entries()) {
      const owner = leaseOwners[i];
      if (!owner) continue;
      await lightFetch(`${base}/v1/leases/${lease}`, {
        method: "DELETE",
        headers: { authorization: `Bearer ${owner.key}` },
      })
        .then((r) => r.text())
        .catch(() => undefined);
    }
  }
}

/** Wrong answers in the admission phase, for the run's error count. */
function admissionErrors(a: AdmissionResult): number {
  return (
    a.evicting.errors +
    a.saturated.errors +
    a.capacity.violations +
    (a.evicting.evictions === a.evicting.requests ? 0 : 1) +
    (a.saturated.leasedPoolsKept ? 0 : 1) +
    (a.saturated.leasesReleased === 2 ? 0 : 1)
  );
}

// ── Main ─────────────────────────────────────────────────────────────────────────────────────────

function packageVersion(name: string): string {
  try {
    const pkg = JSON.parse(readFileSync(resolve(root, "node_modules", name, "package.json"), "utf8")) as {
      version?: string;
    };
    return pkg.version ?? "?";
  } catch {
    return "?";
  }
}

/** The commit the measured code came from, and whether src/ had uncommitted changes (read-only git). */
function sourceRevision(): { commit: string; srcUncommittedChanges: boolean | null } {
  const git = (args: string[]) => {
    const result = spawnSync("git", args, { cwd: root, encoding: "utf8", timeout: 10_000 });
    return result.status === 0 ? result.stdout.trim() : null;
  };
  const status = git(["status", "--porcelain", "--", "src", "wrangler.toml"]);
  return {
    commit: git(["rev-parse", "HEAD"]) ?? "?",
    srcUncommittedChanges: status === null ? null : status !== "",
  };
}

async function startWranglerFor(
  script: string,
  port: number,
  logLevel: string,
): Promise<{ wrangler: RunningWrangler; directPort: number; inspectorPort: number }> {
  const inspectorPort = await freePort();
  const started = await startWrangler({
    script,
    port,
    inspectorPort,
    envFile,
    persistTo: resolve(stateDir, "bench-wrangler"),
    ...(logLevel === "info" ? {} : { logLevel }),
  });
  running.wrangler = started;
  const pid = started.child.pid;
  const stack = running.stack;
  if (pid === undefined || !stack) throw new Error("wrangler or the stack has no pid");
  const layout = await findWranglerLayout(pid, port);
  const postgresRoots = descendants(stack.child.pid ?? -1)
    .filter((p) => p.comm === "postgres")
    .filter((p, _, all) => !all.some((other) => other.pid === p.ppid));
  cpuGroups = {
    ...layout.groups,
    wsProxy: [stack.info.wsProxyPid],
    postgres: postgresRoots.map((p) => p.pid),
  };
  registerEndpoints({ direct: layout.directPort, proxy: port });
  return { wrangler: started, directPort: layout.directPort, inspectorPort };
}

async function main(): Promise<number> {
  const startedAt = new Date();
  const loadStart = loadavg();
  const mainToml = readFileSync(resolve(root, "wrangler.toml"), "utf8");
  checkBenchConfig(mainToml, readFileSync(resolve(root, "bench/wrangler.toml"), "utf8"));
  const vars = wranglerVars(mainToml);

  mkdirSync(stateDir, { recursive: true });
  const adminKey = `lak_bench_${randomBytes(24).toString("base64url")}`;
  const baselinePassword = randomBytes(24).toString("base64url");
  const pgPort = await freePort();

  progress("starting the local stack (throwaway Postgres in .lessor/bench-pg, WebSocket proxy)");
  const stack = await startStack({
    dataDir: resolve(stateDir, "bench-pg"),
    pgPort,
    password: randomBytes(24).toString("base64url"),
  });
  running.stack = stack;
  const { superuserUrl, controlPlaneUrl } = stack.info;
  const serverVersion = await asSuperuser(superuserUrl, async (client) => {
    // The baselines' own login role: SCRAM like the tenant's role, so a new connection costs the same.
    await client.query(`CREATE ROLE ${baselineRole} LOGIN PASSWORD '${baselinePassword}'`);
    const { rows } = await client.query<{ server_version: string }>("SHOW server_version");
    return rows[0]?.server_version ?? "?";
  });
  // The baselines read an identical table in a database of their own: tenant databases have opaque
  // names chosen at provisioning (and a login guard), and the Worker's env is written before that.
  const warmDatabase = "bench_baseline";
  const baselineUrl = `postgres://${baselineRole}:${baselinePassword}@127.0.0.1:${pgPort}/${warmDatabase}`;

  // wrangler reads secrets from an env file (git-ignored, removed at exit); single quotes keep the
  // values literal, and none of them contains one.
  const env: Record<string, string> = {
    ...vars,
    LESSOR_ADMIN_KEY: adminKey,
    LESSOR_SEAL_KEY: randomBytes(32).toString("base64"),
    LESSOR_KEY_MAC_KEYS: randomBytes(32).toString("base64"),
    LESSOR_CONTROL_PLANE_URL: controlPlaneUrl,
    // A second host name on the same Postgres, with a budget of exactly two pools (admission phase).
    LESSOR_HOSTS: JSON.stringify(withTightHost(stack.info.hostsJson)),
    LESSOR_BUDGETS: JSON.stringify({
      ...(JSON.parse(vars.LESSOR_BUDGETS ?? "{}") as Record<string, unknown>),
      [tightHost]: tightBudget,
    }),
    LESSOR_WS_PROXY: stack.info.wsProxy,
    BENCH_DATABASE_URL: baselineUrl,
  };
  for (const [key, value] of Object.entries(env)) {
    if (value.includes("'") || value.includes("\n"))
      throw new Error(`${key} cannot be written to an env file`);
  }
  writeFileSync(
    envFile,
    `${Object.entries(env)
      .map(([k, v]) => `${k}='${v}'`)
      .join("\n")}\n`,
    { mode: 0o600 },
  );
  rmSync(resolve(stateDir, "bench-wrangler"), { recursive: true, force: true });

  progress("bundling the bench Worker once (a snapshot of src/ as it is now)");
  const source = sourceRevision();
  const script = await buildWorker(resolve(stateDir, "bench-build"));
  progress("starting wrangler dev with bench/wrangler.toml");
  const publicPort = await freePort();
  let { directPort, inspectorPort } = await startWranglerFor(script, publicPort, "info");
  const direct = `http://127.0.0.1:${directPort}`;
  progress(`  wrangler dev on :${publicPort}, the Worker's own workerd on :${directPort}`);

  progress("provisioning tenants through POST /v1/tenants");
  const warm = await provision(direct, adminKey, warmTenant);
  const warmWs = await provision(direct, adminKey, warmWsTenant, wsHost);
  const storm = await provision(direct, adminKey, stormTenant);
  const cold: TenantCredentials[] = [];
  for (const id of coldTenants) cold.push(await provision(direct, adminKey, id));
  const admissionSet: TenantCredentials[] = [];
  for (const id of admissionTenants) admissionSet.push(await provision(direct, adminKey, id, tightHost));

  progress(`creating bench_items (${tableRows} rows, primary key) through /sql`);
  for (const [tenant, host] of [
    [warm, "lessor-direct"],
    [warmWs, "lessor-ws-direct"],
  ] as const) {
    const setup = sqlFor(tenant, host);
    await setup.query(
      "CREATE TABLE bench_items (id integer PRIMARY KEY, label text NOT NULL, amount integer NOT NULL)",
    );
    await setup.query(
      "INSERT INTO bench_items SELECT g, 'item-' || g, (g * 7) % 1000 FROM generate_series(1, $1::int) AS g",
      [tableRows],
    );
    await setup.query("ANALYZE bench_items");
  }
  await asSuperuser(superuserUrl, async (client) => {
    await client.query(`CREATE DATABASE "${warmDatabase}"`);
    await client.query(`GRANT CONNECT ON DATABASE "${warmDatabase}" TO ${baselineRole}`);
  });
  await asSuperuser(databaseUrl(superuserUrl, warmDatabase), async (client) => {
    await client.query(
      "CREATE TABLE bench_items (id integer PRIMARY KEY, label text NOT NULL, amount integer NOT NULL)",
    );
    await client.query(
      "INSERT INTO bench_items SELECT g, 'item-' || g, (g * 7) % 1000 FROM generate_series(1, $1::int) AS g",
      [tableRows],
    );
    await client.query("ANALYZE bench_items");
    await client.query(`GRANT SELECT ON bench_items TO ${baselineRole}`);
  });
  const plan = (await sqlFor(warm, "lessor-direct").query(`EXPLAIN ${indexedQuery.replace("$1", "42")}`)) as {
    "QUERY PLAN"?: string;
  }[];
  const planText = plan.map((row) => row["QUERY PLAN"] ?? "").join(" ");
  if (!/Index/.test(planText)) throw new Error(`the indexed read does not use the index: ${planText}`);

  const pgPool = new pg.Pool({
    connectionString: baselineUrl,
    max: poolSize,
    application_name: "bench:pg",
    query_timeout: requestTimeoutMs,
    connectionTimeoutMillis: 10_000,
  });
  pgPool.on("error", () => undefined);
  pgPools.push(pgPool);

  if (profileOnly) {
    // A profile of the warm paths and nothing else: no figures, no results file (see bench/README.md).
    const profiled = await profilePaths(warm, warmWs, inspectorPort, `${script}.map`);
    for (const [path, summary] of Object.entries(profiled)) {
      progress(`${path}: ms per request by source ${JSON.stringify(summary.msPerRequestBySource)}`);
      for (const top of summary.top.slice(0, 20)) {
        progress(`  ${top.msPerRequest.toFixed(3)} ms  ${top.fn}  ${top.source}`);
      }
    }
    await cleanup();
    progress(
      `profiles written to ${resolve(stateDir, "bench-profiles")} (BENCH_ONLY=profile: no results file)`,
    );
    return 0;
  }
  const stormResult = await coldStartsAndStorm(
    direct,
    adminKey,
    superuserUrl,
    controlPlaneUrl,
    warm,
    cold,
    storm,
  );
  const admissionWaitMs = Number(vars.LESSOR_ADMISSION_WAIT_MS ?? 2_000);
  const admissionResult = await within(
    admission(direct, adminKey, admissionSet, admissionWaitMs),
    180_000,
    "the admission phase",
  );
  await warmPaths(warm, warmWs, pgPool);
  await fetchFloor(warm);
  const profiles = await profilePaths(warm, warmWs, inspectorPort, `${script}.map`);

  progress("restarting wrangler dev with --log-level warn");
  await running.wrangler?.stop();
  ({ directPort, inspectorPort } = await startWranglerFor(script, publicPort, "warn"));
  await quietFloor(warm);

  await cleanup();
  const finishedAt = new Date();

  const allRatios = ratios(measurements);
  const targets: Target[] = judgeTargets(allRatios, stormResult);
  const lessorC8 = find(measurements, {
    path: "lessor",
    route: "direct",
    query: "select1",
    concurrency: 8,
    transport: "light",
    logLevel: "info",
  });
  const median = (values: readonly number[] | undefined) => {
    const sorted = [...(values ?? [])].sort((a, b) => a - b);
    return sorted.length === 0 ? 0 : (sorted[Math.floor(sorted.length / 2)] ?? 0);
  };
  const price = priceModel({
    cpuMsPerRequest: lessorC8?.cpuMsPerRequest.workerdWorker ?? 0,
    coldStartCpuMs: median(stormResult.singleColdCpuMs?.workerdWorker),
    coldStartPostgresCpuMs: median(stormResult.singleColdCpuMs?.postgres),
    coldStartStorageRows:
      median(stormResult.singleColdStorageRows?.start) +
      median(stormResult.singleColdStorageRows?.stop) +
      outboxFlushRowsPerCycle,
  });
  const verdict = verdictLine(targets, measurements);
  const errors =
    measurements.reduce((n, m) => n + m.errors, 0) +
    stormResult.errors +
    stormResult.warmBurst.errors +
    admissionErrors(admissionResult);
  const date = startedAt.toISOString().slice(0, 10);
  const cpuInfo = cpus();
  const versions: Record<string, string> = {
    node: process.version,
    postgres: serverVersion,
    wrangler: packageVersion("wrangler"),
    miniflare: packageVersion("miniflare"),
    workerd: packageVersion("workerd"),
    "@neondatabase/serverless": packageVersion("@neondatabase/serverless"),
    pg: packageVersion("pg"),
    hono: packageVersion("hono"),
  };
  const results = {
    date,
    startedAt: startedAt.toISOString(),
    finishedAt: finishedAt.toISOString(),
    durationS: (finishedAt.getTime() - startedAt.getTime()) / 1000,
    command: "npm run bench",
    machine: {
      cores: cpuInfo.length,
      cpuModel: cpuInfo[0]?.model ?? "?",
      memoryMB: Math.round(totalmem() / 2 ** 20),
      platform: `${process.platform} ${release()}`,
      node: process.version,
      loadavgAtStart: loadStart,
      loadavgAtEnd: loadavg(),
    },
    versions,
    source,
    method: {
      loadGenerator:
        "closed loop in Node: `concurrency` workers, each sending its next request when the previous answers; a warmup that is not recorded, then a bounded duration or request cap",
      warmupMs,
      durationMs,
      maxRequests,
      rounds,
      reportedOnly,
      interleaving:
        "the paths of a group run in turn, in rounds, each round a slice of the duration, each round starting with the next path (A B, B A, ...); Lessor and the bare object form one group, the new connection and pg another",
      concurrencies,
      queries: { select1: "SELECT 1 AS n", indexed: `${indexedQuery} (${tableRows} rows, random id)` },
      client:
        "the official neon() HTTP client for every Worker path (neonConfig.fetchEndpoint per path), over a keep-alive node:http transport without compression; `pg` Pool for the database floor",
      poolSize,
      routes: {
        direct: "to the workerd that runs the Worker, found from /proc (what production has: no dev proxy)",
        proxy: "through wrangler dev's public port (its proxy worker in a second workerd)",
        node: "no Worker: Node straight to Postgres",
      },
      cpu: "per process group from /proc/<pid>/stat (utime+stime+cutime+cstime) over the measured phase",
      answers: "every answer is checked (value and row); any error or wrong answer fails the run",
      targetsJudgedOn: "the direct route",
    },
    measurements,
    ratios: allRatios,
    storm: stormResult,
    profiles,
    admission: admissionResult,
    targets,
    verdict,
    price,
    errors,
  };

  const markdown = [
    `# Lessor bench, ${date}`,
    "",
    `${cpuInfo.length} cores (${results.machine.cpuModel}), ${results.machine.memoryMB} MB, Node ${process.version}, Postgres ${serverVersion}, wrangler ${versions.wrangler}; load average at start ${loadStart.map((v) => v.toFixed(2)).join(" ")}`,
    "",
    "## Throughput and latency",
    "",
    measurementsTable(measurements),
    "",
    "## Lessor against each baseline (throughput ratios; p50 ratios)",
    "",
    ratiosTable(allRatios),
    "",
    "## Where the time goes: CPU ms per request, by process",
    "",
    profileTable(measurements),
    "",
    "## Cold-start storm",
    "",
    stormTable(stormResult),
    "",
    "## Admission under saturation (reported, no target)",
    "",
    admissionTable(admissionResult),
    "",
    "## The Worker's isolate, profiled (SELECT 1, c=8): CPU ms per request by source",
    "",
    profileSourcesTable(profiles),
    "",
    ...(profiles.lessor
      ? ["Lessor's hottest functions (self time):", "", topFunctionsTable(profiles.lessor), ""]
      : []),
    "## What it costs (bench/price.ts)",
    "",
    priceTable(price),
    "",
    "## Targets (reported, not asserted)",
    "",
    targetsTable(targets),
    "",
    verdict,
    "",
  ].join("\n");
  console.log(markdown);

  if (errors > 0) {
    console.error(`\nbench FAILED: ${errors} error(s) or wrong answer(s); no results written.`);
    for (const m of measurements.filter((x) => x.errors > 0)) {
      console.error(`  ${m.label}: ${m.errors} — ${m.errorSamples.join(" | ")}`);
    }
    if (stormResult.errors > 0) console.error(`  storm: ${stormResult.errorSamples.join(" | ")}`);
    if (admissionErrors(admissionResult) > 0) {
      console.error(
        `  admission: ${[...admissionResult.evicting.errorSamples, ...admissionResult.saturated.errorSamples].join(" | ")}; evictions ${admissionResult.evicting.evictions} of ${admissionResult.evicting.requests}; leased pools kept: ${admissionResult.saturated.leasedPoolsKept}; leases released ${admissionResult.saturated.leasesReleased} of 2; capacity violations ${admissionResult.capacity.violations}`,
      );
    }
    return 1;
  }
  const resultsDir = resolve(root, "bench/results");
  mkdirSync(resultsDir, { recursive: true });
  const file = resolve(resultsDir, `${date}.json`);
  // Written whole or not at all: a killed run leaves a .tmp (git-ignored), never half a result.
  writeFileSync(`${file}.tmp`, `${JSON.stringify(results, null, 2)}\n`);
  renameSync(`${file}.tmp`, file);
  progress(`results written to bench/results/${date}.json`);
  return 0;
}

try {
  const code = await within(main(), 15 * 60_000, "the whole bench");
  process.exitCode = code;
} catch (error) {
  console.error(`\nbench FAILED: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
  const output = running.wrangler?.output ?? [];
  if (output.length) console.error(`last wrangler output:\n${output.slice(-20).join("\n")}`);
  process.exitCode = 1;
} finally {
  await cleanup();
  // Nothing may keep a finished (or timed-out) bench alive.
  process.exit(process.exitCode ?? 0);
}
