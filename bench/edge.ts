/**
 * `npm run bench:edge`: what forged credentials cost now (issue 12, items 1 and 2, re-measured).
 *
 * Issue 12 measured, before tenant keys carried a MAC: 200 concurrent requests with random tenant
 * ids delayed a real tenant's cold start from about 130 ms to 10.2 s (each forged id reached a
 * TenantObject, which opened a control-plane connection to learn the tenant did not exist), and a
 * wrong key for an existing tenant was answered in a median of 11 ms against 74 ms for an unknown
 * tenant. This run measures both on the code as it is:
 *
 * 1. Cold start under a forged flood. A freshly provisioned tenant's first `/sql` (its pool's
 *    start), alone, and sent together with a burst of 200 concurrent requests with random,
 *    well-formed tenant ids and keys (each on a new HTTP connection). Trials of the two alternate.
 *    Reported: median and p99 of the real cold start each way, the flood's answers, and what the
 *    flood opened: WebSocket-proxy tunnels (every connection Lessor opens to any Postgres, control
 *    plane or host, is one), Postgres FATAL lines ("too many connections"), and TenantObject
 *    storage files, also measured for floods with no real request at all.
 * 2. Wrong key vs unknown tenant. One request at a time on a kept-alive connection, in a shuffled
 *    order: a forged key for an existing tenant, a forged key for a tenant that was never
 *    provisioned, and another tenant's genuine key. Medians, and whether status and body are equal.
 *
 * Results: bench/results/edge-<date>.json and markdown on stdout. See bench/README.md.
 */
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { writeEnvFile } from "../local/stack.ts";
import { type RunningClusterStack, startClusterStack } from "./cluster-stack.ts";
import {
  answerKind,
  inParallel,
  isOne,
  loadNow,
  machineFacts,
  mdTable,
  num,
  packageVersion,
  progress,
  provision,
  type RawAnswer,
  rawSql,
  round,
  setting,
  sleep,
  sourceRevision,
  stopOnExit,
  type TenantCredentials,
  wranglerVars,
} from "./harness.ts";
import { percentile } from "./load.ts";
import {
  buildWorker,
  findWranglerLayout,
  freePort,
  type RunningWrangler,
  root,
  startWrangler,
} from "./processes.ts";

// ── Settings ─────────────────────────────────────────────────────────────────────────────────────

const trials = setting("EDGE_TRIALS", 20, 3, 50);
const floodSize = setting("EDGE_FLOOD", 200, 10, 1_000);
const floodAloneTrials = 3;
const timingRequests = setting("EDGE_TIMING_REQUESTS", 40, 10, 400);
/** Existing tenants the wrong keys are spread over: the failed-login limit is 20 per 10 s per id. */
const timingTenants = 8;
const hostName = "pg";
const budget = { connections: 400, reserve: 4 };

const stateDir = resolve(root, ".lessor/bench-edge");
const envFile = resolve(stateDir, "wrangler.vars");
const persistDir = resolve(stateDir, "wrangler");

const running: { stack: RunningClusterStack | null; wrangler: RunningWrangler | null } = {
  stack: null,
  wrangler: null,
};

const cleanup = stopOnExit("bench:edge", envFile, running);

// ── Forged credentials ───────────────────────────────────────────────────────────────────────────

/** A well-formed tenant id that was never provisioned. */
function randomTenantId(): string {
  return `x${randomBytes(10).toString("hex")}`;
}

/**
 * A key of the right shape (`lsk_`, 48 bytes, format 1, MAC key index 1) with a random MAC: it
 * takes the whole edge check, as a guess does.
 */
function forgedKey(): string {
  const bytes = randomBytes(48);
  bytes[0] = 1;
  bytes[1] = 1;
  return `lsk_${bytes.toString("base64url")}`;
}

