/**
 * `npm run bench:peers`: Lessor side by side with PgBouncer, in one run, against the same Postgres.
 *
 * PgBouncer (Debian's package; installed with apt-get if it is missing) runs in transaction mode
 * with one pool per tenant database, as its users set it up for database-per-tenant. Three parts:
 *
 * 1. Warm path: Node `pg` → PgBouncer → Postgres against Lessor's `/sql` (the official `neon()`
 *    client), `SELECT 1` and an indexed read at concurrency 1, 8 and 64: req/s, p50, p99 and CPU
 *    per request of every process (pgbouncer; workerd, the WebSocket proxy; Postgres; the client),
 *    with a direct `pg` pool as the floor, and Lessor's cost split into its parts (the bench
 *    Worker's no-database floor and bare Durable Object, and V8 profiles of the isolate).
 * 2. Budget storm: 200 tenants, 1,000 concurrent first requests (5 per tenant), Postgres
 *    `max_connections` 100. Lessor with a host budget of 50; PgBouncer with `default_pool_size` 5
 *    as it is usually set up (a login role per tenant: nothing caps the total), and with the only
 *    total cap 1.18 has (`max_user_connections` 50, which needs every pool to log in as one shared
 *    role). Max backends in `pg_stat_activity` (sampled every 100 ms), errors by kind, time to
 *    drain the burst, and whether every request succeeded with retries before a deadline.
 * 3. Idle fleet: 500 tenants touched once, then idle; the backends each holds over the next two
 *    minutes (Lessor's LESSOR_IDLE_TIMEOUT_MS against PgBouncer's server_idle_timeout, at its
 *    default 600 s and at 60 s).
 *
 * Results: bench/results/peers-<date>.json and markdown on stdout. See bench/README.md.
 */
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { neon, neonConfig } from "@neondatabase/serverless";
import pg from "pg";
import { writeEnvFile } from "../local/stack.ts";
import { type Breakdown, breakdown } from "./breakdown.ts";
import { type RunningClusterStack, startClusterStack } from "./cluster-stack.ts";
import {
  admin,
  answerKind,
  asSuperuser,
  connectedLocalPorts,
  databaseUrl,
  groupCpuSeconds,
  inParallel,
  isOne,
  loadNow,
  machineBusySeconds,
  machineFacts,
  mdTable,
  num,
  packageVersion,
  progress,
  provision,
  pssMiB,
  rank,
  rawSql,
  round,
  rssMiB,
  setting,
  sleep,
  sourceRevision,
  stopOnExit,
  type TenantCredentials,
  tenantDatabaseNames,
  wranglerVars,
} from "./harness.ts";
import { type LoadResult, lightFetch, percentile, runLoad } from "./load.ts";
import { type BouncerConfig, ensurePgBouncer, type RunningBouncer, startBouncer } from "./pgbouncer.ts";
import {
  buildWorker,
  findWranglerLayout,
  freePort,
  type RunningWrangler,
  root,
  startWrangler,
  type WranglerLayout,
  within,
} from "./processes.ts";
import { profileWhile, SourceMap } from "./profile.ts";

// ── Settings ─────────────────────────────────────────────────────────────────────────────────────

const concurrencies = [1, 8, 64] as const;
type QueryName = "select1" | "indexed";
const queries: readonly QueryName[] = ["select1", "indexed"];
const warmupMs = setting("BENCH_WARMUP_MS", 500, 0, 10_000);
const durationMs = setting("BENCH_DURATION_MS", 2_500, 200, 30_000);
const rounds = 2;
const maxRequests = 50_000;
const tableRows = 10_000;
const poolSize = 5;
const idleTenantCount = setting("PEERS_IDLE_TENANTS", 500, 10, 500);
const stormTenantCount = Math.min(idleTenantCount, setting("PEERS_STORM_TENANTS", 200, 10, 200));
const stormPerTenant = 5;
const stormMaxConnections = 100;
// 50 in all for Lessor on the host, 2 of them the maintenance reserve (a reserve of 0 is refused since issue 16).
const stormBudget = { connections: 50, reserve: 2 };
/**
 * `PEERS_STORM_ADAPTIVE`: the storm host's `adaptive` budget setting (JSON: `true`, or the policy),
 * to measure the storm with adaptive admission (docs/adr/022); pair it with a tier whose `size` is
 * below its `max` in `PEERS_LESSOR_VARS`'s `LESSOR_POOL_SIZES`. Off by default; recorded.
 */
const stormAdaptive = JSON.parse(process.env.PEERS_STORM_ADAPTIVE ?? "false") as unknown;
const stormDeadlineMs = setting("PEERS_STORM_DEADLINE_MS", 240_000, 10_000, 600_000);
const forcedSharedDeadlineMs = Math.min(stormDeadlineMs, 60_000);
const idleWatchMs = setting("PEERS_IDLE_WATCH_MS", 125_000, 10_000, 300_000);
const lessorIdleTimeoutMs = 60_000;
/** PgBouncer's default, and the same timeout as Lessor's. */
const bouncerIdleTimeouts = [600, 60] as const;
/** The warm phases' Postgres: room for every pool the idle phase opens (500 × 3 systems). */
const roomyMaxConnections = 1_700;
/** Lessor's budget for the warm and idle phases: no pool is ever evicted for room. */
const roomyBudget = { connections: 2_600, reserve: 4 };
const provisionConcurrency = setting("PEERS_PROVISION_CONCURRENCY", 6, 1, 16);
/** Which parts run (`PEERS_PHASES=storm` to repeat only the storm); all three by default. */
const phases = new Set((process.env.PEERS_PHASES ?? "warm,idle,storm").split(",").map((p) => p.trim()));
for (const phase of phases) {
  if (!["warm", "idle", "storm"].includes(phase)) throw new Error(`PEERS_PHASES: unknown phase ${phase}`);
}

/** Lessor [vars] this run overrides (`PEERS_LESSOR_VARS`, JSON of strings); none by default. */
const lessorVarOverrides = JSON.parse(process.env.PEERS_LESSOR_VARS ?? "{}") as Record<string, string>;
for (const [name, value] of Object.entries(lessorVarOverrides)) {
  if (!/^LESSOR_[A-Z_]+$/.test(name) || typeof value !== "string")
    throw new Error(`PEERS_LESSOR_VARS: ${name} must be a LESSOR_ variable with a string value`);
}
/** `PEERS_STORM_SYSTEMS=lessor` storms Lessor alone (PgBouncer's storms do not change with Lessor). */
const stormSystems = new Set(
  (process.env.PEERS_STORM_SYSTEMS ?? "lessor,pgbouncer").split(",").map((p) => p.trim()),
);

const hostName = "pg";
const warmTenantId = "peerwarm";
const fleetIds = Array.from({ length: idleTenantCount }, (_, i) => `peer${String(i + 1).padStart(4, "0")}`);
const stormIds = fleetIds.slice(0, stormTenantCount);
const bareRole = "lessor_bench";
const sharedRole = "pgb_shared";
const indexedQuery = "SELECT id, label, amount FROM bench_items WHERE id = $1";

const stateDir = resolve(root, ".lessor/bench-peers");
const envFile = resolve(stateDir, "wrangler.vars");
const persistDir = resolve(stateDir, "wrangler");

// ── Cleanup: nothing this run starts outlives it ─────────────────────────────────────────────────

const running: {
  stack: RunningClusterStack | null;
  wrangler: RunningWrangler | null;
  bouncers: RunningBouncer[];
  pools: pg.Pool[];
} = { stack: null, wrangler: null, bouncers: [], pools: [] };

const cleanup = stopOnExit("bench:peers", envFile, running, {
  before: async () => {
    await Promise.all(running.pools.splice(0).map((pool) => pool.end().catch(() => undefined)));
    await Promise.all(running.bouncers.splice(0).map((b) => b.stop().catch(() => undefined)));
  },
});

// ── Names and passwords ──────────────────────────────────────────────────────────────────────────

const roleOf = (tenant: string) => `pgb_${tenant}`;
/**
 * Each tenant's database, as Lessor named it at provisioning (opaque `t_<16 hex>`, kept in the
 * catalog): read from the control plane once every tenant is provisioned.
 */
const databaseNames = new Map<string, string>();
function databaseOf(tenant: string): string {
  const name = databaseNames.get(tenant);
  if (!name) throw new Error(`no database name for tenant ${tenant} (not provisioned?)`);
  return name;
}
const passwords = new Map<string, string>();
function passwordOf(role: string): string {
  let password = passwords.get(role);
  if (!password) {
    password = randomBytes(18).toString("base64url");
    passwords.set(role, password);
  }
  return password;
}

// ── The Worker ───────────────────────────────────────────────────────────────────────────────────

interface Worker {
  wrangler: RunningWrangler;
  layout: WranglerLayout;
  direct: string;
  inspectorPort: number;
}

