/**
 * `npm run bench:campaign`: how fast a migration campaign moves a fleet, at concurrency 1, 4 and 8.
 *
 * Starts its own stack (a throwaway Postgres under .lessor/bench-campaign-pg and the WebSocket
 * proxy) and `wrangler dev --test-scheduled` on a snapshot of the fleet bench Worker (Lessor
 * unchanged, with its scheduled handler; bench/processes.ts), provisions TENANTS tenants, and for
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
import { randomBytes } from "node:crypto";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { freePort, freshWorkerSecrets, localWorkerVars, root, startLocalStack } from "../local/stack.ts";
import {
  admin,
  asSuperuser,
  type BenchRunning,
  inParallel,
  machineFacts,
  provision,
  stopOnExit,
  tenantDatabaseNames,
  wranglerVars,
} from "./harness.ts";
import { cronTick, type ScheduledWrangler, startScheduledWrangler } from "./processes.ts";

const tenantCount = Number(process.env.TENANTS ?? 100);
const concurrencies = [1, 4, 8];
const latestVersion = 3;
const finishedStates = ["done", "failed", "cancelled"];
const stateDir = resolve(root, ".lessor");
const pgDir = resolve(stateDir, "bench-campaign-pg");
const persistDir = resolve(stateDir, "bench-campaign-wrangler");
const snapshotDir = resolve(stateDir, "bench-campaign-src");
const envFile = resolve(stateDir, "bench-campaign.vars");
const secrets = freshWorkerSecrets();
const adminKey = secrets.adminKey;
const running: BenchRunning & { wrangler: ScheduledWrangler | null } = { stack: null, wrangler: null };
const cleanup = stopOnExit("bench:campaign", envFile, running);

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
  running.stack = stack;
  try {
    console.log("building and starting wrangler dev …");
    // The fleet bench Worker (Lessor unchanged, plus its scheduled handler for `--test-scheduled`)
    // on a snapshot of the sources, with Lessor's [vars]: what bench:fleet and the soak tick too.
    const wrangler = await startScheduledWrangler({
      env: {
        ...wranglerVars(),
        ...localWorkerVars(stack, secrets, {
          // Concurrency 8 needs 8 maintenance connections: each migration holds one outside the
          // pool, and the runner keeps a host's migrations within its budget reserve.
          LESSOR_BUDGETS: JSON.stringify({ "*": { connections: 200, reserve: 10 } }),
        }),
      },
      envFile,
      persistDir,
      snapshotDir,
      // A private dev registry: another `wrangler dev` starting on this machine (a demo, another
      // bench) would otherwise update the shared one, and every instance reloads on that.
      registryDir: resolve(stateDir, "bench-campaign-registry"),
      config: "bench/fleet-wrangler.toml",
      benchFiles: ["worker.ts", "fleet-worker.ts", "lessor-entry.js", "fleet-wrangler.toml"],
    });
    running.wrangler = wrangler;
    const base = wrangler.publicUrl;
    const api = (path: string, body?: unknown) => admin(base, adminKey, path, body);
    const stateOf = async (id: string) =>
      ((await api(`/v1/campaigns/${id}?limit=1`)) as { campaign: { state: string } }).campaign.state;

    console.log(`provisioning ${tenantCount} tenants …`);
    const ids = Array.from({ length: tenantCount }, (_, i) => `bench-${String(i).padStart(4, "0")}`);
    // Creates share the host's maintenance reserve: `provision` retries maintenance_busy.
    await inParallel(ids, 8, async (id) => {
      await provision(base, adminKey, id);
    });

    // Tenant databases have opaque names chosen at provisioning: read them from the catalog.
    const databases = await tenantDatabaseNames(stack.controlPlaneUrl);
    const databaseUrlOf = (id: string): string => {
      const name = databases.get(id);
      if (!name) throw new Error(`no database recorded for ${id}`);
      return stack.pg.url(name);
    };

    const results: RunResult[] = [];
    for (const concurrency of concurrencies) {
      // Back to version 1, by hand: undo the example steps and the ledger rows, and the catalog.
      await inParallel(ids, 8, (id) =>
        asSuperuser(databaseUrlOf(id), async (client) => {
          await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
          await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
          await client.query("DELETE FROM lessor.schema_migrations WHERE version > 1");
        }),
      );
      await asSuperuser(stack.controlPlaneUrl, (client) =>
        client.query("UPDATE tenants SET schema_version = 1 WHERE id = ANY($1::text[])", [ids]),
      );
      const created = (await api("/v1/campaigns", {
        toVersion: latestVersion,
        concurrency,
        canaryPercent: 5,
        force: true,
        tenants: ids,
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
        // /__scheduled answers at once and the jobs run under waitUntil: the tick is over when the
        // campaign job has logged its end.
        await cronTick(wrangler, ["migration-campaigns"], 120_000);
        ticks++;
        state = await stateOf(id);
      }
      const seconds = (performance.now() - started) / 1000;
      const view = (await api(`/v1/campaigns/${id}?limit=1`)) as {
        counts: { succeeded: number; failed: number; skipped: number };
      };
      if (state !== "done" || view.counts.succeeded !== tenantCount) {
        throw new Error(`campaign ${id} ended ${state}: ${JSON.stringify(view.counts)}`);
      }
      // Trust, but verify: every database recorded each version exactly once.
      await inParallel(ids, 8, (tenant) =>
        asSuperuser(databaseUrlOf(tenant), async (client) => {
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
          // With the load averages at the end: other work on the machine while the bench ran.
          machine: machineFacts(),
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
    await cleanup();
  }
}

await main();
