/**
 * `npm run bench:campaign`: how fast a migration campaign moves a fleet, at concurrency 1, 4 and 8.
 *
 * Starts its own stack (a throwaway Postgres under .lessor/bench-campaign-pg and the WebSocket
 * proxy) and `wrangler dev` on a snapshot bundle of the Worker, provisions TENANTS tenants, and for
 * each concurrency: rolls every tenant back to schema version 1 by hand (superuser DDL, the catalog
 * version), creates a campaign to the newest version through the admin API, and drives cron ticks
 * back to back through /__scheduled until the campaign is done. It then checks every tenant
 * database's own ledger (each version recorded exactly once) before it trusts the number.
 *
 * tenants/s = tenants migrated / wall time from the first tick to `done`. Ticks run back to back
 * here; in production the cron fires once a minute, so a campaign moves `concurrency` tenants per
 * minute there (see docs/migrations.md).
 *
 *     npm run bench:campaign                       # 100 tenants
 *     TENANTS=200 npm run bench:campaign
 *
 * Writes bench/results/campaign-<date>.json.
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { cpSync, mkdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { cpus, loadavg, totalmem } from "node:os";
import { resolve } from "node:path";
import pg from "pg";
import {
  freePort,
  type LocalStack,
  root,
  startLocalStack,
  wranglerDevArgs,
  writeEnvFile,
} from "../local/stack.ts";

const tenantCount = Number(process.env.TENANTS ?? 100);
const concurrencies = [1, 4, 8];
const latestVersion = 3;
const finishedStates = ["done", "failed", "cancelled"];
const stateDir = resolve(root, ".lessor");
const pgDir = resolve(stateDir, "bench-campaign-pg");
const persistDir = resolve(stateDir, "bench-campaign-wrangler");
const snapshotDir = resolve(stateDir, "bench-campaign-src");
const envFile = resolve(stateDir, "bench-campaign.vars");
const adminKey = `lak_${randomBytes(24).toString("base64url")}`;

function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

/** Runs `work` over `items`, at most `limit` at a time. */
async function pool<T>(items: readonly T[], limit: number, work: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) {
        const item = items[next++] as T;
        await work(item);
      }
    }),
  );
}

/**
 * A copy of the Worker's sources for `wrangler dev` to bundle and watch: others may edit the working
 * tree while the bench runs, and a watched file that changes reloads the Worker (restarting every
 * Durable Object) mid-measurement. (`--no-bundle` on a prebuilt script would avoid the watch too,
 * but `--test-scheduled` works by adding a middleware while bundling.)
 */
function snapshotSources(): void {
  rmSync(snapshotDir, { recursive: true, force: true });
  mkdirSync(snapshotDir, { recursive: true });
  cpSync(resolve(root, "src"), resolve(snapshotDir, "src"), { recursive: true });
  for (const file of ["wrangler.toml", "package.json", "tsconfig.json"]) {
    cpSync(resolve(root, file), resolve(snapshotDir, file));
  }
  symlinkSync(resolve(root, "node_modules"), resolve(snapshotDir, "node_modules"), "dir");
}

interface Wrangler {
  stop(): Promise<void>;
  /** The last lines wrangler and the Worker printed, for diagnostics. */
  tail(): string;
  /**
   * Resolves once the campaign cron job has finished `count` runs in all. /__scheduled answers at
   * once and the jobs run under waitUntil; each run logs one `cron_job` line when it ends.
   */
  campaignJobRuns(count: number, timeoutMs: number): Promise<void>;
}

/** `wrangler dev` on the snapshot, as `npm start` runs it, with /__scheduled enabled. */
async function startWrangler(port: number): Promise<Wrangler> {
  snapshotSources();
  const child = spawn(
    process.execPath,
    wranglerDevArgs({
      port,
      envFile,
      persistTo: persistDir,
      inspectorPort: await freePort(),
      testScheduled: true,
      // The Worker's own console lines ("log" level) are how the bench knows a cron job finished.
      extra: ["--log-level", process.env.WRANGLER_LOG ?? "log"],
    }),
    {
      cwd: snapshotDir,
      // Its own process group, so stopping it stops its workerd too.
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: {
        ...process.env,
        WRANGLER_SEND_METRICS: "false",
        CI: "1",
        WRANGLER_CI_DISABLE_CONFIG_WATCHING: "true",
        // A private dev registry: another `wrangler dev` starting on this machine (a demo, another
        // bench) would otherwise update the shared one, and every instance reloads on that.
        WRANGLER_REGISTRY_PATH: resolve(stateDir, "bench-campaign-registry"),
      },
    },
  );
  const output: string[] = [];
  let jobRuns = 0;
  const keep = (chunk: Buffer) => {
    output.push(chunk.toString());
    if (output.length > 100) output.shift();
  };
  // Worker log lines may arrive on either stream (console.warn and console.error go to stderr).
  const partial = { stdout: "", stderr: "" };
  for (const stream of ["stdout", "stderr"] as const) {
    child[stream]?.on("data", (chunk: Buffer) => {
      keep(chunk);
      const lines = (partial[stream] + chunk.toString()).split("\n");
      partial[stream] = lines.pop() ?? "";
      for (const line of lines) if (line.includes('"job":"migration-campaigns"')) jobRuns++;
    });
  }
  const campaignJobRuns = async (count: number, timeoutMs: number) => {
    const deadline = performance.now() + timeoutMs;
    while (jobRuns < count) {
      if (performance.now() > deadline)
        throw new Error(
          `the campaign job ran ${jobRuns} times, not ${count}:\n${output.join("").slice(-3_000)}`,
        );
      await sleep(5);
    }
  };
  const signal = (name: NodeJS.Signals) => {
    if (child.pid === undefined) return;
    try {
      process.kill(-child.pid, name);
    } catch {
      // Already gone.
    }
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((done) => child.once("exit", () => done()));
      signal("SIGTERM");
      await Promise.race([exited, sleep(15_000)]);
    }
    signal("SIGKILL");
  };
  for (let attempt = 0; attempt < 480; attempt++) {
    if (child.exitCode !== null) break;
    try {
      const response = await fetch(`http://127.0.0.1:${port}/`, { signal: AbortSignal.timeout(2_000) });
      if (response.ok) return { stop, tail: () => output.join("").slice(-4_000), campaignJobRuns };
    } catch {
      // Not listening yet.
    }
    await sleep(250);
  }
  await stop();
  throw new Error(`wrangler dev did not start:\n${output.join("").slice(-3_000)}`);
}