async function startWorker(script: string, env: Record<string, string>): Promise<Worker> {
  writeEnvFile(envFile, env);
  const port = await freePort();
  const inspectorPort = await freePort();
  const wrangler = await startWrangler({ script, port, inspectorPort, envFile, persistTo: persistDir });
  running.wrangler = wrangler;
  const pid = wrangler.child.pid;
  if (pid === undefined) throw new Error("wrangler has no pid");
  const layout = await findWranglerLayout(pid, port);
  return { wrangler, layout, direct: `http://127.0.0.1:${layout.directPort}`, inspectorPort };
}

async function stopWorker(worker: Worker): Promise<void> {
  await worker.wrangler.stop();
  running.wrangler = null;
}

// ── neon() endpoints ─────────────────────────────────────────────────────────────────────────────

const endpoints = new Map<string, string>();
neonConfig.fetchEndpoint = (host) => endpoints.get(host) ?? `http://127.0.0.1:9/unknown-bench-host/${host}`;
neonConfig.fetchFunction = lightFetch;

function neonFor(tenant: TenantCredentials, endpointHost: string) {
  return neon(`postgres://${tenant.id}:${tenant.key}@${endpointHost}/${tenant.id}`);
}

// ── Answers ──────────────────────────────────────────────────────────────────────────────────────

function pickId(worker: number, sequence: number): number {
  return 1 + ((sequence * 7_919 + worker * 104_729) % tableRows);
}

function check(query: QueryName, rows: unknown, id: number): void {
  if (!Array.isArray(rows) || rows.length !== 1) throw new Error(`wrong answer: ${JSON.stringify(rows)}`);
  const row = rows[0] as Record<string, unknown>;
  const right =
    query === "select1"
      ? row.n === 1
      : row.id === id && row.label === `item-${id}` && row.amount === (id * 7) % 1_000;
  if (!right) throw new Error(`wrong answer for ${query} (id ${id}): ${JSON.stringify(rows)}`);
}

type Call = (worker: number, sequence: number) => Promise<void>;

function neonCall(tenant: TenantCredentials, endpointHost: string, query: QueryName): Call {
  const sql = neonFor(tenant, endpointHost);
  return async (worker, sequence) => {
    const id = pickId(worker, sequence);
    const rows: unknown =
      query === "select1" ? await sql.query("SELECT 1 AS n") : await sql.query(indexedQuery, [id]);
    check(query, rows, id);
  };
}

function pgCall(pool: pg.Pool, query: QueryName): Call {
  return async (worker, sequence) => {
    const id = pickId(worker, sequence);
    const result =
      query === "select1" ? await pool.query("SELECT 1 AS n") : await pool.query(indexedQuery, [id]);
    check(query, result.rows, id);
  };
}

// ── CPU by process ───────────────────────────────────────────────────────────────────────────────

/** Process groups whose CPU a measurement reports; the Postgres groups include every backend. */
interface ProcessGroups {
  pgbouncer: number[];
  workerdWorker: number[];
  workerdProxy: number[];
  wranglerNode: number[];
  wsProxy: number[];
  postgres: number[];
  controlPlane: number[];
}
type CpuByGroup = Record<keyof ProcessGroups | "client" | "machine", number>;

function sampleCpu(groups: ProcessGroups): CpuByGroup {
  const usage = process.cpuUsage();
  return {
    pgbouncer: groupCpuSeconds(groups.pgbouncer),
    workerdWorker: groupCpuSeconds(groups.workerdWorker),
    workerdProxy: groupCpuSeconds(groups.workerdProxy),
    wranglerNode: groupCpuSeconds(groups.wranglerNode),
    wsProxy: groupCpuSeconds(groups.wsProxy),
    postgres: groupCpuSeconds(groups.postgres, true),
    controlPlane: groupCpuSeconds(groups.controlPlane, true),
    client: (usage.user + usage.system) / 1e6,
    machine: machineBusySeconds(),
  };
}

function zeroCpu(): CpuByGroup {
  return {
    pgbouncer: 0,
    workerdWorker: 0,
    workerdProxy: 0,
    wranglerNode: 0,
    wsProxy: 0,
    postgres: 0,
    controlPlane: 0,
    client: 0,
    machine: 0,
  };
}

function cpuDelta(before: CpuByGroup, after: CpuByGroup, per = 1): Partial<CpuByGroup> {
  return Object.fromEntries(
    (Object.keys(after) as (keyof CpuByGroup)[])
      .map((k) => [k, round((after[k] - before[k]) / per, per === 1 ? 2 : 4)] as const)
      .filter(([, v]) => v !== 0),
  );
}

// ── Warm path ────────────────────────────────────────────────────────────────────────────────────

type WarmPath = "lessor" | "pgbouncer" | "pg" | "noop" | "bare";

interface WarmMeasurement {
  path: WarmPath;
  query: QueryName;
  concurrency: number;
  requests: number;
  errors: number;
  errorSamples: string[];
  elapsedS: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  /** CPU milliseconds per request by process group (client: this process). */
  cpuMsPerRequest: CpuByGroup;
  /** The same, less each group's background rate with no load (see `idleRates`). */
  cpuMsPerRequestNet: CpuByGroup;
  /** Cores kept busy by everything else on the machine during the measurement. */
  otherCores: number;
}

/**
 * CPU seconds per wall second each group spends with no load at all: Postgres' autovacuum visits
 * every one of the fleet's databases, workerd runs the objects' alarms. A measurement's CPU per
 * request is reported raw and net of this background rate.
 */
async function idleRates(groups: ProcessGroups, ms: number): Promise<CpuByGroup> {
  const before = sampleCpu(groups);
  const begin = performance.now();
  await sleep(ms);
  const after = sampleCpu(groups);
  const seconds = (performance.now() - begin) / 1000;
  const rates = zeroCpu();
  for (const key of Object.keys(rates) as (keyof CpuByGroup)[])
    rates[key] = (after[key] - before[key]) / seconds;
  return rates;
}

async function measureGroup(
  groups: ProcessGroups,
  members: { path: WarmPath; query: QueryName; concurrency: number; call: Call }[],
  background: CpuByGroup,
): Promise<WarmMeasurement[]> {
  const merged = members.map(() => ({
    result: { concurrency: 0, completed: 0, errors: 0, errorSamples: [] as string[], elapsedMs: 0 },
    latencies: [] as number[],
    cpu: zeroCpu(),
  }));
  for (let r = 0; r < rounds; r++) {
    for (const [index, member] of members.entries()) {
      const into = merged[index];
      if (!into) continue;
      let before = zeroCpu();
      let after = zeroCpu();
      const slice: LoadResult = await runLoad(
        {
          concurrency: member.concurrency,
          warmupMs: r === 0 ? warmupMs : Math.min(warmupMs, 200),
          durationMs: durationMs / rounds,
          maxRequests: maxRequests / rounds,
          call: member.call,
        },
        {
          before: () => {
            before = sampleCpu(groups);
          },
          after: () => {
            after = sampleCpu(groups);
          },
        },
      );
      for (const key of Object.keys(into.cpu) as (keyof CpuByGroup)[])
        into.cpu[key] += after[key] - before[key];
      into.result.completed += slice.completed;
      into.result.errors += slice.errors;
      into.result.errorSamples.push(...slice.errorSamples.slice(0, 5 - into.result.errorSamples.length));
      into.result.elapsedMs += slice.elapsedMs;
      into.latencies.push(...slice.latenciesMs);
    }
  }
  return members.map((member, index) => {
    const into = merged[index];
    if (!into) throw new Error("lost a measurement");
    const elapsedS = into.result.elapsedMs / 1000;
    const perRequest = zeroCpu();
    const net = zeroCpu();
    let ours = 0;
    for (const key of Object.keys(into.cpu) as (keyof CpuByGroup)[]) {
      perRequest[key] = into.result.completed ? (into.cpu[key] * 1000) / into.result.completed : 0;
      const backgroundSeconds = key === "client" || key === "machine" ? 0 : background[key] * elapsedS;
      net[key] = into.result.completed
        ? (Math.max(0, into.cpu[key] - backgroundSeconds) * 1000) / into.result.completed
        : 0;
      if (key !== "machine") ours += into.cpu[key];
    }
    const measurement: WarmMeasurement = {
      path: member.path,
      query: member.query,
      concurrency: member.concurrency,
      requests: into.result.completed,
      errors: into.result.errors,
      errorSamples: into.result.errorSamples,
      elapsedS: round(elapsedS, 3),
      rps: round(into.result.completed / elapsedS, 1),
      p50Ms: round(percentile(into.latencies, 50), 3),
      p99Ms: round(percentile(into.latencies, 99), 3),
      cpuMsPerRequestNet: Object.fromEntries(
        Object.entries(net).map(([k, v]) => [k, round(v, 4)]),
      ) as CpuByGroup,
      cpuMsPerRequest: Object.fromEntries(
        Object.entries(perRequest).map(([k, v]) => [k, round(v, 4)]),
      ) as CpuByGroup,
      otherCores: round(Math.max(0, (into.cpu.machine - ours) / elapsedS), 2),
    };
    progress(
      `  ${`${member.path} ${member.query} c=${member.concurrency}`.padEnd(28)} ${num(measurement.rps).padStart(6)} req/s  p50 ${num(measurement.p50Ms, 2).padStart(8)} ms  p99 ${num(measurement.p99Ms, 2).padStart(8)} ms  others ${measurement.otherCores} cores${measurement.errors ? `  ${measurement.errors} ERRORS: ${measurement.errorSamples[0]}` : ""}`,
    );
    return measurement;
  });
}

