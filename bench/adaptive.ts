/**
 * `npm run bench:adaptive`: the same load on the same host twice in one run, with fixed pool sizes
 * (every pool holds its tier's size) and then with adaptive admission (docs/adr/022).
 *
 * The host's budget holds every tenant's pool at its tier's size exactly, the way an operator sizes
 * fixed tiers today so that the whole fleet stays warm: `connections = tenants × size + reserve`.
 * A few hot tenants run a connection-bound query (`pg_sleep(0.02)`: the pool, not the CPU, is the
 * limit) at a fixed concurrency each; many trickle tenants each send one request every interval.
 * Adaptive admission may grow the hot pools up to the tier's maximum and take idle connections back
 * from the trickle pools; fixed sizing may not.
 *
 * Reported for each mode: hot-tenant throughput, p50/p99 of the trickle tenants, the 503s (by
 * code), and the peaks sampled every 100 ms against the budget: the ledger (allocated + reserved +
 * draining, from GET /v1/capacity) and Postgres itself (`pg_stat_activity`: Lessor's pooled
 * backends, and all of Lessor's). Every answer is checked (the tenant's own database); a wrong
 * answer, an error other than a 503, or a sample over the budget makes the run exit non-zero.
 *
 *     npm run bench:adaptive                                   # 2 × (20 s measured + 5 s warm-up)
 *     ADAPTIVE_DURATION_MS=5000 ADAPTIVE_WARMUP_MS=2000 npm run bench:adaptive   # a quick check
 *
 * Settings (bounded): ADAPTIVE_HOT (2), ADAPTIVE_TRICKLE (12), ADAPTIVE_HOT_CONCURRENCY (8 per hot
 * tenant, up to 256), ADAPTIVE_TRICKLE_INTERVAL_MS (200), ADAPTIVE_SLEEP_MS (20), ADAPTIVE_SIZE (2,
 * the tier's size, up to 32), ADAPTIVE_MAX (6, the tier's maximum), ADAPTIVE_DURATION_MS (20000),
 * ADAPTIVE_WARMUP_MS (5000), ADAPTIVE_MODES (`fixed,adaptive`), ADAPTIVE_WRANGLER_LOG (`warn`). Writes
 * bench/results/adaptive-<date>.json.
 *
 * One object's ceiling at a pool size (docs/adr/030): one hot tenant, a fixed pool, statements of
 * a few milliseconds, e.g. `ADAPTIVE_MODES=fixed ADAPTIVE_HOT=1 ADAPTIVE_TRICKLE=1
 * ADAPTIVE_HOT_CONCURRENCY=64 ADAPTIVE_SLEEP_MS=5 ADAPTIVE_SIZE=12 ADAPTIVE_MAX=12`.
 */
import { randomBytes } from "node:crypto";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { writeEnvFile } from "../local/stack.ts";
import { maxPoolSize } from "../src/core/pool-size.ts";
import {
  ApiError,
  admin,
  asSuperuser,
  type BenchRunning,
  machineFacts,
  mdTable,
  num,
  progress,
  rank,
  rawSql,
  round,
  setting,
  sleep,
  sourceRevision,
  stopOnExit,
  type TenantCredentials,
  tenantDatabaseNames,
  wranglerVars,
} from "./harness.ts";
import { buildWorker, freePort, type RunningWrangler, root, startStack, startWrangler } from "./processes.ts";

const hotTenants = setting("ADAPTIVE_HOT", 2, 1, 8);
const trickleTenants = setting("ADAPTIVE_TRICKLE", 12, 1, 40);
const hotConcurrency = setting("ADAPTIVE_HOT_CONCURRENCY", 8, 1, 256);
const trickleIntervalMs = setting("ADAPTIVE_TRICKLE_INTERVAL_MS", 200, 20, 5_000);
const sleepMs = setting("ADAPTIVE_SLEEP_MS", 20, 1, 500);
const tierSize = setting("ADAPTIVE_SIZE", 2, 1, maxPoolSize);
const tierMax = setting("ADAPTIVE_MAX", Math.max(6, tierSize), tierSize, maxPoolSize);
/** Which modes run, in order (`fixed`, `adaptive`, or both): one mode measures one tenant object's ceiling at a pool size. */
const modes = (process.env.ADAPTIVE_MODES ?? "fixed,adaptive")
  .split(",")
  .map((m) => m.trim())
  .filter((m): m is Mode => m === "fixed" || m === "adaptive");
if (modes.length === 0) throw new Error("ADAPTIVE_MODES names no mode (fixed, adaptive)");
const durationMs = setting("ADAPTIVE_DURATION_MS", 20_000, 2_000, 120_000);
const warmupMs = setting("ADAPTIVE_WARMUP_MS", 5_000, 0, 60_000);
const reserve = 2;
const connections = (hotTenants + trickleTenants) * tierSize + reserve;
const poolCapacity = connections - reserve;
const hostName = "local";

