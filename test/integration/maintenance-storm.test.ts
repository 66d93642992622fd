/**
 * Maintenance all at once (issue 18): on one small host (reserve 2), concurrently, a fold, a
 * campaign tick, provisioning of new tenants, the budget reconcile, an on-demand upgrade and a
 * drain. No deadlock, no lock wait beyond its bound, and every job completes or defers cleanly
 * (`maintenance_busy`, `tenant_migrating`, a skipped step: each with a retry path that then works).
 * The lock order the jobs follow is written down in docs/adr/014-lock-order.md.
 */
import { createExecutionContext, env, waitOnExecutionContext } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { app } from "../../src/app.ts";
import { runCampaignTick } from "../../src/campaigns/runner.ts";
import { budgetReconcileJob } from "../../src/cron/jobs/budget-reconcile.ts";
import { usageFoldJob } from "../../src/cron/jobs/usage-fold.ts";
import {
  admin,
  asSuperuser,
  base,
  type CreatedTenant,
  createTenant,
  mapConcurrent,
  sqlFor,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

/** Every job must have settled by then: far past any lock_timeout (5 s) or admission wait (2 s). */
const stormBoundMs = 90_000;
/** A lock wait longer than this is one no bound cut short (lock_timeout is 5 s in tests). */
const lockWaitBoundMs = 15_000;

async function rollBack(tenant: CreatedTenant, version: number): Promise<void> {
  await asSuperuser(async (client) => {
    if (version < 3) await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
    if (version < 2) await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
    await client.query("DELETE FROM lessor.schema_migrations WHERE version > $1", [version]);
  }, tenant.database);
  await asSuperuser(
    (client) => client.query("UPDATE tenants SET schema_version = $1 WHERE id = $2", [version, tenant.id]),
    "lessor",
  );
  expect((await admin(`/v1/tenants/${tenant.id}/enable`, { method: "POST" })).status).toBe(200);
}

function schemaVersionOf(tenant: CreatedTenant): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT max(version)::int AS v FROM lessor.schema_migrations");
    return Number(rows[0]?.v ?? 0);
  }, tenant.database);
}

/** A `/sql` request from an app built for schema `version`, with upgrades on demand enabled. */
async function viaNewerApp(tenant: CreatedTenant, version: number): Promise<Response> {
  const ctx = createExecutionContext();
  const response = await app.fetch(
    new Request(`${base}/sql`, {
      method: "POST",
      headers: {
        "Neon-Connection-String": tenant.connectionString,
        "Neon-Raw-Text-Output": "true",
        "Neon-Array-Mode": "true",
        "content-type": "application/json",
        "Lessor-Schema-Version": String(version),
      },
      body: JSON.stringify({ query: "SELECT 1", params: [] }),
    }),
    { ...env, LESSOR_UPGRADE_ON_DEMAND: "true" },
    ctx,
  );
  await waitOnExecutionContext(ctx);
  return response;
}

interface LockWait {
  app: string;
  waitedMs: number;
  lock: string;
}

/** Backends of this cluster waiting on a lock, with how long they have waited (by state_change). */
function lockWaits(names: { roles: string[]; apps: string }): Promise<LockWait[]> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      `SELECT application_name AS app,
              (extract(epoch FROM clock_timestamp() - state_change) * 1000)::int AS "waitedMs",
              wait_event AS lock
         FROM pg_stat_activity
        WHERE wait_event_type = 'Lock' AND (usename = ANY($1) OR application_name LIKE $2)`,
      [names.roles, names.apps],
    );
    return rows as LockWait[];
  });
}

/** Deadlocks Postgres has detected in these databases since its stats began. */
function deadlocks(databases: string[]): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT coalesce(sum(deadlocks), 0)::int AS n FROM pg_stat_database WHERE datname = ANY($1)",
      [databases],
    );
    return Number(rows[0]?.n ?? 0);
  });
}

type Settled = { job: string; ok: true; value: unknown } | { job: string; ok: false; error: string };