/** TenantObject storage files in the local persistence folder (one per object that wrote storage). */
function tenantObjectFiles(): number {
  let count = 0;
  const walk = (dir: string, inTenantObjects: boolean) => {
    if (!existsSync(dir)) return;
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const path = resolve(dir, entry.name);
      if (entry.isDirectory()) walk(path, inTenantObjects || entry.name.includes("TenantObject"));
      else if (inTenantObjects && entry.name.endsWith(".sqlite")) count++;
    }
  };
  walk(persistDir, false);
  return count;
}

function totalTunnels(tunnels: Record<string, number>): number {
  return Object.values(tunnels).reduce((sum, n) => sum + n, 0);
}

function median(values: readonly number[]): number {
  return percentile(values, 50);
}

function p99(values: readonly number[]): number {
  return percentile(values, 99);
}

function shuffle<T>(items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = randomBytes(4).readUInt32BE(0) % (i + 1);
    [items[i], items[j]] = [items[j] as T, items[i] as T];
  }
  return items;
}

// ── Main ─────────────────────────────────────────────────────────────────────────────────────────

interface FloodTrial {
  realMs: number | null;
  realOk: boolean | null;
  /** A request of a tenant whose pool is already warm, sent with the real one: the queue alone. */
  warmMs: number | null;
  floodAnswers: Record<string, number>;
  floodMedianMs: number;
  floodMaxMs: number;
  floodWallMs: number;
  tunnelsOpened: number;
  tenantObjectFilesCreated: number;
}

async function flood(
  base: string,
  stack: RunningClusterStack,
  real: TenantCredentials | null,
  warm: TenantCredentials | null,
): Promise<FloodTrial> {
  const tunnelsBefore = totalTunnels((await stack.proxyStats()).tunnels);
  const filesBefore = tenantObjectFiles();
  const begin = performance.now();
  const forged = Array.from({ length: floodSize }, () => {
    const id = randomTenantId();
    return rawSql(base, { id, key: forgedKey() }, "SELECT 1 AS n", [], true).catch(
      (error: unknown): RawAnswer => ({
        status: 0,
        retryAfter: null,
        body: { code: error instanceof Error ? error.name : "error" },
        ms: performance.now() - begin,
      }),
    );
  });
  // The real tenant's first request goes out right behind the burst, as in issue 12.
  // A warm tenant's request goes with it: what it waits is the wait behind the burst alone.
  const warmAnswer = warm ? rawSql(base, warm, "SELECT 1 AS n", [], true) : null;
  const realAnswer = real ? rawSql(base, real, "SELECT 1 AS n", [], true) : null;
  const answers = await Promise.all(forged);
  const realResult = realAnswer ? await realAnswer : null;
  const warmResult = warmAnswer ? await warmAnswer : null;
  if (warmResult && !isOne(warmResult)) throw new Error(`the warm request failed: ${answerKind(warmResult)}`);
  const floodWallMs = performance.now() - begin;
  // Anything the flood set going (an object's alarm, a connection) would show up shortly after.
  await sleep(500);
  const tunnelsAfter = totalTunnels((await stack.proxyStats()).tunnels);
  const kinds: Record<string, number> = {};
  for (const answer of answers) {
    const kind = answerKind(answer);
    kinds[kind] = (kinds[kind] ?? 0) + 1;
  }
  const ms = answers.map((a) => a.ms);
  return {
    realMs: realResult ? round(realResult.ms, 1) : null,
    realOk: realResult ? isOne(realResult) : null,
    warmMs: warmResult ? round(warmResult.ms, 1) : null,
    floodAnswers: kinds,
    floodMedianMs: round(median(ms), 1),
    floodMaxMs: round(Math.max(...ms), 1),
    floodWallMs: round(floodWallMs, 1),
    tunnelsOpened: tunnelsAfter - tunnelsBefore,
    tenantObjectFilesCreated: tenantObjectFiles() - filesBefore,
  };
}