async function withPg<T>(url: string, work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client(url);
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

function databaseUrl(stack: LocalStack, database: string): string {
  return stack.pg.url(database);
}

interface RunResult {
  concurrency: number;
  tenants: number;
  ticks: number;
  seconds: number;
  tenantsPerSecond: number;
  meanTickMs: number;
}

async function main(): Promise<void> {
  mkdirSync(stateDir, { recursive: true });
  rmSync(persistDir, { recursive: true, force: true });
  const stack = await startLocalStack({
    dataDir: pgDir,
    pgPort: await freePort(),
    pgPassword: randomBytes(18).toString("base64url"),
    persistent: false,
    log: (line) => {
      if (/FATAL|PANIC/.test(line)) console.error(`[postgres] ${line}`);
    },
  });
  let wrangler: Wrangler | null = null;
  const shutdown = async () => {
    await wrangler?.stop().catch(() => undefined);
    await stack.stop().catch(() => undefined);
  };
  process.once("SIGINT", () => void shutdown().then(() => process.exit(130)));
  try {
    const vars: Record<string, string> = {
      LESSOR_ADMIN_KEY: adminKey,
      LESSOR_SEAL_KEY: randomBytes(32).toString("base64"),
      LESSOR_KEY_MAC_KEYS: randomBytes(32).toString("base64"),
      LESSOR_CONTROL_PLANE_URL: stack.controlPlaneUrl,
      LESSOR_HOSTS: stack.hostsJson,
      LESSOR_WS_PROXY: stack.wsProxy,
      // Concurrency 8 needs 8 maintenance connections: each migration holds one outside the pool,
      // and the runner keeps a host's migrations within its budget reserve.
      LESSOR_BUDGETS: JSON.stringify({ "*": { connections: 200, reserve: 10 } }),
    };
    writeEnvFile(envFile, vars);
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    console.log("building and starting wrangler dev …");
    wrangler = await startWrangler(port);

    const api = async (path: string, init: RequestInit & { json?: unknown } = {}) => {
      const { json, ...rest } = init;
      const headers = new Headers(rest.headers);
      headers.set("Authorization", `Bearer ${adminKey}`);
      if (json !== undefined) headers.set("content-type", "application/json");
      const response = await fetch(`${base}${path}`, {
        ...rest,
        headers,
        ...(json === undefined ? {} : { body: JSON.stringify(json) }),
      });
      const text = await response.text();
      if (!response.ok) throw new Error(`${init.method ?? "GET"} ${path}: ${response.status} ${text}`);
      return JSON.parse(text) as unknown;
    };

    const progressOf = async (id: string) => {
      const view = (await api(`/v1/campaigns/${id}?limit=1`)) as {
        campaign: { state: string };
        counts: { running: number; succeeded: number; failed: number; skipped: number };
      };
      const { running, succeeded, failed, skipped } = view.counts;
      return { state: view.campaign.state, running, finished: succeeded + failed + skipped };
    };

    console.log(`provisioning ${tenantCount} tenants …`);
    const ids = Array.from({ length: tenantCount }, (_, i) => `bench-${String(i).padStart(4, "0")}`);
    await pool(ids, 8, async (id) => {
      // Creates share the host's maintenance reserve: a 503 (maintenance_busy) is retried.
      for (let attempt = 0; ; attempt++) {
        try {
          await api("/v1/tenants", { method: "POST", json: { id } });
          return;
        } catch (error) {
          if (attempt >= 40 || !String(error).includes(": 503 ")) throw error;
          await sleep(1_000);
        }
      }
    });

    // Tenant databases have opaque names chosen at provisioning: read them from the catalog.
    const databases = await withPg(stack.controlPlaneUrl, async (client) => {
      const { rows } = await client.query<{ id: string; database_name: string }>(
        "SELECT id, database_name FROM tenants WHERE id = ANY($1)",
        [ids],
      );
      return new Map(rows.map((row) => [row.id, row.database_name]));
    });
    const databaseOf = (id: string): string => {
      const name = databases.get(id);
      if (!name) throw new Error(`no database recorded for ${id}`);
      return name;
    };

    const results: RunResult[] = [];
    let totalTicks = 0;
    for (const concurrency of concurrencies) {
      // Back to version 1, by hand: undo the example steps and the ledger rows, and the catalog.
      await pool(ids, 8, (id) =>
        withPg(databaseUrl(stack, databaseOf(id)), async (client) => {
          await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
          await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
          await client.query("DELETE FROM lessor.schema_migrations WHERE version > 1");
        }),
      );
      await withPg(stack.controlPlaneUrl, (client) =>
        client.query("UPDATE tenants SET schema_version = 1 WHERE id = ANY($1::text[])", [ids]),
      );
      const created = (await api("/v1/campaigns", {
        method: "POST",
        json: { toVersion: latestVersion, concurrency, canaryPercent: 5, force: true, tenants: ids },
      })) as { campaign: { id: string }; enrolled: number };
      if (created.enrolled !== tenantCount)
        throw new Error(`enrolled ${created.enrolled}, not ${tenantCount}`);
      const id = created.campaign.id;
      const started = performance.now();
      let ticks = 0;
      let state = "pending";
      while (!finishedStates.includes(state)) {
        if (ticks > tenantCount * 3) {
          const stuck = await api(`/v1/campaigns/${id}?limit=3`);
          throw new Error(
            `campaign ${id} did not finish in ${ticks} ticks: ${JSON.stringify(stuck)}\n${wrangler.tail()}`,
          );
        }
        const tick = await fetch(`${base}/__scheduled?cron=*+*+*+*+*`);
        if (!tick.ok) throw new Error(`/__scheduled: ${tick.status} ${await tick.text()}`);
        await tick.text();
        ticks++;
        totalTicks++;
        await wrangler.campaignJobRuns(totalTicks, 120_000);
        state = (await progressOf(id)).state;
      }
      const seconds = (performance.now() - started) / 1000;
      const view = (await api(`/v1/campaigns/${id}?limit=1`)) as {
        counts: { succeeded: number; failed: number; skipped: number };
      };
      if (state !== "done" || view.counts.succeeded !== tenantCount) {
        throw new Error(`campaign ${id} ended ${state}: ${JSON.stringify(view.counts)}`);
      }
      // Trust, but verify: every database recorded each version exactly once.
      await pool(ids, 8, (tenant) =>
        withPg(databaseUrl(stack, databaseOf(tenant)), async (client) => {
          const { rows } = await client.query(
            "SELECT count(*)::int AS n, count(DISTINCT version)::int AS d, max(version) AS v FROM lessor.schema_migrations",
          );
          const row = rows[0] as { n: number; d: number; v: number } | undefined;
          if (row?.n !== latestVersion || row.d !== latestVersion || row.v !== latestVersion) {
            throw new Error(`${tenant}: ledger ${JSON.stringify(row)}`);
          }
        }),
      );
      const result: RunResult = {
        concurrency,
        tenants: tenantCount,
        ticks,
        seconds: Number(seconds.toFixed(2)),
        tenantsPerSecond: Number((tenantCount / seconds).toFixed(2)),
        meanTickMs: Math.round((seconds * 1000) / ticks),
      };
      results.push(result);
      console.log(
        `concurrency ${concurrency}: ${tenantCount} tenants in ${result.seconds} s over ${ticks} ticks → ${result.tenantsPerSecond} tenants/s (mean tick ${result.meanTickMs} ms)`,
      );
    }

    const date = new Date().toISOString();
    const out = resolve(root, "bench/results", `campaign-${date.slice(0, 10)}.json`);
    mkdirSync(resolve(root, "bench/results"), { recursive: true });
    writeFileSync(
      out,
      `${JSON.stringify(
        {
          benchmark: "campaign",
          date,
          machine: {
            cpus: cpus().length,
            cpuModel: cpus()[0]?.model ?? null,
            memoryGb: Math.round(totalmem() / 2 ** 30),
          },
          node: process.version,
          // Other work on the machine while the bench ran (1-minute load average at the end).
          loadAverage1m: Number((loadavg()[0] ?? 0).toFixed(2)),
          setup: {
            tenants: tenantCount,
            migration: `schema version 1 → ${latestVersion} (the example expand and contract steps)`,
            ticks: "back to back through wrangler dev /__scheduled (production: one per minute)",
            canaryPercent: 5,
            stack: "wrangler dev (workerd) + embedded Postgres via the local WebSocket proxy, one machine",
          },
          results,
        },
        null,
        2,
      )}\n`,
    );
    console.log(`wrote ${out}`);
  } finally {
    await shutdown();
  }
}

await main();