async function warmPath(
  groups: ProcessGroups,
  warm: TenantCredentials,
  bouncer: RunningBouncer,
  baselineUrl: string,
  background: CpuByGroup,
): Promise<WarmMeasurement[]> {
  const all: WarmMeasurement[] = [];
  const floor = new pg.Pool({ connectionString: baselineUrl, max: poolSize, application_name: "bench:pg" });
  floor.on("error", () => undefined);
  running.pools.push(floor);
  for (const concurrency of concurrencies) {
    // The app side of PgBouncer: as many client connections as the load has workers.
    const viaBouncer = new pg.Pool({
      host: "127.0.0.1",
      port: bouncer.port,
      user: roleOf(warmTenantId),
      password: passwordOf(roleOf(warmTenantId)),
      database: databaseOf(warmTenantId),
      max: concurrency,
      application_name: "bench:pgbouncer",
    });
    viaBouncer.on("error", () => undefined);
    running.pools.push(viaBouncer);
    for (const query of queries) {
      all.push(
        ...(await measureGroup(
          groups,
          [
            { path: "lessor", query, concurrency, call: neonCall(warm, "lessor-direct", query) },
            { path: "pgbouncer", query, concurrency, call: pgCall(viaBouncer, query) },
            { path: "pg", query, concurrency, call: pgCall(floor, query) },
            ...(query === "select1"
              ? ([
                  { path: "noop", query, concurrency, call: neonCall(warm, "noop-direct", query) },
                  { path: "bare", query, concurrency, call: neonCall(warm, "bare-direct", query) },
                ] as const)
              : []),
          ],
          background,
        )),
      );
    }
    await viaBouncer.end().catch(() => undefined);
    running.pools.splice(running.pools.indexOf(viaBouncer), 1);
  }
  return all;
}

/** V8 profiles of the isolate while Lessor, the bare object and the floor each run alone (c=8). */
async function profiles(
  worker: Worker,
  warm: TenantCredentials,
  sourceMap: SourceMap | null,
): Promise<Record<string, Breakdown>> {
  const out: Record<string, Breakdown> = {};
  for (const path of ["lessor", "bare", "noop"] as const) {
    const run: { result: LoadResult | null } = { result: null };
    const profile = await profileWhile(`ws://127.0.0.1:${worker.inspectorPort}/ws`, async () => {
      run.result = await runLoad({
        concurrency: 8,
        warmupMs: 0,
        durationMs,
        maxRequests,
        call: neonCall(warm, `${path}-direct`, "select1"),
      });
    });
    if (!run.result || run.result.errors > 0)
      throw new Error(`profiling ${path}: ${run.result?.errorSamples.join(" | ")}`);
    writeFileSync(resolve(stateDir, `${path}-select1-c8.cpuprofile`), JSON.stringify(profile));
    out[path] = breakdown(profile, sourceMap, run.result.completed);
    progress(
      `  profile ${path}: ${run.result.completed} requests, ${num((out[path]?.busyMs ?? 0) / run.result.completed, 3)} sampled busy ms per request`,
    );
  }
  return out;
}

// ── Budget storm ─────────────────────────────────────────────────────────────────────────────────

interface BackendSample {
  atMs: number;
  total: number;
  lessor: number;
}

/**
 * Samples client backends on the host (never counting itself) every `everyMs` until stopped, and
 * remembers every backend pid it saw (how many backends a burst made in all, not only at once).
 */
function backendSampler(superuserUrl: string, everyMs: number) {
  const samples: BackendSample[] = [];
  const pids = new Set<number>();
  let failures = 0;
  let on = true;
  const begin = performance.now();
  const client = new pg.Client({ connectionString: superuserUrl });
  client.on("error", () => undefined);
  const done = (async () => {
    await client.connect();
    while (on) {
      try {
        const { rows } = await client.query<{ pid: number; application_name: string }>(
          `SELECT pid, application_name FROM pg_stat_activity
            WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`,
        );
        for (const row of rows) pids.add(row.pid);
        samples.push({
          atMs: Math.round(performance.now() - begin),
          total: rows.length,
          lessor: rows.filter((row) => row.application_name.startsWith("lessor:")).length,
        });
      } catch {
        failures++;
      }
      await sleep(everyMs);
    }
    await client.end().catch(() => undefined);
  })();
  return {
    samples,
    pids,
    failures: () => failures,
    stop: async () => {
      on = false;
      await done;
    },
  };
}

async function sessionsSoFar(superuserUrl: string): Promise<{ sessions: number; fatal: number }> {
  return asSuperuser(superuserUrl, async (client) => {
    const { rows } = await client.query<{ sessions: string; fatal: string }>(
      "SELECT coalesce(sum(sessions), 0) AS sessions, coalesce(sum(sessions_fatal), 0) AS fatal FROM pg_stat_database",
    );
    return { sessions: Number(rows[0]?.sessions ?? 0), fatal: Number(rows[0]?.fatal ?? 0) };
  });
}

interface StormResult {
  system: string;
  setup: string;
  requests: number;
  tenants: number;
  deadlineMs: number;
  succeeded: number;
  /** Every request answered correctly before the deadline. */
  allSucceeded: boolean;
  /** First send to the last correct answer, when every request succeeded. */
  drainMs: number | null;
  /** First send to the time half of the requests had succeeded. */
  halfMs: number | null;
  attempts: number;
  /** Failed attempts, by kind. */
  errorsByKind: Record<string, number>;
  /** Failed first attempts, by kind. */
  firstAttemptErrorsByKind: Record<string, number>;
  successLatencyMs: { p50: number; p99: number; max: number };
  backends: {
    samples: number;
    samplerFailures: number;
    maxTotal: number;
    maxLessor: number;
    /** Distinct backend pids seen by the sampler: backends made in all (a lower bound). */
    distinctSeen: number;
    /** Sessions Postgres counted (pg_stat_database.sessions; flushed lazily, so approximate). */
    sessionsStarted: number;
    /** Connection attempts Postgres refused, from its FATAL log lines, by message. */
    refusedByPostgres: Record<string, number>;
    /** One sample a second: [ms since the storm began, client backends]. */
    timeline: [number, number][];
  };
  cpuSeconds: Partial<CpuByGroup>;
  notes: string[];
}

/** Why a failed attempt failed, short and without numbers that vary. */
function kindOf(error: unknown): string {
  const code = (error as { code?: unknown }).code;
  const message = error instanceof Error ? error.message : String(error);
  const short = message.replace(/\d+/g, "N").replace(/\s+/g, " ").slice(0, 90);
  return typeof code === "string" ? `${code} ${short}` : short;
}

type Attempt = (
  tenant: string,
) => Promise<{ ok: true } | { ok: false; kind: string; retryAfterMs: number | null }>;