const stateDir = resolve(root, ".lessor/bench-adaptive");
const envFile = resolve(stateDir, "wrangler.vars");
const running: BenchRunning & { wrangler: RunningWrangler | null } = { stack: null, wrangler: null };
const cleanup = stopOnExit("bench:adaptive", envFile, running);

type Mode = "fixed" | "adaptive";
type Kind = "hot" | "trickle";

interface Answer {
  kind: Kind;
  at: number;
  ms: number;
  status: number;
  code: string | null;
}

interface Peaks {
  samples: number;
  ledger: number;
  ledgerOver: number;
  pooledBackends: number;
  pooledOver: number;
  allBackends: number;
  allOver: number;
  sampleErrors: number;
}

interface ModeResult {
  mode: Mode;
  hot: { requests: number; perSecond: number; p50Ms: number; p99Ms: number };
  trickle: { requests: number; perSecond: number; p50Ms: number; p99Ms: number };
  refusals: Record<string, number>;
  wrong: string[];
  peaks: Peaks;
  capacity: unknown;
}

/** Samples the ledger and Postgres every 100 ms until stopped. */
function startSampler(base: string, adminKey: string, superuserUrl: string): { stop(): Promise<Peaks> } {
  const peaks: Peaks = {
    samples: 0,
    ledger: 0,
    ledgerOver: 0,
    pooledBackends: 0,
    pooledOver: 0,
    allBackends: 0,
    allOver: 0,
    sampleErrors: 0,
  };
  let running = true;
  const done = (async () => {
    await asSuperuser(superuserUrl, async (client) => {
      while (running) {
        try {
          const status = (await admin(base, adminKey, "/v1/capacity")) as {
            hosts: { host: string; allocated: number; reserved: number; draining: number }[];
          };
          const host = status.hosts.find((h) => h.host === hostName);
          const ledger = host ? host.allocated + host.reserved + host.draining : 0;
          const { rows } = await client.query<{ pooled: string; all: string }>(
            `SELECT count(*) FILTER (WHERE application_name ~ '^lessor:[^:]+:[0-9]+$') AS pooled,
                    count(*) FILTER (WHERE application_name LIKE 'lessor:%') AS all
               FROM pg_stat_activity`,
          );
          const pooled = Number(rows[0]?.pooled ?? 0);
          const all = Number(rows[0]?.all ?? 0);
          peaks.samples++;
          peaks.ledger = Math.max(peaks.ledger, ledger);
          peaks.pooledBackends = Math.max(peaks.pooledBackends, pooled);
          peaks.allBackends = Math.max(peaks.allBackends, all);
          if (ledger > poolCapacity) peaks.ledgerOver++;
          if (pooled > poolCapacity) peaks.pooledOver++;
          if (all > connections) peaks.allOver++;
        } catch {
          peaks.sampleErrors++;
        }
        await sleep(100);
      }
    });
  })();
  return {
    stop: async () => {
      running = false;
      await done;
      return peaks;
    },
  };
}

function summary(answers: readonly Answer[], seconds: number) {
  const ok = answers.filter((a) => a.status === 200);
  const sorted = ok.map((a) => a.ms).sort((x, y) => x - y);
  return {
    requests: ok.length,
    perSecond: round(ok.length / seconds, 1),
    p50Ms: round(rank(sorted, 50), 1),
    p99Ms: round(rank(sorted, 99), 1),
  };
}