async function main(): Promise<number> {
  const startedAt = new Date();
  const loadAtStart = loadNow();
  mkdirSync(stateDir, { recursive: true });
  rmSync(persistDir, { recursive: true, force: true });

  progress("starting Postgres (a control-plane cluster and one host) and the WebSocket proxy");
  const stack = await startClusterStack({
    password: randomBytes(18).toString("base64url"),
    persistent: false,
    controlPlane: {
      name: "control",
      dataDir: resolve(stateDir, "pg-control"),
      port: await freePort(),
      maxConnections: 100,
    },
    hosts: [
      { name: hostName, dataDir: resolve(stateDir, "pg-host"), port: await freePort(), maxConnections: 500 },
    ],
  });
  running.stack = stack;
  const host = stack.info.hosts[0];
  if (!host) throw new Error("the stack has no host");

  const adminKey = `lak_edge_${randomBytes(24).toString("base64url")}`;
  const env = {
    ...wranglerVars(),
    LESSOR_ADMIN_KEY: adminKey,
    LESSOR_SEAL_KEY: randomBytes(32).toString("base64"),
    LESSOR_KEY_MAC_KEYS: randomBytes(32).toString("base64"),
    LESSOR_CONTROL_PLANE_URL: stack.info.controlPlaneUrl,
    LESSOR_HOSTS: JSON.stringify({ [hostName]: host.adminUrl }),
    LESSOR_BUDGETS: JSON.stringify({ [hostName]: budget }),
    LESSOR_WS_PROXY: stack.info.wsProxy,
    BENCH_DATABASE_URL: "postgres://unused@127.0.0.1:1/unused",
  };
  writeEnvFile(envFile, env);
  progress("bundling the bench Worker (a snapshot of src/ as it is now) and starting wrangler dev");
  const source = sourceRevision();
  const script = await buildWorker(resolve(stateDir, "build"));
  const port = await freePort();
  const wrangler = await startWrangler({
    script,
    port,
    inspectorPort: await freePort(),
    envFile,
    persistTo: persistDir,
  });
  running.wrangler = wrangler;
  if (wrangler.child.pid === undefined) throw new Error("wrangler has no pid");
  const layout = await findWranglerLayout(wrangler.child.pid, port);
  const base = `http://127.0.0.1:${layout.directPort}`;

  const coldIds = Array.from({ length: 2 * trials }, (_, i) => `edge-cold-${String(i + 1).padStart(3, "0")}`);
  progress(`provisioning ${coldIds.length} tenants (each one's first /sql is one cold start)`);
  const tenants = new Map<string, TenantCredentials>();
  await inParallel(coldIds, 4, async (id) => {
    tenants.set(id, await provision(base, adminKey, id));
  });
  const credentials = (id: string) => {
    const tenant = tenants.get(id);
    if (!tenant) throw new Error(`no key for ${id}`);
    return tenant;
  };

  // Warm the Worker's code paths (edge check, /sql, a pool start) on a tenant outside the trials.
  const warmup = await provision(base, adminKey, "edge-warmup");
  for (let i = 0; i < 3; i++) {
    const answer = await rawSql(base, warmup, "SELECT 1 AS n", [], true);
    if (!isOne(answer)) throw new Error(`warm-up /sql failed: ${answerKind(answer)}`);
    await rawSql(base, { id: randomTenantId(), key: forgedKey() }, "SELECT 1 AS n", [], true);
  }
  const fatalBefore = await stack.fatalCounts();

  // ── 1. Cold start, alone and under a flood ──
  progress(`flood alone: ${floodAloneTrials} bursts of ${floodSize} forged requests, no real request`);
  const floodAlone: FloodTrial[] = [];
  for (let i = 0; i < floodAloneTrials; i++) floodAlone.push(await flood(base, stack, null, null));
  for (const t of floodAlone)
    progress(
      `  ${JSON.stringify(t.floodAnswers)} in ${num(t.floodWallMs)} ms; tunnels opened ${t.tunnelsOpened}, TenantObject files ${t.tenantObjectFilesCreated}`,
    );

  progress(
    `cold starts: ${trials} alone and ${trials} behind a burst of ${floodSize} forged requests, alternating`,
  );
  const quiet: { ms: number; ok: boolean; tunnelsOpened: number }[] = [];
  const flooded: FloodTrial[] = [];
  for (let i = 0; i < trials; i++) {
    const quietTenant = credentials(coldIds[2 * i] ?? "");
    const floodTenant = credentials(coldIds[2 * i + 1] ?? "");
    const before = totalTunnels((await stack.proxyStats()).tunnels);
    const answer = await rawSql(base, quietTenant, "SELECT 1 AS n", [], true);
    await sleep(500);
    quiet.push({
      ms: round(answer.ms, 1),
      ok: isOne(answer),
      tunnelsOpened: totalTunnels((await stack.proxyStats()).tunnels) - before,
    });
    await sleep(300);
    flooded.push(await flood(base, stack, floodTenant, warmup));
    await sleep(300);
    const q = quiet.at(-1);
    const f = flooded.at(-1);
    progress(
      `  trial ${i + 1}: alone ${num(q?.ms, 1)} ms (${q?.tunnelsOpened} tunnels), under the flood ${num(f?.realMs, 1)} ms (${f?.tunnelsOpened} tunnels; a warm request beside it ${num(f?.warmMs, 1)} ms)`,
    );
  }
  const fatalAfter = await stack.fatalCounts();
  const fatalDuringFloods: Record<string, number> = {};
  for (const [line, n] of Object.entries(fatalAfter)) {
    const delta = n - (fatalBefore[line] ?? 0);
    if (delta > 0) fatalDuringFloods[line] = delta;
  }

  // ── 2. Wrong key vs unknown tenant ──
  progress(
    `answer times: ${timingRequests} each of a forged key for an existing tenant, a forged key for an unknown tenant, another tenant's genuine key`,
  );
  const existing = coldIds.slice(0, timingTenants).map(credentials);
  type Case =
    | "existing tenant, forged key"
    | "unknown tenant, forged key"
    | "existing tenant, another tenant's key";
  const existingForged: Case = "existing tenant, forged key";
  const unknownForged: Case = "unknown tenant, forged key";
  const cases: Case[] = [existingForged, unknownForged, "existing tenant, another tenant's key"];
  const plan = shuffle(cases.flatMap((c) => Array.from({ length: timingRequests }, (_, i) => ({ c, i }))));
  const byCase = new Map<Case, number[]>(cases.map((c) => [c, []]));
  const bodies = new Map<string, number>();
  const statusesByCase = new Map<Case, Record<string, number>>(cases.map((c) => [c, {}]));
  // Untimed warm-up of the kept-alive connection and the edge path.
  for (let i = 0; i < 20; i++)
    await rawSql(base, { id: randomTenantId(), key: forgedKey() }, "SELECT 1 AS n");
  for (const { c, i } of plan) {
    const owner = existing[i % existing.length] as TenantCredentials;
    const other = existing[(i + 1) % existing.length] as TenantCredentials;
    const caller: TenantCredentials =
      c === "existing tenant, forged key"
        ? { id: owner.id, key: forgedKey() }
        : c === "unknown tenant, forged key"
          ? { id: randomTenantId(), key: forgedKey() }
          : { id: owner.id, key: other.key };
    const answer = await rawSql(base, caller, "SELECT 1 AS n");
    byCase.get(c)?.push(answer.ms);
    const statuses = statusesByCase.get(c) ?? {};
    statuses[answerKind(answer)] = (statuses[answerKind(answer)] ?? 0) + 1;
    const body = `${answer.status} ${JSON.stringify(answer.body)}`;
    bodies.set(body, (bodies.get(body) ?? 0) + 1);
  }
  const timing = cases.map((c) => {
    const ms = byCase.get(c) ?? [];
    return {
      case: c,
      requests: ms.length,
      medianMs: round(median(ms), 2),
      p90Ms: round(percentile(ms, 90), 2),
      answers: statusesByCase.get(c) ?? {},
    };
  });
  const medianOf = (c: Case) => timing.find((t) => t.case === c)?.medianMs ?? Number.NaN;
  const timingRatio = round(
    Math.max(medianOf(existingForged), medianOf(unknownForged)) /
      Math.min(medianOf(existingForged), medianOf(unknownForged)),
    2,
  );
  for (const t of timing)
    progress(
      `  ${t.case}: median ${num(t.medianMs, 2)} ms, p90 ${num(t.p90Ms, 2)} ms, ${JSON.stringify(t.answers)}`,
    );

  await cleanup();
  const finishedAt = new Date();
  const quietMs = quiet.map((q) => q.ms);
  const floodedMs = flooded.map((f) => f.realMs ?? Number.NaN);
  const coldStart = {
    alone: {
      trials: quiet.length,
      medianMs: round(median(quietMs), 1),
      p99Ms: round(p99(quietMs), 1),
      allSucceeded: quiet.every((q) => q.ok),
      tunnelsPerColdStart: quiet.map((q) => q.tunnelsOpened),
    },
    underFlood: {
      trials: flooded.length,
      floodSize,
      medianMs: round(median(floodedMs), 1),
      p99Ms: round(p99(floodedMs), 1),
      allSucceeded: flooded.every((f) => f.realOk === true),
      warmBesideMedianMs: round(median(flooded.map((f) => f.warmMs ?? Number.NaN)), 1),
      tunnelsPerTrial: flooded.map((f) => f.tunnelsOpened),
      floodAnswers: flooded.reduce<Record<string, number>>((sum, f) => {
        for (const [k, n] of Object.entries(f.floodAnswers)) sum[k] = (sum[k] ?? 0) + n;
        return sum;
      }, {}),
      floodMedianMs: round(median(flooded.map((f) => f.floodMedianMs)), 1),
      floodWallMedianMs: round(median(flooded.map((f) => f.floodWallMs)), 1),
    },
    ratioOfMedians: round(median(floodedMs) / median(quietMs), 2),
    floodAlone,
    tunnelsOpenedByFloodsAlone: floodAlone.reduce((n, f) => n + f.tunnelsOpened, 0),
    tenantObjectFilesCreatedByFloods: [...floodAlone, ...flooded].reduce(
      (n, f) => n + f.tenantObjectFilesCreated,
      0,
    ),
    postgresFatalDuringFloods: fatalDuringFloods,
  };
  const results = {
    benchmark: "edge",
    date: startedAt.toISOString().slice(0, 10),
    startedAt: startedAt.toISOString(),
    finishedAt: finishedAt.toISOString(),
    durationS: round((finishedAt.getTime() - startedAt.getTime()) / 1000, 1),
    command: "npm run bench:edge",
    machine: { ...machineFacts(), loadavgAtStart: loadAtStart, loadavgAtEnd: loadNow() },
    versions: {
      wrangler: packageVersion("wrangler"),
      miniflare: packageVersion("miniflare"),
      "@neondatabase/serverless": packageVersion("@neondatabase/serverless"),
    },
    source,
    settings: { trials, floodSize, floodAloneTrials, timingRequests, timingTenants, budget },
    issue12Before: {
      coldStartAloneMs: 130,
      coldStartUnderFloodMs: 10_200,
      wrongKeyMedianMs: 11,
      unknownTenantMedianMs: 74,
    },
    coldStart,
    timing,
    timingRatioOfMedians: timingRatio,
    distinctAnswers: Object.fromEntries(bodies),
    quietTrials: quiet,
    floodTrials: flooded,
  };
  const resultsDir = resolve(root, "bench/results");
  mkdirSync(resultsDir, { recursive: true });
  const file = resolve(resultsDir, `edge-${results.date}.json`);
  writeFileSync(file, `${JSON.stringify(results, null, 2)}\n`);
  console.log(report(results));
  progress(`wrote ${file}`);
  const wrong =
    !coldStart.alone.allSucceeded ||
    !coldStart.underFlood.allSucceeded ||
    coldStart.tunnelsOpenedByFloodsAlone !== 0 ||
    bodies.size !== 1;
  if (wrong) {
    console.error(
      "bench:edge: a cold start failed, a flood opened a connection, or the refusals were not all alike",
    );
    return 1;
  }
  return 0;
}