async function storm(
  system: string,
  setup: string,
  superuserUrl: string,
  groups: ProcessGroups,
  stack: RunningClusterStack,
  deadlineMs: number,
  attempt: Attempt,
): Promise<StormResult> {
  const sampler = backendSampler(superuserUrl, 100);
  await sleep(300);
  const requests = stormIds.flatMap((tenant) => Array.from({ length: stormPerTenant }, () => tenant));
  const errorsByKind: Record<string, number> = {};
  const firstAttemptErrorsByKind: Record<string, number> = {};
  const successAt: number[] = [];
  let attempts = 0;
  const sessions0 = await sessionsSoFar(superuserUrl);
  const fatal0 = await stack.fatalCounts();
  const cpuBefore = sampleCpu(groups);
  const begin = performance.now();
  const deadline = begin + deadlineMs;
  progress(`storm: ${system}: ${requests.length} concurrent first requests over ${stormIds.length} tenants`);
  let lastReport = begin;
  await Promise.all(
    requests.map(async (tenant) => {
      for (let n = 1; performance.now() < deadline; n++) {
        attempts++;
        let outcome: Awaited<ReturnType<Attempt>>;
        try {
          outcome = await attempt(tenant);
        } catch (error) {
          outcome = { ok: false, kind: kindOf(error), retryAfterMs: null };
        }
        if (outcome.ok) {
          successAt.push(performance.now() - begin);
          if (performance.now() - lastReport > 15_000) {
            lastReport = performance.now();
            progress(
              `  ${successAt.length} of ${requests.length} succeeded after ${num((lastReport - begin) / 1000)} s`,
            );
          }
          return;
        }
        errorsByKind[outcome.kind] = (errorsByKind[outcome.kind] ?? 0) + 1;
        if (n === 1)
          firstAttemptErrorsByKind[outcome.kind] = (firstAttemptErrorsByKind[outcome.kind] ?? 0) + 1;
        // The server's hint when it gives one; else one second. Jittered, so retries do not march in step.
        const wait = Math.min(outcome.retryAfterMs ?? 1_000, 10_000) * (1 + Math.random() * 0.5);
        await sleep(Math.max(0, Math.min(wait, deadline - performance.now())));
      }
    }),
  );
  const wall = performance.now() - begin;
  const cpuAfter = sampleCpu(groups);
  await sampler.stop();
  // pg_stat_database is flushed lazily: give it a moment.
  await sleep(1_500);
  const sessions1 = await sessionsSoFar(superuserUrl);
  const fatal1 = await stack.fatalCounts();
  const refusedByPostgres: Record<string, number> = {};
  for (const [kind, count] of Object.entries(fatal1)) {
    const delta = count - (fatal0[kind] ?? 0);
    if (delta > 0) refusedByPostgres[kind] = delta;
  }
  const sorted = [...successAt].sort((a, b) => a - b);
  const all = successAt.length === requests.length;
  const timeline: [number, number][] = [];
  let nextAt = 0;
  for (const sample of sampler.samples) {
    if (sample.atMs >= nextAt) {
      timeline.push([sample.atMs, sample.total]);
      nextAt = sample.atMs + 1_000;
    }
  }
  const result: StormResult = {
    system,
    setup,
    requests: requests.length,
    tenants: stormIds.length,
    deadlineMs,
    succeeded: successAt.length,
    allSucceeded: all,
    drainMs: all ? Math.round(rank(sorted, 100)) : null,
    halfMs:
      sorted.length >= requests.length / 2
        ? Math.round(sorted[Math.ceil(requests.length / 2) - 1] ?? 0)
        : null,
    attempts,
    errorsByKind,
    firstAttemptErrorsByKind,
    successLatencyMs: {
      p50: Math.round(rank(sorted, 50)),
      p99: Math.round(rank(sorted, 99)),
      max: Math.round(rank(sorted, 100)),
    },
    backends: {
      samples: sampler.samples.length,
      samplerFailures: sampler.failures(),
      maxTotal: Math.max(0, ...sampler.samples.map((s) => s.total)),
      maxLessor: Math.max(0, ...sampler.samples.map((s) => s.lessor)),
      distinctSeen: sampler.pids.size,
      sessionsStarted: sessions1.sessions - sessions0.sessions,
      refusedByPostgres,
      timeline,
    },
    cpuSeconds: cpuDelta(cpuBefore, cpuAfter),
    notes: [],
  };
  progress(
    `  ${system}: ${result.succeeded}/${result.requests} succeeded in ${num(wall / 1000, 1)} s (drain ${result.drainMs === null ? "not within the deadline" : `${num(result.drainMs / 1000, 1)} s`}), ${attempts} attempts, max backends ${result.backends.maxTotal}, ${result.backends.distinctSeen} distinct; errors ${JSON.stringify(errorsByKind)}; Postgres refused ${JSON.stringify(refusedByPostgres)}`,
  );
  return result;
}

/** Lessor: `POST /sql` on a connection of its own; a refusal's code and Retry-After are kept. */
function lessorAttempt(base: string, keys: Map<string, string>): Attempt {
  return async (tenant) => {
    const key = keys.get(tenant);
    if (!key) throw new Error(`no key for ${tenant}`);
    const answer = await rawSql(base, { id: tenant, key }, "SELECT 1 AS n", [], true);
    if (isOne(answer)) return { ok: true } as const;
    const retryAfter = answer.retryAfter === null ? null : Number(answer.retryAfter) * 1000;
    return {
      ok: false,
      kind: answerKind(answer),
      retryAfterMs: retryAfter !== null && Number.isFinite(retryAfter) ? retryAfter : null,
    } as const;
  };
}

/** PgBouncer: a new client connection (the app's first request), `SELECT 1`, close. */
function bouncerAttempt(port: number, login: (tenant: string) => string = roleOf): Attempt {
  return async (tenant) => {
    const client = new pg.Client({
      host: "127.0.0.1",
      port,
      user: login(tenant),
      password: passwordOf(login(tenant)),
      database: databaseOf(tenant),
      connectionTimeoutMillis: 30_000,
      application_name: "bench:storm",
    });
    client.on("error", () => undefined);
    try {
      await client.connect();
      const { rows } = await client.query<{ n: number }>("SELECT 1 AS n");
      if (rows[0]?.n !== 1) return { ok: false, kind: "wrong answer", retryAfterMs: null } as const;
      return { ok: true } as const;
    } finally {
      await client.end().catch(() => undefined);
    }
  };
}

async function waitForNoBackends(superuserUrl: string, what: string): Promise<void> {
  const deadline = performance.now() + 60_000;
  for (;;) {
    const n = await asSuperuser(superuserUrl, async (client) => {
      const { rows } = await client.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
      );
      return rows[0]?.n ?? 0;
    });
    if (n === 0) return;
    if (performance.now() > deadline) throw new Error(`${what}: ${n} backends still open after 60 s`);
    await sleep(500);
  }
}

/** Waits (bounded) until the budget ledger holds nothing; pools still up after 90 s are drained. */
async function waitForEmptyLedger(base: string, adminKey: string): Promise<void> {
  const deadline = performance.now() + 150_000;
  let drained = false;
  for (;;) {
    const capacity = (await admin(base, adminKey, "/v1/capacity")) as {
      hosts: { allocated: number; reserved: number; draining: number; candidates: { tenantId: string }[] }[];
    };
    const held = capacity.hosts.reduce((n, h) => n + h.allocated + h.reserved + h.draining, 0);
    if (held === 0) return;
    if (performance.now() > deadline) throw new Error(`Lessor's ledger still holds ${held} connections`);
    if (!drained && performance.now() > deadline - 60_000) {
      drained = true;
      for (const host of capacity.hosts)
        for (const candidate of host.candidates)
          await admin(base, adminKey, `/v1/tenants/${candidate.tenantId}/drain`, {}).catch(() => undefined);
    }
    await sleep(1_000);
  }
}

// ── Idle fleet ───────────────────────────────────────────────────────────────────────────────────

interface IdleSample {
  atMs: number;
  held: Record<string, number>;
  bouncersOwnCount: Record<string, number>;
  workerdRssMiB: number;
  bouncerRssMiB: Record<string, number>;
  postgresPssMiB: number;
}

interface IdleSystem {
  name: string;
  idleTimeoutS: number;
  /** ms from the start of the phase (when sampling began). */
  touchStartMs: number;
  touchEndMs: number;
  touchErrors: number;
  /** CPU per first request by process group, over this system's touch. */
  cpuMsPerFirstRequest: Partial<CpuByGroup>;
  peak: number;
  /** Backends held 60 s and 120 s after this system's last touch. */
  at60s: number | null;
  at120s: number | null;
}

interface IdleResult {
  tenants: number;
  note: string;
  systems: IdleSystem[];
  /** Every 5 s from the start of the phase. */
  samples: IdleSample[];
}