async function runMode(
  mode: Mode,
  script: string,
  stack: { controlPlaneUrl: string; hostsJson: string; wsProxy: string; superuserUrl: string },
): Promise<ModeResult> {
  const persistTo = resolve(stateDir, `wrangler-${mode}`);
  rmSync(persistTo, { recursive: true, force: true });
  const adminKey = `lak_adaptive_${randomBytes(24).toString("base64url")}`;
  writeEnvFile(envFile, {
    ...wranglerVars(),
    LESSOR_ADMIN_KEY: adminKey,
    LESSOR_SEAL_KEY: randomBytes(32).toString("base64"),
    LESSOR_KEY_MAC_KEYS: randomBytes(32).toString("base64"),
    LESSOR_CONTROL_PLANE_URL: stack.controlPlaneUrl,
    LESSOR_HOSTS: stack.hostsJson,
    LESSOR_WS_PROXY: stack.wsProxy,
    LESSOR_POOL_SIZES: JSON.stringify({ standard: { size: tierSize, max: tierMax } }),
    LESSOR_BUDGETS: JSON.stringify({
      [hostName]: { connections, reserve, adaptive: mode === "adaptive" },
    }),
    BENCH_DATABASE_URL: "",
  });
  const port = await freePort();
  progress(`${mode}: starting wrangler dev`);
  running.wrangler = await startWrangler({
    script,
    port,
    inspectorPort: await freePort(),
    envFile,
    persistTo,
    logLevel: process.env.ADAPTIVE_WRANGLER_LOG ?? "warn",
  });
  const base = `http://127.0.0.1:${port}`;
  try {
    progress(`${mode}: provisioning ${hotTenants} hot and ${trickleTenants} trickle tenants`);
    const tag = randomBytes(3).toString("hex");
    const provision = async (id: string): Promise<TenantCredentials> => {
      for (let attempt = 1; ; attempt++) {
        try {
          const body = (await admin(base, adminKey, "/v1/tenants", { id, tier: "standard" })) as {
            key: string;
          };
          return { id, key: body.key };
        } catch (error) {
          const busy = error instanceof ApiError && error.status === 503 && attempt < 30;
          if (!busy) {
            // What the Worker logged says why (its answer never does).
            await sleep(1_000);
            console.error((running.wrangler?.output ?? []).slice(-20).join("\n"));
            throw error;
          }
          await sleep(500);
        }
      }
    };
    const hot: TenantCredentials[] = [];
    const trickle: TenantCredentials[] = [];
    for (let i = 0; i < hotTenants; i++) hot.push(await provision(`${mode}-hot-${tag}-${i}`));
    for (let i = 0; i < trickleTenants; i++) trickle.push(await provision(`${mode}-trk-${tag}-${i}`));
    const databases = await tenantDatabaseNames(stack.controlPlaneUrl);
    const wrong: string[] = [];
    const answers: Answer[] = [];
    const send = async (tenant: TenantCredentials, kind: Kind): Promise<void> => {
      const at = performance.now();
      const answer = await rawSql(base, tenant, "SELECT current_database() AS db, pg_sleep($1::float8)", [
        sleepMs / 1000,
      ]);
      let code: string | null = null;
      if (answer.status === 200) {
        const rows = (answer.body as { rows?: { db?: unknown }[] }).rows;
        const db = rows?.[0]?.db;
        if (db !== databases.get(tenant.id)) wrong.push(`${tenant.id} answered from ${String(db)}`);
      } else {
        const body = answer.body as { code?: unknown };
        code = typeof body?.code === "string" ? body.code : "(no code)";
        if (answer.status !== 503 || answer.retryAfter === null)
          wrong.push(`${tenant.id}: ${answer.status} ${code}`);
      }
      answers.push({ kind, at, ms: answer.ms, status: answer.status, code });
    };
    // Every pool started once, at its size, before the load.
    for (const tenant of [...hot, ...trickle]) await send(tenant, "trickle");
    answers.length = 0;

    const sampler = startSampler(base, adminKey, stack.superuserUrl);
    const start = performance.now();
    const end = start + warmupMs + durationMs;
    progress(`${mode}: load for ${warmupMs} ms warm-up + ${durationMs} ms measured`);
    const hotLoops = hot.flatMap((tenant) =>
      Array.from({ length: hotConcurrency }, async () => {
        while (performance.now() < end) await send(tenant, "hot");
      }),
    );
    const trickleLoops = trickle.map(async (tenant, i) => {
      // Spread over one interval so the trickle does not arrive in lockstep.
      await sleep((i * trickleIntervalMs) / trickle.length);
      while (performance.now() < end) {
        const at = performance.now();
        await send(tenant, "trickle");
        await sleep(Math.max(0, trickleIntervalMs - (performance.now() - at)));
      }
    });
    await Promise.all([...hotLoops, ...trickleLoops]);
    const peaks = await sampler.stop();
    const capacity = ((await admin(base, adminKey, "/v1/capacity")) as { hosts: unknown[] }).hosts[0];
    const measured = answers.filter((a) => a.at >= start + warmupMs);
    const seconds = durationMs / 1000;
    const refusals: Record<string, number> = {};
    for (const a of measured) {
      if (a.status === 200) continue;
      const key = `${a.kind} ${a.status} ${a.code}`;
      refusals[key] = (refusals[key] ?? 0) + 1;
    }
    return {
      mode,
      hot: summary(
        measured.filter((a) => a.kind === "hot"),
        seconds,
      ),
      trickle: summary(
        measured.filter((a) => a.kind === "trickle"),
        seconds,
      ),
      refusals,
      wrong: wrong.slice(0, 20),
      peaks,
      capacity,
    };
  } finally {
    await running.wrangler?.stop();
    running.wrangler = null;
  }
}