// ── Report ───────────────────────────────────────────────────────────────────────────────────────

function report(r: {
  machine: { loadavgAtStart: number[]; loadavgAtEnd: number[]; cores: number; cpuModel: string };
  coldStart: {
    alone: { medianMs: number; p99Ms: number; trials: number };
    underFlood: {
      medianMs: number;
      p99Ms: number;
      trials: number;
      floodAnswers: Record<string, number>;
      floodWallMedianMs: number;
      warmBesideMedianMs: number;
    };
    ratioOfMedians: number;
    tunnelsOpenedByFloodsAlone: number;
    tenantObjectFilesCreatedByFloods: number;
    postgresFatalDuringFloods: Record<string, number>;
  };
  timing: {
    case: string;
    requests: number;
    medianMs: number;
    p90Ms: number;
    answers: Record<string, number>;
  }[];
  timingRatioOfMedians: number;
  distinctAnswers: Record<string, number>;
}): string {
  const c = r.coldStart;
  return [
    "# bench:edge",
    "",
    `Machine: ${r.machine.cores} cores (${r.machine.cpuModel}); load average ${r.machine.loadavgAtStart.join(" / ")} at the start, ${r.machine.loadavgAtEnd.join(" / ")} at the end.`,
    "",
    `## A real tenant's cold start, alone and behind ${c.underFlood.trials} bursts of ${floodSize} forged requests`,
    "",
    mdTable(
      ["", "median", "p99", "trials"],
      [
        ["alone", `${num(c.alone.medianMs, 1)} ms`, `${num(c.alone.p99Ms, 1)} ms`, String(c.alone.trials)],
        [
          `behind ${floodSize} forged requests`,
          `${num(c.underFlood.medianMs, 1)} ms`,
          `${num(c.underFlood.p99Ms, 1)} ms`,
          String(c.underFlood.trials),
        ],
        [
          `a warm tenant's request beside it (the wait behind the burst alone)`,
          `${num(c.underFlood.warmBesideMedianMs, 1)} ms`,
          "",
          String(c.underFlood.trials),
        ],
      ],
    ),
    "",
    `Ratio of medians: ${c.ratioOfMedians}. Forged answers: ${JSON.stringify(c.underFlood.floodAnswers)}; a burst took ${num(c.underFlood.floodWallMedianMs)} ms (median). Connections to Postgres opened by ${floodAloneTrials} floods with no real request: ${c.tunnelsOpenedByFloodsAlone}. TenantObject storage files created by all floods: ${c.tenantObjectFilesCreatedByFloods}. Postgres FATAL lines during the floods: ${JSON.stringify(c.postgresFatalDuringFloods)}.`,
    "",
    "## Answer time of a refused key",
    "",
    mdTable(
      ["caller", "requests", "median", "p90", "answers"],
      r.timing.map((t) => [
        t.case,
        String(t.requests),
        `${num(t.medianMs, 2)} ms`,
        `${num(t.p90Ms, 2)} ms`,
        JSON.stringify(t.answers),
      ]),
    ),
    "",
    `Ratio of the medians (existing vs unknown tenant): ${r.timingRatioOfMedians}. Distinct status and body pairs across all ${r.timing.reduce((n, t) => n + t.requests, 0)} refusals: ${Object.keys(r.distinctAnswers).length}.`,
  ].join("\n");
}

const code = await main().catch(async (error: unknown) => {
  console.error(
    `bench:edge failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`,
  );
  if (running.wrangler) console.error(running.wrangler.output.slice(-40).join("\n"));
  await cleanup();
  return 1;
});
process.exit(code);