async function idleFleet(
  worker: Worker,
  superuserUrl: string,
  groups: ProcessGroups,
  tenants: TenantCredentials[],
  bouncers: { name: string; bouncer: RunningBouncer; idleTimeoutS: number }[],
): Promise<IdleResult> {
  const ours = new Set(tenants.map((t) => databaseOf(t.id)));
  const samples: IdleSample[] = [];
  const begin = performance.now();
  let watchUntil = Number.POSITIVE_INFINITY;
  const sampler = new pg.Client({ connectionString: superuserUrl });
  sampler.on("error", () => undefined);
  await sampler.connect();
  const sampling = (async () => {
    while (performance.now() - begin <= watchUntil) {
      const { rows } = await sampler.query<{
        datname: string;
        application_name: string;
        client_port: number;
      }>(
        `SELECT datname, application_name, client_port FROM pg_stat_activity
          WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`,
      );
      const fleetRows = rows.filter((row) => ours.has(row.datname));
      const sample: IdleSample = {
        atMs: Math.round(performance.now() - begin),
        held: { lessor: fleetRows.filter((row) => row.application_name.startsWith("lessor:")).length },
        bouncersOwnCount: {},
        workerdRssMiB: round(rssMiB(worker.layout.groups.workerdWorker[0] ?? -1), 1),
        bouncerRssMiB: {},
        postgresPssMiB: round(pssMiB(groups.postgres, true), 1),
      };
      for (const { name, bouncer } of bouncers) {
        const ports = connectedLocalPorts(bouncer.pid);
        sample.held[name] = fleetRows.filter((row) => ports.has(row.client_port)).length;
        sample.bouncerRssMiB[name] = round(rssMiB(bouncer.pid), 1);
        const servers = await bouncer.admin("SHOW SERVERS");
        sample.bouncersOwnCount[name] = servers.filter((s) => ours.has(String(s.database))).length;
      }
      samples.push(sample);
      if (samples.length % 6 === 1) {
        progress(
          `  t=${num(sample.atMs / 1000)} s: backends held: ${Object.entries(sample.held)
            .map(([k, v]) => `${k} ${v}`)
            .join(", ")}`,
        );
      }
      await sleep(Math.max(0, 5_000 * samples.length - (performance.now() - begin)));
    }
  })();

  const systems: IdleSystem[] = [];
  const touch = async (
    name: string,
    idleTimeoutS: number,
    one: (tenant: TenantCredentials) => Promise<boolean>,
  ) => {
    const touchStartMs = performance.now() - begin;
    const before = sampleCpu(groups);
    let errors = 0;
    await inParallel(tenants, 8, async (tenant) => {
      if (!(await one(tenant).catch(() => false))) errors++;
    });
    const after = sampleCpu(groups);
    const touchEndMs = performance.now() - begin;
    systems.push({
      name,
      idleTimeoutS,
      touchStartMs: Math.round(touchStartMs),
      touchEndMs: Math.round(touchEndMs),
      touchErrors: errors,
      cpuMsPerFirstRequest: cpuDelta(before, after, tenants.length / 1000),
      peak: 0,
      at60s: null,
      at120s: null,
    });
    progress(
      `  ${name}: ${tenants.length} tenants touched in ${num((touchEndMs - touchStartMs) / 1000, 1)} s, ${errors} errors`,
    );
  };
  // One system at a time, so each one's CPU per first request is its own; the idle clocks of
  // the systems touched first keep running meanwhile, and each is read from its own last touch.
  progress(
    `idle fleet: touching ${tenants.length} tenants once through each system, one system after the other`,
  );
  for (const { name, bouncer, idleTimeoutS } of bouncers) {
    await touch(name, idleTimeoutS, async (tenant) => (await bouncerAttempt(bouncer.port)(tenant.id)).ok);
  }
  await touch("lessor", lessorIdleTimeoutMs / 1000, async (tenant) =>
    isOne(await rawSql(worker.direct, tenant, "SELECT 1 AS n", [], true)),
  );
  watchUntil = Math.max(...systems.map((s) => s.touchEndMs)) + idleWatchMs;
  await sampling;
  await sampler.end().catch(() => undefined);
  for (const system of systems) {
    const pick = (s: IdleSample) => s.held[system.name] ?? 0;
    const at = (ms: number) => {
      const sample = samples.find((s) => s.atMs >= system.touchEndMs + ms);
      return sample ? pick(sample) : null;
    };
    system.peak = Math.max(0, ...samples.map(pick));
    system.at60s = at(60_000);
    system.at120s = at(120_000);
  }
  return {
    tenants: tenants.length,
    note: "backends of the fleet's databases held by each system, from pg_stat_activity every 5 s: Lessor's by application_name lessor:*, each PgBouncer's by the client ports of its own sockets",
    systems,
    samples,
  };
}

// ── PgBouncer configs ────────────────────────────────────────────────────────────────────────────

const commonSettings = {
  pool_mode: "transaction",
  default_pool_size: poolSize,
  max_db_connections: poolSize,
  // Raised from the default 100, as anyone serving this many clients does: otherwise a storm would
  // measure PgBouncer refusing clients, not Postgres refusing PgBouncer.
  max_client_conn: 5_000,
  server_idle_timeout: 600,
  server_login_retry: 15,
  query_wait_timeout: 120,
};

/** As database-per-tenant is usually set up: a pool per tenant database, each tenant its own login. */
function perTenantConfig(
  dir: string,
  port: number,
  serverPort: number,
  tenants: string[],
  settings: Record<string, string | number>,
): BouncerConfig {
  return {
    dir,
    port,
    serverHost: "127.0.0.1",
    serverPort,
    databases: tenants.map((t) => ({ name: databaseOf(t), dbname: databaseOf(t) })),
    users: tenants.map((t) => ({ name: roleOf(t), password: passwordOf(roleOf(t)) })),
    adminUser: { name: "pgb_admin", password: passwordOf("pgb_admin") },
    settings: { ...commonSettings, auth_type: "scram-sha-256", ...settings },
  };
}

/**
 * Per-tenant client logins, every pool logging in to Postgres as one shared role, capped with
 * `max_user_connections`. In 1.18 each database's forced user is its own user object, so the cap
 * counts per database and never totals (the bench shows it).
 */
function forcedSharedConfig(dir: string, port: number, serverPort: number, tenants: string[]): BouncerConfig {
  const shared = { name: sharedRole, password: passwordOf(sharedRole) };
  return {
    dir,
    port,
    serverHost: "127.0.0.1",
    serverPort,
    databases: tenants.map((t) => ({ name: databaseOf(t), dbname: databaseOf(t), user: shared })),
    users: tenants.map((t) => ({ name: roleOf(t), password: passwordOf(roleOf(t)) })),
    adminUser: { name: "pgb_admin", password: passwordOf("pgb_admin") },
    // Each tenant's login may reach its own database only.
    hba: tenants.map((t) => `host ${databaseOf(t)} ${roleOf(t)} 127.0.0.1/32 scram-sha-256`),
    settings: { ...commonSettings, auth_type: "hba", max_user_connections: stormBudget.connections },
  };
}

/**
 * The total cap 1.18 does enforce: every tenant logs in as one shared role, and
 * `max_user_connections` caps that role across all databases (idle connections of other pools are
 * closed to make room). The price: one password opens every tenant's database.
 */
function oneLoginConfig(dir: string, port: number, serverPort: number, tenants: string[]): BouncerConfig {
  return {
    dir,
    port,
    serverHost: "127.0.0.1",
    serverPort,
    databases: tenants.map((t) => ({ name: databaseOf(t), dbname: databaseOf(t) })),
    users: [{ name: sharedRole, password: passwordOf(sharedRole) }],
    adminUser: { name: "pgb_admin", password: passwordOf("pgb_admin") },
    settings: {
      ...commonSettings,
      auth_type: "scram-sha-256",
      max_user_connections: stormBudget.connections,
    },
  };
}

// ── Main ─────────────────────────────────────────────────────────────────────────────────────────