async function main(): Promise<void> {
  mkdirSync(stateDir, { recursive: true });
  progress(
    `budget ${connections} connections (reserve ${reserve}): ${hotTenants + trickleTenants} pools of ${tierSize}, tier maximum ${tierMax}`,
  );
  const stack = await startStack({
    dataDir: resolve(stateDir, "pg"),
    pgPort: await freePort(),
    password: randomBytes(18).toString("base64url"),
  });
  running.stack = stack;
  const source = sourceRevision();
  progress("bundling the bench Worker once (a snapshot of src/ as it is now)");
  const script = await buildWorker(resolve(stateDir, "build"));
  const info = {
    controlPlaneUrl: stack.info.controlPlaneUrl,
    hostsJson: stack.info.hostsJson,
    wsProxy: stack.info.wsProxy,
    superuserUrl: stack.info.superuserUrl,
  };
  const results: ModeResult[] = [];
  for (const mode of modes) results.push(await runMode(mode, script, info));

  const fixed = results.find((r) => r.mode === "fixed");
  const adaptive = results.find((r) => r.mode === "adaptive");
  const row = (r: ModeResult) => [
    r.mode,
    num(r.hot.perSecond, 1),
    `${num(r.hot.p50Ms, 1)} / ${num(r.hot.p99Ms, 1)}`,
    num(r.trickle.perSecond, 1),
    `${num(r.trickle.p50Ms, 1)} / ${num(r.trickle.p99Ms, 1)}`,
    String(Object.values(r.refusals).reduce((n, c) => n + c, 0)),
    `${r.peaks.ledger} / ${poolCapacity}`,
    `${r.peaks.pooledBackends} / ${poolCapacity}`,
    `${r.peaks.allBackends} / ${connections}`,
    String(r.peaks.ledgerOver + r.peaks.pooledOver + r.peaks.allOver),
  ];
  console.log(
    mdTable(
      [
        "mode",
        "hot req/s",
        "hot p50 / p99 ms",
        "trickle req/s",
        "trickle p50 / p99 ms",
        "503s",
        "ledger peak",
        "pooled backends peak",
        "all backends peak",
        "samples over",
      ],
      results.map(row),
    ),
  );
  const over = results.reduce((n, r) => n + r.peaks.ledgerOver + r.peaks.pooledOver + r.peaks.allOver, 0);
  const budgetNeverExceeded = { samplesOver: over, met: over === 0 };
  // The comparison's goals need both modes; one mode (a pool size's ceiling) is judged on the budget only.
  const hotRatio = fixed && adaptive ? adaptive.hot.perSecond / fixed.hot.perSecond : null;
  const trickleP99Ratio = fixed && adaptive ? adaptive.trickle.p99Ms / fixed.trickle.p99Ms : null;
  const goals = {
    ...(hotRatio === null
      ? {}
      : { hotThroughputAtLeastDoubles: { ratio: round(hotRatio, 2), met: hotRatio >= 2 } }),
    ...(trickleP99Ratio === null
      ? {}
      : { trickleP99NotWorse: { ratio: round(trickleP99Ratio, 2), met: trickleP99Ratio <= 1 } }),
    budgetNeverExceeded,
  };
  console.log(
    (hotRatio === null || trickleP99Ratio === null
      ? "\n"
      : `\nhot throughput ×${num(hotRatio, 2)} (goal ≥ 2: ${hotRatio >= 2 ? "met" : "missed"}); ` +
        `trickle p99 ×${num(trickleP99Ratio, 2)} (goal ≤ 1: ${trickleP99Ratio <= 1 ? "met" : "missed"}); `) +
      `samples over the budget: ${over} (goal 0: ${budgetNeverExceeded.met ? "met" : "missed"})`,
  );
  for (const r of results) {
    if (Object.keys(r.refusals).length > 0) console.log(`${r.mode} 503s: ${JSON.stringify(r.refusals)}`);
    if (r.wrong.length > 0) console.log(`${r.mode} WRONG: ${r.wrong.join("; ")}`);
  }
  const date = new Date().toISOString().slice(0, 10);
  const out = resolve(root, "bench/results", `adaptive-${date}.json`);
  mkdirSync(resolve(root, "bench/results"), { recursive: true });
  writeFileSync(
    out,
    `${JSON.stringify(
      {
        date,
        machine: machineFacts(),
        source,
        settings: {
          hotTenants,
          trickleTenants,
          hotConcurrency,
          trickleIntervalMs,
          sleepMs,
          tier: { size: tierSize, max: tierMax },
          budget: { connections, reserve, poolCapacity },
          durationMs,
          warmupMs,
        },
        goals,
        results,
      },
      null,
      2,
    )}\n`,
  );
  console.log(`\nwrote ${out}`);
  if (over > 0 || results.some((r) => r.wrong.length > 0)) process.exitCode = 1;
}

try {
  await main();
} catch (error) {
  console.error(error);
  console.error(running.wrangler?.output.slice(-30).join("\n") ?? "");
  process.exitCode = 1;
} finally {
  await cleanup();
}