async function settle(job: string, work: () => Promise<unknown>): Promise<Settled> {
  try {
    return { job, ok: true, value: await work() };
  } catch (error) {
    return { job, ok: false, error: error instanceof Error ? error.message : String(error) };
  }
}

async function bodyOf(
  response: Response,
): Promise<{ status: number; code?: string; retryAfter: string | null }> {
  const text = await response.text();
  let code: string | undefined;
  try {
    code = (JSON.parse(text) as { code?: string }).code;
  } catch {
    code = undefined;
  }
  return {
    status: response.status,
    ...(code ? { code } : {}),
    retryAfter: response.headers.get("Retry-After"),
  };
}

describe("maintenance all at once", () => {
  it("a fold, a campaign tick, provisioning, the reconcile, an on-demand upgrade and a drain: no deadlock, bounded waits, clean deferrals", {
    timeout: 240_000,
  }, async () => {
    // The stage: all on the `tiny` host (2 maintenance slots), so the jobs contend for them.
    const [migrateA, migrateB, upgradeC, drainD] = await mapConcurrent(["a", "b", "c", "d"], 2, (name) =>
      createTenant(uniqueTenantId(`storm-${name}`), { host: "tiny", tier: "free" }),
    );
    if (!migrateA || !migrateB || !upgradeC || !drainD) throw new Error("no tenants");
    for (const tenant of [migrateA, migrateB, upgradeC]) await rollBack(tenant, 1);
    // Traffic for the fold to fold, and warm pools for the drain and the reconcile to look at.
    await mapConcurrent(
      [migrateA, migrateB, upgradeC, drainD],
      4,
      (tenant) => sqlFor(tenant)`INSERT INTO notes (body) VALUES ('before the storm')`,
    );
    const created = await admin("/v1/campaigns", {
      method: "POST",
      json: { toVersion: 2, tenants: [migrateA.id, migrateB.id], force: true, canaryPercent: 50 },
    });
    expect(created.status, await created.clone().text()).toBe(201);
    const campaignId = (await created.json<{ campaign: { id: string } }>()).campaign.id;
    const newIds = Array.from({ length: 3 }, () => uniqueTenantId("storm-new"));
    const roles = (
      await asSuperuser(
        async (client) =>
          (
            await client.query("SELECT role_name FROM tenants WHERE id = ANY($1)", [
              [migrateA.id, migrateB.id, upgradeC.id, drainD.id],
            ])
          ).rows as { role_name: string }[],
        "lessor",
      )
    ).map((row) => row.role_name);
    const databases = ["lessor", "postgres", migrateA.database, migrateB.database, upgradeC.database];
    const deadlocksBefore = await deadlocks(databases);

    // A sampler watches lock waits while the storm runs.
    let storming = true;
    const waits: LockWait[] = [];
    const sampler = (async () => {
      for (let i = 0; i < 2_000 && storming; i++) {
        waits.push(...(await lockWaits({ roles, apps: "lessor%" }).catch(() => [])));
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    })();

    const tick = { cron: "* * * * *", scheduledTime: Date.now() };
    const jobs = Promise.all([
      settle("fold", () => usageFoldJob.run(env, tick)),
      settle("campaign", () => runCampaignTick(env, { campaignId })),
      settle("campaign-again", () => runCampaignTick(env, { campaignId })),
      ...newIds.map((id) =>
        settle(`provision ${id}`, async () =>
          bodyOf(await admin("/v1/tenants", { method: "POST", json: { id, host: "tiny", tier: "free" } })),
        ),
      ),
      settle("reconcile", () => budgetReconcileJob.run(env, tick)),
      settle("upgrade", async () => bodyOf(await viaNewerApp(upgradeC, 2))),
      settle("drain", async () =>
        bodyOf(await admin(`/v1/tenants/${drainD.id}/drain`, { method: "POST", json: {} })),
      ),
    ]);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const outcome = await Promise.race([
      jobs,
      new Promise<"deadlock">((resolve) => {
        timer = setTimeout(() => resolve("deadlock"), stormBoundMs);
      }),
    ]);
    clearTimeout(timer);
    storming = false;
    await sampler;
    expect(outcome).not.toBe("deadlock");
    if (outcome === "deadlock") return;

    // Every job completed or deferred cleanly.
    const byJob = new Map(outcome.map((o) => [o.job, o]));
    for (const o of outcome) expect(o.ok, JSON.stringify(o)).toBe(true);
    const fold = byJob.get("fold");
    expect(JSON.stringify(fold)).not.toContain('"failed"');
    for (const name of ["campaign", "campaign-again"]) {
      const report = byJob.get(name);
      if (!report?.ok) continue;
      const campaigns = (report.value as { campaigns: { failed: number }[] }).campaigns;
      for (const c of campaigns) expect(c.failed, JSON.stringify(report)).toBe(0);
    }
    for (const id of newIds) {
      const answer = byJob.get(`provision ${id}`);
      if (!answer?.ok) continue;
      const value = answer.value as { status: number; code?: string; retryAfter: string | null };
      if (value.status !== 201) {
        expect(value, JSON.stringify(value)).toMatchObject({ status: 503, code: "maintenance_busy" });
        expect(Number(value.retryAfter)).toBeGreaterThanOrEqual(1);
      }
    }
    const upgrade = byJob.get("upgrade");
    if (upgrade?.ok) {
      const value = upgrade.value as { status: number; code?: string; retryAfter: string | null };
      if (value.status !== 200) {
        expect(["tenant_migrating", "maintenance_busy"], JSON.stringify(value)).toContain(value.code);
        expect(Number(value.retryAfter)).toBeGreaterThanOrEqual(1);
      }
    }
    const drain = byJob.get("drain");
    expect(
      drain?.ok && [200, 202].includes((drain.value as { status: number }).status),
      JSON.stringify(drain),
    ).toBe(true);

    // No lock wait outlived its bound, and Postgres detected no deadlock.
    const longest = waits.reduce((max, w) => Math.max(max, w.waitedMs), 0);
    expect(longest, JSON.stringify(waits.filter((w) => w.waitedMs >= lockWaitBoundMs))).toBeLessThan(
      lockWaitBoundMs,
    );
    expect(await deadlocks(databases)).toBe(deadlocksBefore);

    // Whatever deferred goes through on its retry path, once the storm is over.
    for (const id of newIds) {
      const response = await admin(`/v1/tenants/${id}`);
      if (response.status === 200) continue;
      await createTenant(id, { host: "tiny", tier: "free" });
    }
    for (const id of newIds) expect((await admin(`/v1/tenants/${id}`)).status).toBe(200);
    // A tenant skipped for maintenance_busy is retried after its backoff: the ticks run ahead of it.
    for (let i = 0; i < 10; i++) {
      const view = await (await admin(`/v1/campaigns/${campaignId}`)).json<{ campaign: { state: string } }>();
      if (view.campaign.state === "done") break;
      await runCampaignTick(env, { campaignId, now: Date.now() + (i + 1) * 5 * 60_000 });
    }
    expect(await schemaVersionOf(migrateA)).toBe(2);
    expect(await schemaVersionOf(migrateB)).toBe(2);
    let upgraded = await viaNewerApp(upgradeC, 2);
    for (let i = 0; i < 5 && upgraded.status === 503; i++) {
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      upgraded = await viaNewerApp(upgradeC, 2);
    }
    expect(upgraded.status).toBe(200);
    expect(await schemaVersionOf(upgradeC)).toBe(2);
    // The drained tenant starts again on demand.
    expect((await sqlRequest(drainD.connectionString, { query: "SELECT 1", params: [] })).status).toBe(200);
    // And the host's ledger is whole: no maintenance slot left held once everything has closed.
    const capacity = await (await admin("/v1/capacity")).json<{
      hosts: { host: string; maintenance: { inUse: number; waiting: number } }[];
    }>();
    expect(capacity.hosts.find((h) => h.host === "tiny")?.maintenance).toMatchObject({
      inUse: 0,
      waiting: 0,
    });
  });
});
