/**
 * Maintenance all at once (issue 18): on one small host (reserve 2), concurrently, a fold, a
 * campaign tick, provisioning of new tenants, the budget reconcile, an on-demand upgrade and a
 * drain. The test holds both maintenance slots until at least three of the jobs wait for one, so
 * they do contend. No deadlock (none in the server's own log, none in `pg_stat_database` once the
 * backends involved have exited and flushed their statistics), every job settles, and every job
 * completes or defers cleanly (`maintenance_busy`, `tenant_migrating`, a skipped step: each with a
 * retry path that then works). The lock order the jobs follow is written down in
 * docs/adr/014-lock-order.md.
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
  pollUntil,
  sqlFor,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";
import { markServerLog, serverLogLines } from "./server-log.ts";

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

/**
 * Deadlocks Postgres counted in these databases. Read once no backend of them is left: a backend
 * keeps its counts in memory until it flushes them (at the latest when it exits).
 */
async function deadlocksOnceFlushed(databases: string[]): Promise<number> {
  const left = await pollUntil(
    () =>
      asSuperuser(async (client) => {
        const { rows } = await client.query(
          "SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = ANY($1) AND pid <> pg_backend_pid()",
          [databases],
        );
        return Number(rows[0]?.n ?? 0);
      }),
    (n) => n === 0,
  );
  expect(left).toBe(0);
  return asSuperuser(async (client) => {
    await client.query("SELECT pg_stat_clear_snapshot()");
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
  it("a fold, a campaign tick, provisioning, the reconcile, an on-demand upgrade and a drain, contending for two slots: no deadlock, every job settles, clean deferrals", {
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
    const from = await markServerLog();

    // Both maintenance slots of the host are taken (by the test) when the storm starts, and given
    // back once at least three of its jobs wait for one: from then on they contend for two.
    const tiny = env.BUDGETS.getByName("tiny");
    const holds: string[] = [];
    for (let i = 0; i < 2; i++) {
      const grant = await tiny.acquireMaintenance("tiny", {
        purpose: "test-hold",
        tenantId: null,
        holdMs: 120_000,
        waitMs: 30_000,
      });
      if (!grant.granted) throw new Error("the test could not take the host's maintenance slots");
      holds.push(grant.leaseId);
    }
    const tick = { cron: "* * * * *", scheduledTime: Date.now(), region: "default" };
    let contended = 0;
    let outcome: Settled[];
    try {
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
      contended = await pollUntil(
        async () => (await tiny.status("tiny", 0)).maintenance.waiting,
        (n) => n >= 3,
        { attempts: 200, intervalMs: 10 },
      );
      for (const leaseId of holds.splice(0)) await tiny.releaseMaintenance("tiny", leaseId);
      // Every job settles (a job that never did would hold the test to its timeout).
      outcome = await jobs;
    } finally {
      for (const leaseId of holds) await tiny.releaseMaintenance("tiny", leaseId);
    }
    expect(contended).toBeGreaterThanOrEqual(3);

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

    // Postgres detected no deadlock: each one is an ERROR the detecting backend logs at once.
    expect(await serverLogLines(from, await markServerLog(), "deadlock detected")).toEqual([]);

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
    // And Postgres's own count agrees, read once the tenants' backends have gone and flushed it.
    for (const tenant of [migrateA, migrateB, upgradeC]) {
      await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: { force: true } });
    }
    expect(await deadlocksOnceFlushed([migrateA.database, migrateB.database, upgradeC.database])).toBe(0);
  });
});