async function main(): Promise<number> {
  const startedAt = new Date();
  const loadAtStart = loadNow();
  mkdirSync(stateDir, { recursive: true });
  rmSync(persistDir, { recursive: true, force: true });
  const notes: string[] = [];

  const install = ensurePgBouncer(progress);
  progress(install.note);
  notes.push(install.note);

  const password = randomBytes(18).toString("base64url");
  progress(
    `starting Postgres (a control-plane cluster and the tenant host, max_connections ${roomyMaxConnections}) and the WebSocket proxy`,
  );
  const stack = await startClusterStack({
    password,
    persistent: false,
    controlPlane: {
      name: "control",
      dataDir: resolve(stateDir, "pg-control"),
      port: await freePort(),
      maxConnections: 400,
    },
    hosts: [
      {
        name: hostName,
        dataDir: resolve(stateDir, "pg-host"),
        port: await freePort(),
        maxConnections: roomyMaxConnections,
      },
    ],
  });
  running.stack = stack;
  const host = stack.info.hosts[0];
  if (!host) throw new Error("the stack has no host");
  const superuserUrl = host.superuserUrl;
  const postgresPids = () => {
    const pid = host.postmasterPid;
    return pid === null ? [] : [pid];
  };
  const serverVersion = await asSuperuser(
    superuserUrl,
    async (c) => (await c.query("SHOW server_version")).rows[0]?.server_version as string,
  );

  // PEERS_LESSOR_VARS: Lessor [vars] overridden for this run (JSON), to test a hypothesis; recorded.
  const vars = { ...wranglerVars(), ...lessorVarOverrides };
  const sealKey = randomBytes(32).toString("base64");
  const adminKey = `lak_peers_${randomBytes(24).toString("base64url")}`;
  const baselinePassword = randomBytes(18).toString("base64url");
  const keyMacKey = randomBytes(32).toString("base64");
  // The bare Durable Object's login on the warm tenant's database, known once it is provisioned.
  let baselineUrl = "";
  const envFor = (budget: { connections: number; reserve: number; adaptive?: unknown }) => ({
    ...vars,
    LESSOR_ADMIN_KEY: adminKey,
    LESSOR_SEAL_KEY: sealKey,
    LESSOR_KEY_MAC_KEYS: keyMacKey,
    LESSOR_CONTROL_PLANE_URL: stack.info.controlPlaneUrl,
    LESSOR_HOSTS: JSON.stringify({ [hostName]: host.adminUrl }),
    LESSOR_BUDGETS: JSON.stringify({ [hostName]: budget }),
    LESSOR_IDLE_TIMEOUT_MS: String(lessorIdleTimeoutMs),
    LESSOR_WS_PROXY: stack.info.wsProxy,
    BENCH_DATABASE_URL: baselineUrl,
  });

  progress("bundling the bench Worker once (a snapshot of src/ as it is now)");
  const source = sourceRevision();
  const script = await buildWorker(resolve(stateDir, "build"));
  progress(
    `starting wrangler dev (budget ${JSON.stringify(roomyBudget)}, idle timeout ${lessorIdleTimeoutMs} ms)`,
  );
  let worker = await startWorker(script, envFor(roomyBudget));
  endpoints.set("lessor-direct", `${worker.direct}/sql`);
  endpoints.set("noop-direct", `${worker.direct}/bench/noop`);
  endpoints.set("bare-direct", `${worker.direct}/bench/bare`);

  progress(
    `provisioning ${fleetIds.length + 1} tenants through POST /v1/tenants (concurrency ${provisionConcurrency})`,
  );
  const provisionBegin = performance.now();
  const warm = await provision(worker.direct, adminKey, warmTenantId);
  const keys = new Map<string, string>();
  await inParallel(fleetIds, provisionConcurrency, async (id, index) => {
    const tenant = await provision(worker.direct, adminKey, id);
    keys.set(id, tenant.key);
    if ((index + 1) % 100 === 0) progress(`  ${index + 1} provisioned`);
  });
  const provisionS = (performance.now() - provisionBegin) / 1000;
  progress(`  ${fleetIds.length + 1} tenants in ${num(provisionS, 1)} s`);
  const fleet: TenantCredentials[] = fleetIds.map((id) => ({ id, key: keys.get(id) ?? "" }));
  for (const [id, name] of await tenantDatabaseNames(stack.info.controlPlaneUrl)) databaseNames.set(id, name);
  baselineUrl = `postgres://${bareRole}:${baselinePassword}@127.0.0.1:${host.port}/${databaseOf(warmTenantId)}`;
  // The bench Worker's bare object reads BENCH_DATABASE_URL from its environment: start it again
  // with the warm tenant's database in it. No pool is open yet (provisioning opens none).
  progress("restarting wrangler dev with the bare object's database URL");
  await stopWorker(worker);
  worker = await startWorker(script, envFor(roomyBudget));
  endpoints.set("lessor-direct", `${worker.direct}/sql`);
  endpoints.set("noop-direct", `${worker.direct}/bench/noop`);
  endpoints.set("bare-direct", `${worker.direct}/bench/bare`);

  progress(`creating bench_items (${tableRows} rows) in ${warmTenantId} and PgBouncer's login roles`);
  const setup = neonFor(warm, "lessor-direct");
  await setup.query(
    "CREATE TABLE bench_items (id integer PRIMARY KEY, label text NOT NULL, amount integer NOT NULL)",
  );
  await setup.query(
    "INSERT INTO bench_items SELECT g, 'item-' || g, (g * 7) % 1000 FROM generate_series(1, $1::int) AS g",
    [tableRows],
  );
  await setup.query("ANALYZE bench_items");
  const plan = (await setup.query(`EXPLAIN ${indexedQuery.replace("$1", "42")}`)) as {
    "QUERY PLAN"?: string;
  }[];
  if (!/Index/.test(plan.map((r) => r["QUERY PLAN"] ?? "").join(" ")))
    throw new Error("the indexed read does not use the index");
  await asSuperuser(superuserUrl, async (client) => {
    // Each tenant's PgBouncer login may reach its own database only, as Lessor's tenant role does.
    for (const tenant of [warmTenantId, ...fleetIds]) {
      const role = roleOf(tenant);
      await client.query(`CREATE ROLE ${role} LOGIN PASSWORD '${passwordOf(role)}'`);
      await client.query(`GRANT CONNECT ON DATABASE "${databaseOf(tenant)}" TO ${role}`);
    }
    await client.query(`CREATE ROLE ${sharedRole} LOGIN PASSWORD '${passwordOf(sharedRole)}'`);
    for (const tenant of stormIds)
      await client.query(`GRANT CONNECT ON DATABASE "${databaseOf(tenant)}" TO ${sharedRole}`);
    await client.query(`CREATE ROLE ${bareRole} LOGIN PASSWORD '${baselinePassword}'`);
    await client.query(`GRANT CONNECT ON DATABASE "${databaseOf(warmTenantId)}" TO ${bareRole}`);
    // Every tenant database has Lessor's login guard (an event trigger on login that refuses any
    // login of a non-admin role without a one-time token Lessor mints). PgBouncer has no such thing,
    // so its roles and the baselines' skip it: a superuser-set `event_triggers = off` on those roles
    // only. Lessor's own tenant roles still pass the guard on every login, as in production.
    for (const role of [...[warmTenantId, ...fleetIds].map(roleOf), sharedRole, bareRole])
      await client.query(`ALTER ROLE ${role} SET event_triggers = off`);
  });
  await asSuperuser(databaseUrl(superuserUrl, databaseOf(warmTenantId)), (client) =>
    client.query(`GRANT SELECT ON bench_items TO ${roleOf(warmTenantId)}, ${bareRole}`),
  );

  const bouncerDir = (name: string) => resolve(stateDir, `pgbouncer-${name}`);
  progress("starting PgBouncer (transaction mode, a pool per tenant database, default_pool_size 5)");
  const main600 = await startBouncer(
    install.path,
    perTenantConfig(bouncerDir("600"), await freePort(), host.port, [warmTenantId, ...fleetIds], {
      server_idle_timeout: bouncerIdleTimeouts[0],
    }),
  );
  running.bouncers.push(main600);
  const groupsFor = (bouncers: RunningBouncer[], w: Worker | null): ProcessGroups => ({
    pgbouncer: bouncers.map((b) => b.pid),
    workerdWorker: w?.layout.groups.workerdWorker ?? [],
    workerdProxy: w?.layout.groups.workerdProxy ?? [],
    wranglerNode: w?.layout.groups.wranglerNode ?? [],
    wsProxy: [stack.info.wsProxyPid],
    postgres: postgresPids(),
    controlPlane: stack.info.controlPlanePid === null ? [] : [stack.info.controlPlanePid],
  });

  // ── 1. Warm path ──
  progress(
    "warm path: Lessor /sql, Node pg → PgBouncer, Node pg → Postgres (and the no-database floor and bare DO)",
  );
  progress("background CPU with no load, 10 s (subtracted from the net CPU per request)");
  const background = await idleRates(groupsFor([main600], worker), 10_000);
  progress(
    `  ${Object.entries(background)
      .filter(([k]) => k !== "client" && k !== "machine")
      .map(([k, v]) => `${k} ${num(v * 1000, 1)} ms/s`)
      .join(", ")}`,
  );
  const warmMeasurements = phases.has("warm")
    ? await warmPath(groupsFor([main600], worker), warm, main600, baselineUrl, background)
    : [];
  const mapPath = `${script}.map`;
  let isolateProfiles: Record<string, Breakdown> = {};
  if (phases.has("warm")) {
    progress("profiles of the Worker's isolate (SELECT 1, c=8; not part of the throughput numbers)");
    isolateProfiles = await profiles(worker, warm, existsSync(mapPath) ? new SourceMap(mapPath) : null);
  }

  // ── 3. Idle fleet (before the storm: it needs the roomy Postgres) ──
  const second = await startBouncer(
    install.path,
    perTenantConfig(bouncerDir("60"), await freePort(), host.port, [warmTenantId, ...fleetIds], {
      server_idle_timeout: bouncerIdleTimeouts[1],
    }),
  );
  running.bouncers.push(second);
  const idle = !phases.has("idle")
    ? null
    : await idleFleet(worker, superuserUrl, groupsFor([main600, second], worker), fleet, [
        {
          name: `pgbouncer, server_idle_timeout ${bouncerIdleTimeouts[0]} s`,
          bouncer: main600,
          idleTimeoutS: bouncerIdleTimeouts[0],
        },
        {
          name: `pgbouncer, server_idle_timeout ${bouncerIdleTimeouts[1]} s`,
          bouncer: second,
          idleTimeoutS: bouncerIdleTimeouts[1],
        },
      ]);
  // Every pool must have stopped by its idle timeout before wrangler stops: a pool that dies with
  // workerd stays in the BudgetObject's ledger until its object is next woken or the cron reconciles.
  await waitForEmptyLedger(worker.direct, adminKey);
  for (const b of [main600, second]) await b.stop();
  running.bouncers.length = 0;
  await stopWorker(worker);
  await waitForNoBackends(superuserUrl, "after the idle phase");

  // ── 2. Budget storm ──
  const storms: StormResult[] = [];
  const stormPhase = async (): Promise<void> => {
    progress(`restarting the tenant host with max_connections ${stormMaxConnections}`);
    host.postmasterPid = await stack.restartHost(hostName, stormMaxConnections);
    progress(`starting wrangler dev with a host budget of ${JSON.stringify(stormBudget)}`);
    worker = await startWorker(
      script,
      envFor(stormAdaptive === false ? stormBudget : { ...stormBudget, adaptive: stormAdaptive }),
    );
    const before = (await admin(worker.direct, adminKey, "/v1/capacity")) as {
      hosts: { allocated: number; reserved: number; draining: number; poolCapacity: number }[];
    };
    const ledger = before.hosts[0];
    if (
      !ledger ||
      ledger.allocated + ledger.reserved + ledger.draining !== 0 ||
      ledger.poolCapacity !== stormBudget.connections - stormBudget.reserve
    )
      throw new Error(`the budget is not empty before the storm: ${JSON.stringify(before)}`);
    // What the Worker logged during the storm, by event (and reason or code): why starts failed.
    const workerEvents: Record<string, number> = {};
    const countEvents = (chunk: Buffer) => {
      for (const match of chunk.toString().matchAll(/\{"level":"\w+","event":"([a-z_]+)"[^\n]*/g)) {
        const line = match[0];
        const detail = /"(?:reason|code)":"([a-z_]+)"/.exec(line)?.[1];
        const key = detail ? `${match[1]}: ${detail}` : (match[1] ?? "?");
        workerEvents[key] = (workerEvents[key] ?? 0) + 1;
      }
    };
    worker.wrangler.child.stdout?.on("data", countEvents);
    worker.wrangler.child.stderr?.on("data", countEvents);
    const lessorStorm = await storm(
      "lessor",
      `host budget ${stormBudget.connections}, reserve ${stormBudget.reserve} (pools of ${poolSize}: ${stormBudget.connections / poolSize} at once${stormAdaptive === false ? "" : `; adaptive admission ${JSON.stringify(stormAdaptive)}, tiers ${vars.LESSOR_POOL_SIZES}`}), admission wait ${vars.LESSOR_ADMISSION_WAIT_MS ?? "2000"} ms, idle timeout ${lessorIdleTimeoutMs} ms`,
      superuserUrl,
      groupsFor([], worker),
      stack,
      stormDeadlineMs,
      lessorAttempt(worker.direct, keys),
    );
    worker.wrangler.child.stdout?.off("data", countEvents);
    worker.wrangler.child.stderr?.off("data", countEvents);
    lessorStorm.notes.push(`Worker log events during the storm: ${JSON.stringify(workerEvents)}`);
    // The Worker may still be working through requests whose clients gave up: ask, bounded.
    const capacityAfterStorm = await within(
      admin(worker.direct, adminKey, "/v1/capacity") as Promise<{
        hosts: { evictions: number; saturations: number }[];
      }>,
      120_000,
      "GET /v1/capacity after the storm",
    ).catch((error: unknown) => {
      lessorStorm.notes.push(
        `GET /v1/capacity after the storm: ${error instanceof Error ? error.message : String(error)}`,
      );
      return null;
    });
    if (capacityAfterStorm)
      lessorStorm.notes.push(
        `BudgetObject counters after the storm: ${capacityAfterStorm.hosts[0]?.evictions ?? "?"} evictions, ${capacityAfterStorm.hosts[0]?.saturations ?? "?"} saturations (refused admissions)`,
      );
    storms.push(lessorStorm);
    await stopWorker(worker);
    await waitForNoBackends(superuserUrl, "after Lessor's storm");

    const bouncerStorm = async (
      name: string,
      system: string,
      setup: string,
      config: BouncerConfig,
      deadlineMs: number,
      login?: (tenant: string) => string,
    ): Promise<StormResult> => {
      const bouncer = await startBouncer(install.path, config);
      running.bouncers.push(bouncer);
      try {
        const result = await storm(
          system,
          setup,
          superuserUrl,
          groupsFor([bouncer], null),
          stack,
          deadlineMs,
          bouncerAttempt(bouncer.port, login),
        );
        // Isolation check: may tenant a's login reach tenant b's database?
        const [a, b] = stormIds;
        let crossTenant = "not checked";
        if (a && b) {
          const who = (login ?? roleOf)(a);
          const client = new pg.Client({
            host: "127.0.0.1",
            port: bouncer.port,
            user: who,
            password: passwordOf(who),
            database: databaseOf(b),
          });
          client.on("error", () => undefined);
          try {
            await client.connect();
            await client.query("SELECT 1");
            crossTenant = `ALLOWED: the login ${who} reached ${databaseOf(b)}`;
          } catch (error) {
            crossTenant = `refused (${kindOf(error)})`;
          } finally {
            await client.end().catch(() => undefined);
          }
        }
        progress(`  ${name}: may tenant ${a}'s login reach tenant ${b}'s database? ${crossTenant}`);
        result.notes.push(`cross-tenant login through this config: ${crossTenant}`);
        return result;
      } finally {
        await bouncer.stop();
        running.bouncers.splice(running.bouncers.indexOf(bouncer), 1);
        await waitForNoBackends(superuserUrl, `after ${name}`);
      }
    };
    if (!stormSystems.has("pgbouncer")) return;
    storms.push(
      await bouncerStorm(
        "per-tenant",
        "pgbouncer, a login per tenant",
        `default_pool_size ${poolSize}, max_db_connections ${poolSize}; no total cap (nothing in 1.18 caps pools of different users); server_idle_timeout 600 s, server_login_retry 15 s, query_wait_timeout 120 s`,
        perTenantConfig(bouncerDir("storm-per-tenant"), await freePort(), host.port, stormIds, {}),
        stormDeadlineMs,
      ),
    );
    storms.push(
      await bouncerStorm(
        "forced-shared",
        "pgbouncer, a login per tenant, one forced server role, max_user_connections 50",
        `as above, but every [databases] entry logs in to Postgres as ${sharedRole} (user=/password=), auth_type hba (each tenant's login to its own database only), max_user_connections ${stormBudget.connections}; deadline shortened to ${forcedSharedDeadlineMs / 1000} s: the point is whether the cap holds`,
        forcedSharedConfig(bouncerDir("storm-forced"), await freePort(), host.port, stormIds),
        forcedSharedDeadlineMs,
      ),
    );
    storms.push(
      await bouncerStorm(
        "one-login",
        "pgbouncer, one login for every tenant, max_user_connections 50",
        `every client logs in as ${sharedRole}; max_user_connections ${stormBudget.connections} caps that role across all databases (idle connections of other pools are closed to make room); server_idle_timeout 600 s`,
        oneLoginConfig(bouncerDir("storm-one-login"), await freePort(), host.port, stormIds),
        stormDeadlineMs,
        () => sharedRole,
      ),
    );
  };
  // A storm that breaks the run (a process that stops answering) must not lose what was measured.
  let stormFailure: string | null = null;
  if (phases.has("storm")) {
    await stormPhase().catch((error: unknown) => {
      stormFailure = error instanceof Error ? (error.stack ?? error.message) : String(error);
      progress(`the storm phase failed: ${stormFailure}`);
    });
  }

  await cleanup();
  const finishedAt = new Date();

  const errors =
    warmMeasurements.reduce((n, m) => n + m.errors, 0) +
    (idle?.systems.reduce((n, sys) => n + sys.touchErrors, 0) ?? 0) +
    (stormFailure ? 1 : 0);
  const date = startedAt.toISOString().slice(0, 10);
  const results = {
    benchmark: "peers",
    date,
    startedAt: startedAt.toISOString(),
    finishedAt: finishedAt.toISOString(),
    durationS: Math.round((finishedAt.getTime() - startedAt.getTime()) / 1000),
    command: "npm run bench:peers",
    machine: { ...machineFacts(), loadavgAtStart: loadAtStart, loadavgAtEnd: loadNow() },
    loadNote:
      "other engineers' test suites share this 2-core machine; the load averages above and `otherCores` in each warm measurement say how much",
    versions: {
      node: process.version,
      postgres: serverVersion,
      pgbouncer: install.version,
      wrangler: packageVersion("wrangler"),
      workerd: packageVersion("workerd"),
      "@neondatabase/serverless": packageVersion("@neondatabase/serverless"),
      pg: packageVersion("pg"),
    },
    pgbouncerInstall: install,
    source,
    settings: {
      warmupMs,
      durationMs,
      rounds,
      concurrencies,
      poolSize,
      idleTenants: idleTenantCount,
      stormTenants: stormTenantCount,
      stormRequests: stormTenantCount * stormPerTenant,
      stormMaxConnections,
      stormBudget,
      stormDeadlineMs,
      roomyMaxConnections,
      roomyBudget,
      lessorIdleTimeoutMs,
      bouncerIdleTimeoutsS: bouncerIdleTimeouts,
      provisionConcurrency,
      phases: [...phases],
      stormSystems: [...stormSystems],
      lessorVarOverrides,
    },
    provisioning: { tenants: fleetIds.length + 1, seconds: round(provisionS, 1) },
    backgroundCpuSecondsPerSecond: Object.fromEntries(
      Object.entries(background).map(([k, v]) => [k, round(v, 4)]),
    ),
    warm: warmMeasurements,
    profiles: isolateProfiles,
    idle,
    storms,
    stormFailure,
    notes,
    errors,
  };
  const resultsDir = resolve(root, "bench/results");
  mkdirSync(resultsDir, { recursive: true });
  // A run of some phases only (PEERS_PHASES) must not replace the day's full run.
  const partial = ["warm", "idle", "storm"].filter((p) => phases.has(p));
  const variant = [
    ...(partial.length === 3 ? [] : partial),
    ...(stormSystems.has("pgbouncer") ? [] : ["lessor-only"]),
    ...(stormAdaptive === false ? [] : ["adaptive"]),
    ...Object.entries(lessorVarOverrides).map(([k, v]) => `${k.replace(/^LESSOR_/, "").toLowerCase()}-${v}`),
  ].map((part) =>
    part
      .replace(/[^A-Za-z0-9._-]+/g, "_")
      .replace(/^_+|_+$/g, "")
      .slice(0, 60),
  );
  const file = resolve(
    resultsDir,
    `peers-${date}${variant.length === 0 ? "" : `-${variant.join("-")}`}.json`,
  );
  writeFileSync(file, `${JSON.stringify(results, null, 2)}\n`);
  console.log(report(results));
  progress(`wrote ${file}`);
  if (errors > 0) {
    console.error(`bench:peers: ${errors} error(s) or wrong answer(s) in the warm path or the idle touch`);
    return 1;
  }
  return 0;
}

// ── Report ───────────────────────────────────────────────────────────────────────────────────────

interface Results {
  warm: WarmMeasurement[];
  profiles: Record<string, Breakdown>;
  idle: IdleResult | null;
  storms: StormResult[];
  machine: { loadavgAtStart: number[]; loadavgAtEnd: number[]; cores: number; cpuModel: string };
  versions: Record<string, string>;
}

function report(r: Results): string {
  const find = (path: WarmPath, query: QueryName, c: number) =>
    r.warm.find((m) => m.path === path && m.query === query && m.concurrency === c);
  const proxyCpu = (m: WarmMeasurement | undefined, path: "lessor" | "pgbouncer") => {
    if (!m) return null;
    const c = m.cpuMsPerRequestNet;
    return path === "lessor" ? c.workerdWorker + c.workerdProxy + c.wranglerNode + c.wsProxy : c.pgbouncer;
  };
  const warmRows: string[][] = [];
  for (const query of queries) {
    for (const c of concurrencies) {
      const lessor = find("lessor", query, c);
      const bouncer = find("pgbouncer", query, c);
      const floor = find("pg", query, c);
      const cell = (m: WarmMeasurement | undefined) =>
        m ? `${num(m.rps)} (${num(m.p50Ms, 2)} / ${num(m.p99Ms, 1)})` : "–";
      const lessorCpu = proxyCpu(lessor, "lessor");
      const bouncerCpu = proxyCpu(bouncer, "pgbouncer");
      warmRows.push([
        query === "select1" ? "SELECT 1" : "indexed read",
        String(c),
        cell(lessor),
        cell(bouncer),
        cell(floor),
        lessor && bouncer ? num(bouncer.rps / lessor.rps, 1) : "–",
        `${num(lessorCpu, 2)} / ${num(bouncerCpu, 3)}`,
        lessorCpu && bouncerCpu ? num(lessorCpu / bouncerCpu, 0) : "–",
        num(Math.max(lessor?.otherCores ?? 0, bouncer?.otherCores ?? 0), 2),
      ]);
    }
  }
  const parts: string[][] = [];
  for (const c of concurrencies) {
    for (const path of ["noop", "bare", "lessor", "pgbouncer"] as const) {
      const m = find(path, "select1", c);
      if (!m) continue;
      const u = m.cpuMsPerRequestNet;
      parts.push([
        path,
        String(c),
        num(u.client, 3),
        num(u.workerdWorker, 3),
        num(u.wsProxy, 3),
        num(u.pgbouncer, 3),
        num(u.postgres, 3),
        num(u.controlPlane, 3),
        num(u.workerdProxy + u.wranglerNode, 3),
      ]);
    }
  }
  const lessorProfile = r.profiles.lessor;
  const lessor8 = find("lessor", "select1", 8);
  const profileRows = lessorProfile
    ? Object.entries(lessorProfile.shares).map(([part, share]) => [
        part,
        `${num(share * 100, 1)} %`,
        lessor8 ? num(share * lessor8.cpuMsPerRequestNet.workerdWorker, 3) : "–",
      ])
    : [];
  const kinds = (counts: Record<string, number>) =>
    Object.entries(counts)
      .sort((a, b) => b[1] - a[1])
      .map(([k, v]) => `${v}× ${k}`)
      .join("; ") || "none";
  const stormRows = r.storms.map((s) => [
    s.system,
    String(s.backends.maxTotal),
    String(s.backends.distinctSeen),
    `${s.succeeded} / ${s.requests}`,
    s.drainMs === null ? `not within ${num(s.deadlineMs / 1000)} s` : `${num(s.drainMs / 1000, 1)} s`,
    String(s.attempts),
    kinds(s.errorsByKind),
    kinds(s.backends.refusedByPostgres),
  ]);
  const idleRows = (r.idle?.systems ?? []).map((sys) => [
    sys.name,
    `${num(sys.idleTimeoutS)} s`,
    `${num((sys.touchEndMs - sys.touchStartMs) / 1000, 1)} s`,
    String(sys.peak),
    num(sys.at60s),
    num(sys.at120s),
    num((sys.cpuMsPerFirstRequest.workerdWorker ?? 0) + (sys.cpuMsPerFirstRequest.pgbouncer ?? 0), 2),
    num(sys.cpuMsPerFirstRequest.postgres, 2),
  ]);
  return [
    `# Lessor vs PgBouncer ${r.versions.pgbouncer}, ${new Date().toISOString().slice(0, 10)}`,
    "",
    `${r.machine.cores} cores (${r.machine.cpuModel}); load average at start ${r.machine.loadavgAtStart.join(" ")}, at end ${r.machine.loadavgAtEnd.join(" ")}`,
    "",
    "## Warm path: req/s (p50 / p99 ms); net CPU ms per request of the proxy (Lessor: workerd + WebSocket proxy; PgBouncer: pgbouncer)",
    "",
    mdTable(
      [
        "query",
        "c",
        "Lessor /sql",
        "pg → PgBouncer",
        "pg → Postgres (floor)",
        "PgBouncer ÷ Lessor (req/s)",
        "proxy CPU ms: Lessor / PgBouncer",
        "CPU ratio",
        "other cores busy",
      ],
      warmRows,
    ),
    "",
    "## CPU ms per request by process (SELECT 1), net of each process's background rate with no load",
    "",
    mdTable(
      [
        "path",
        "c",
        "client",
        "workerd (Worker + object)",
        "ws proxy",
        "pgbouncer",
        "tenant Postgres",
        "control-plane Postgres",
        "wrangler dev proxy",
      ],
      parts,
    ),
    "",
    "## Lessor's isolate, by part (profile shares at c=8, applied to workerd's CPU per request at c=8)",
    "",
    mdTable(["part", "share of busy isolate time", "ms per request"], profileRows),
    "",
    "## Budget storm",
    "",
    mdTable(
      [
        "system",
        "max backends at once",
        "backends seen in all",
        "succeeded",
        "drained",
        "attempts",
        "failed attempts by kind",
        "refused by Postgres (its log)",
      ],
      stormRows,
    ),
    "",
    `## Idle fleet: backends held after touching ${r.idle?.tenants ?? 0} tenants once`,
    "",
    mdTable(
      [
        "system",
        "idle timeout",
        "touch took",
        "peak",
        "60 s after its last touch",
        "120 s after",
        "proxy CPU ms per first request",
        "Postgres CPU ms per first request",
      ],
      idleRows,
    ),
    "",
  ].join("\n");
}

const code = await main().catch(async (error: unknown) => {
  console.error(error instanceof Error ? (error.stack ?? error.message) : error);
  await cleanup();
  return 1;
});
await within(cleanup(), 60_000, "cleanup").catch(() => undefined);
process.exit(code);
