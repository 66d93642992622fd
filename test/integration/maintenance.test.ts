/**
 * Maintenance inside the budget (issue 16): every connection Lessor opens outside a pool
 * (provisioning, migrations, upgrade on demand, admin statements) holds a slot of the host's
 * maintenance reserve, so pools plus maintenance never exceed the host's connections. The `tiny`
 * host (vitest.config.ts) has 12 connections, 2 of them the reserve; Postgres is shared with other
 * files, so backends are counted by this file's roles and the `tiny` host's admin name.
 */
import { createExecutionContext, env, waitOnExecutionContext } from "cloudflare:test";
import { describe, expect, it, vi } from "vitest";
import { app } from "../../src/app.ts";
import { budgetHooksForTests } from "../../src/budget-object/test-hooks.ts";
import { runCampaignTick } from "../../src/campaigns/runner.ts";
import { loadConfig } from "../../src/config/index.ts";
import { controlPlaneOutageForTests } from "../../src/control-plane/index.ts";
import { unseal } from "../../src/crypto/seal.ts";
import { withTenantConnection } from "../../src/postgres/index.ts";
import type { CapacityStatus } from "../../src/rpc/budget.ts";
import { sessionLimits, tenantCredential } from "../../src/tenant-db/connect.ts";
import { maintenanceRenewal, withMaintenanceSlot } from "../../src/tenant-db/maintenance.ts";
import { migrationLockKey } from "../../src/tenant-db/migrator.ts";
import { reapOrphanBackends } from "../../src/tenant-db/orphans.ts";
import {
  admin,
  asSuperuser,
  base,
  type CreatedTenant,
  createTenant,
  mapConcurrent,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

const host = "tiny";
const connections = 12;
const reserve = 2;
const poolCapacity = connections - reserve;
const minute = 60_000;

const fileRoles: string[] = [];

async function newTenants(prefix: string, count: number, tier = "free"): Promise<CreatedTenant[]> {
  const created = await mapConcurrent(
    Array.from({ length: count }, () => uniqueTenantId(prefix)),
    6,
    (id) => createTenant(id, { host, tier }),
  );
  fileRoles.push(...created.map((t) => t.role));
  return created;
}

async function capacity(): Promise<CapacityStatus> {
  const response = await admin("/v1/capacity");
  if (response.status !== 200) throw new Error(`capacity: ${response.status}`);
  const { hosts } = await response.json<{ hosts: CapacityStatus[] }>();
  const status = hosts.find((h) => h.host === host);
  if (!status) throw new Error(`capacity lists no ${host} host`);
  return status;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Waits (bounded: a hang detector, not a measure) until `done()` holds; the caller asserts after. */
async function until(done: () => boolean, attempts = 400): Promise<void> {
  for (let i = 0; i < attempts && !done(); i++) await sleep(25);
}

/** Rolls tenants back to schema version 1 (database, catalog, and their objects' records). */
async function rollBackToV1(tenants: readonly CreatedTenant[]): Promise<void> {
  await mapConcurrent(tenants, 6, (tenant) =>
    asSuperuser(async (client) => {
      await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
      await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
      await client.query("DELETE FROM lessor.schema_migrations WHERE version > 1");
    }, tenant.database),
  );
  await asSuperuser(
    (client) =>
      client.query("UPDATE tenants SET schema_version = 1 WHERE id = ANY($1::text[])", [
        tenants.map((t) => t.id),
      ]),
    "lessor",
  );
  // Enabling an active tenant reloads its object's record from the catalog.
  await mapConcurrent(tenants, 6, async (tenant) => {
    expect((await admin(`/v1/tenants/${tenant.id}/enable`, { method: "POST" })).status).toBe(200);
  });
}

function databaseVersion(tenant: CreatedTenant): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT max(version)::int AS v FROM lessor.schema_migrations");
    return Number(rows[0]?.v ?? 0);
  }, tenant.database);
}

interface Samples {
  count: number;
  maxLedger: number;
  maxMaintenance: number;
  maxBackends: number;
  violations: string[];
}

/** Samples the ledger, the reserve and the host's real backends every 50 ms until stopped. */
function startSampler(): { stop: () => Promise<Samples> } {
  const samples: Samples = { count: 0, maxLedger: 0, maxMaintenance: 0, maxBackends: 0, violations: [] };
  let running = true;
  const done = asSuperuser(async (client) => {
    for (let i = 0; (running || samples.count === 0) && i < 6_000; i++) {
      const [status, result] = await Promise.all([
        capacity(),
        client.query(
          `SELECT count(*)::int AS n, array_agg(application_name) AS apps FROM pg_stat_activity
            WHERE (application_name LIKE 'lessor:%' AND usename = ANY($1::text[]))
               OR application_name LIKE 'lessor:host:${host}:%'`,
          [fileRoles],
        ),
      ]).catch(() => [null, null] as const);
      if (!status || !result) {
        await sleep(50);
        continue;
      }
      const row = result.rows[0] as { n: number; apps: string[] | null } | undefined;
      const backends = Number(row?.n ?? 0);
      const ledger = status.allocated + status.reserved + status.draining;
      samples.count++;
      samples.maxLedger = Math.max(samples.maxLedger, ledger);
      samples.maxMaintenance = Math.max(samples.maxMaintenance, status.maintenance.inUse);
      samples.maxBackends = Math.max(samples.maxBackends, backends);
      if (ledger > poolCapacity) samples.violations.push(`ledger ${ledger} > ${poolCapacity}`);
      if (status.maintenance.inUse > reserve) {
        samples.violations.push(`maintenance ${status.maintenance.inUse} > ${reserve}`);
      }
      if (ledger + status.maintenance.inUse > connections) {
        samples.violations.push(`pools ${ledger} + maintenance ${status.maintenance.inUse} > ${connections}`);
      }
      if (backends > connections) {
        samples.violations.push(`${backends} backends > ${connections}: ${(row?.apps ?? []).join(", ")}`);
      }
      await sleep(50);
    }
  });
  return {
    stop: async () => {
      running = false;
      await done;
      return samples;
    },
  };
}

/** A `/sql` request through the app with upgrade on demand, retried after each 503's Retry-After. */
async function upgradeOnDemand(tenant: CreatedTenant, version: number): Promise<number[]> {
  const statuses: number[] = [];
  for (let attempt = 0; attempt < 40; attempt++) {
    const ctx = createExecutionContext();
    const response = await app.fetch(
      new Request(`${base}/sql`, {
        method: "POST",
        headers: {
          "Neon-Connection-String": tenant.connectionString,
          "content-type": "application/json",
          "Lessor-Schema-Version": String(version),
        },
        body: JSON.stringify({ query: "SELECT 1", params: [] }),
      }),
      { ...env, LESSOR_UPGRADE_ON_DEMAND: "true" },
      ctx,
    );
    await waitOnExecutionContext(ctx);
    statuses.push(response.status);
    if (response.status === 200) return statuses;
    const body = await response.json<{ code: string }>();
    if (response.status !== 503) throw new Error(`upgrade ${tenant.id}: ${response.status} ${body.code}`);
    await sleep(Number(response.headers.get("Retry-After") ?? 1) * 250);
  }
  throw new Error(`upgrade ${tenant.id}: never served: ${statuses.join(",")}`);
}

/** Plain traffic: starts the tenant's pool, retried after 503s. */
async function serve(tenant: CreatedTenant): Promise<void> {
  for (let attempt = 0; attempt < 40; attempt++) {
    const response = await sqlRequest(tenant.connectionString, { query: "SELECT 1" });
    await response.text();
    if (response.status === 200) return;
    if (response.status !== 503) throw new Error(`serve ${tenant.id}: ${response.status}`);
    await sleep(Number(response.headers.get("Retry-After") ?? 1) * 250);
  }
  throw new Error(`serve ${tenant.id}: never served`);
}

async function runCampaign(tenants: readonly CreatedTenant[], toVersion: number): Promise<void> {
  const created = await admin("/v1/campaigns", {
    method: "POST",
    json: { toVersion, tenants: tenants.map((t) => t.id), force: true },
  });
  expect(created.status).toBe(201);
  const { campaign } = await created.json<{ campaign: { id: string } }>();
  for (let i = 0; i < 40; i++) {
    const view = await (await admin(`/v1/campaigns/${campaign.id}`)).json<{ campaign: { state: string } }>();
    if (view.campaign.state === "done") return;
    // Each tick a little later, so deferred tenants are due again.
    await runCampaignTick(env, { campaignId: campaign.id, now: Date.now() + i * minute });
  }
  throw new Error(`campaign ${campaign.id} did not complete`);
}

describe("maintenance connections are leased from the budget", () => {
  it("an upgrade on demand across 30 tenants, pools starting and two campaigns never exceed the budget", async () => {
    const tenants = await newTenants("mnt", 30);
    await rollBackToV1(tenants);
    const sampler = startSampler();
    let samples: Samples | null = null;
    try {
      await Promise.all([
        mapConcurrent(tenants.slice(0, 20), 20, (tenant) => upgradeOnDemand(tenant, 2)),
        mapConcurrent(tenants.slice(20), 10, serve),
        runCampaign(tenants.slice(20, 25), 3),
        runCampaign(tenants.slice(25, 30), 3),
      ]);
    } finally {
      samples = await sampler.stop();
    }
    expect(samples.violations).toEqual([]);
    expect(samples.count).toBeGreaterThan(5);
    // Maintenance really ran, and really was capped by the reserve.
    expect(samples.maxMaintenance).toBeGreaterThanOrEqual(1);
    for (const tenant of tenants.slice(0, 20))
      expect(await databaseVersion(tenant)).toBeGreaterThanOrEqual(2);
    for (const tenant of tenants.slice(20)) expect(await databaseVersion(tenant)).toBe(3);
    // Every slot was given back.
    const after = await pollUntil(capacity, (s) => s.maintenance.inUse === 0, {
      attempts: 40,
      intervalMs: 100,
    });
    expect(after.maintenance).toMatchObject({ inUse: 0, waiting: 0 });
  }, 240_000);

  it("with the reserve held, an upgrade answers 503 maintenance_busy and a campaign defers the tenant, not fails it", async () => {
    const [tenant] = await newTenants("mnt-busy", 1);
    if (!tenant) throw new Error("no tenant");
    await rollBackToV1([tenant]);
    const budget = env.BUDGETS.getByName(host);
    const held = await Promise.all(
      Array.from({ length: reserve }, () =>
        budget.acquireMaintenance(host, { purpose: "test-hold", tenantId: null, holdMs: 60_000, waitMs: 0 }),
      ),
    );
    try {
      expect(held.every((g) => g.granted)).toBe(true);
      const status = await capacity();
      expect(status.maintenance).toMatchObject({ inUse: reserve, byPurpose: { "test-hold": reserve } });
      // A third is refused at once when it will not wait.
      const third = await budget.acquireMaintenance(host, {
        purpose: "test-hold",
        tenantId: null,
        holdMs: 60_000,
        waitMs: 0,
      });
      expect(third.granted).toBe(false);

      const ctx = createExecutionContext();
      const refused = await app.fetch(
        new Request(`${base}/sql`, {
          method: "POST",
          headers: {
            "Neon-Connection-String": tenant.connectionString,
            "content-type": "application/json",
            "Lessor-Schema-Version": "2",
          },
          body: JSON.stringify({ query: "SELECT 1", params: [] }),
        }),
        { ...env, LESSOR_UPGRADE_ON_DEMAND: "true" },
        ctx,
      );
      await waitOnExecutionContext(ctx);
      expect(refused.status).toBe(503);
      expect(Number(refused.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
      expect(await refused.json()).toMatchObject({ code: "maintenance_busy" });

      const created = await admin("/v1/campaigns", {
        method: "POST",
        json: { toVersion: 2, tenants: [tenant.id], force: true },
      });
      const { campaign } = await created.json<{ campaign: { id: string } }>();
      await runCampaignTick(env, { campaignId: campaign.id });
      const view = await (await admin(`/v1/campaigns/${campaign.id}?limit=10`)).json<{
        campaign: { state: string };
        tenants: { state: string; reason: string | null }[];
      }>();
      expect(view.campaign.state).not.toBe("failed");
      expect(view.tenants[0]).toMatchObject({ state: "skipped", skipReason: "maintenance_busy" });
      expect(await databaseVersion(tenant)).toBe(1);
    } finally {
      for (const grant of held) if (grant.granted) await budget.releaseMaintenance(host, grant.leaseId);
    }
    // Released: the same upgrade now goes through.
    expect((await upgradeOnDemand(tenant, 2)).at(-1)).toBe(200);
    expect(await databaseVersion(tenant)).toBe(2);
  });

  it("a migration still running when the tick's time runs out is deferred to a later tick, not left claimed until the claim timeout", async () => {
    const [tenant] = await newTenants("mnt-slow", 1);
    if (!tenant) throw new Error("no tenant");
    await rollBackToV1([tenant]);
    const created = await admin("/v1/campaigns", {
      method: "POST",
      json: { toVersion: 2, tenants: [tenant.id], force: true },
    });
    const { campaign } = await created.json<{ campaign: { id: string } }>();
    const view = async () =>
      (await admin(`/v1/campaigns/${campaign.id}?limit=10`)).json<{
        campaign: { state: string };
        tenants: { state: string; skipReason: string | null }[];
      }>();
    await asSuperuser(async (lock) => {
      // Hold the migrator's lock: the tick's migration waits past the tick's deadline.
      await lock.query("SELECT pg_advisory_lock($1)", [migrationLockKey]);
      try {
        const tick = await runCampaignTick(env, { campaignId: campaign.id, deadlineMs: 8_000 });
        expect(tick.campaigns[0]).toMatchObject({ claimed: 1, abandoned: 1, failed: 0 });
        const deferred = await view();
        expect(deferred.campaign.state).not.toBe("failed");
        expect(deferred.tenants[0]).toMatchObject({ state: "skipped", skipReason: "still_running" });
      } finally {
        await lock.query("SELECT pg_advisory_unlock($1)", [migrationLockKey]);
      }
    }, tenant.database);
    // The object's migration goes on under its own deadline and finishes.
    await pollUntil(
      () => databaseVersion(tenant),
      (version) => version === 2,
      { attempts: 100, intervalMs: 100 },
    );
    // Past the first back-off step (30 s) but well inside the 10-minute claim timeout: a later tick
    // asks again, finds the work done, and records it.
    const later = await runCampaignTick(env, { campaignId: campaign.id, now: Date.now() + 31_000 });
    expect(later.campaigns[0]).toMatchObject({ claimed: 1, succeeded: 1 });
    expect((await view()).tenants[0]).toMatchObject({ state: "succeeded" });
    // The first migration's slot comes back once its connection is closed (after the version is
    // visible); the tests after this one count on an empty reserve.
    await pollUntil(
      () => capacity(),
      (status) => status.maintenance.inUse === 0,
      { attempts: 100, intervalMs: 100 },
    );
  }, 120_000);

  it("a migration whose tenant lookup finds no control plane is deferred, not skipped for good as an unknown tenant", async () => {
    const id = uniqueTenantId("mnt-nocp");
    controlPlaneOutageForTests.active = true;
    let during: Awaited<ReturnType<ReturnType<typeof env.TENANTS.getByName>["migrate"]>>;
    try {
      during = await env.TENANTS.getByName(id).migrate(id, 2, 1_000);
    } finally {
      controlPlaneOutageForTests.active = false;
    }
    expect(during).toEqual({ outcome: "skipped", reason: "control_plane_unavailable" });
    // With the control plane back, the same lookup says what it is: a tenant that does not exist.
    expect(await env.TENANTS.getByName(id).migrate(id, 2, 1_000)).toEqual({
      outcome: "skipped",
      reason: "tenant_unknown",
    });
  });

  it("a slot whose holder died comes back when its hold runs out, and a waiter gets it", async () => {
    const budget = env.BUDGETS.getByName(host);
    const before = (await capacity()).reconciled.maintenanceExpired;
    // Two holders that "die": they never release.
    for (let i = 0; i < reserve; i++) {
      const grant = await budget.acquireMaintenance(host, {
        purpose: "test-dead-holder",
        tenantId: null,
        holdMs: 300,
        waitMs: 0,
      });
      expect(grant.granted).toBe(true);
    }
    // A waiter queued behind them is granted once the first hold expires, within its wait.
    const waiter = await budget.acquireMaintenance(host, {
      purpose: "test-waiter",
      tenantId: null,
      holdMs: 10_000,
      waitMs: 10_000,
    });
    expect(waiter.granted).toBe(true);
    if (waiter.granted) await budget.releaseMaintenance(host, waiter.leaseId);
    const after = await capacity();
    expect(after.reconciled.maintenanceExpired).toBeGreaterThanOrEqual(before + 1);
    expect(after.maintenance.byPurpose["test-dead-holder"] ?? 0).toBe(0);
  });

  it("a living holder keeps its slot past the hold by renewing it; one that dies gives it back within the hold (issue 32)", async () => {
    const saved = { ...maintenanceRenewal };
    maintenanceRenewal.holdMs = 1_500;
    maintenanceRenewal.everyMs = 300;
    const config = loadConfig(env);
    // This test's holders' renewals, as the BudgetObject records them. Other holders on the host
    // (background work of other tests) renew too, and the clock this test moves may expire theirs:
    // only the lease that renewed as "test-alive" is judged.
    const renewals: boolean[] = [];
    let aliveLease: string | null = null;
    budgetHooksForTests.onMaintenanceRenewed = (leaseId, renewed, purpose) => {
      if (purpose === "test-alive") aliveLease ??= leaseId;
      if (leaseId === aliveLease) renewals.push(renewed);
    };
    // The slots' clock (this isolate's Date) moves only when the test moves it, and only after a
    // renewal has come at the current time: the hold runs out by the clock the test keeps, never
    // because a loaded machine delayed a renewal's timer.
    const start = Date.now();
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      vi.setSystemTime(start);
      // Alive for four holds: renewed all along, never expired.
      await withMaintenanceSlot(
        env,
        config,
        host,
        { purpose: "test-alive", tenantId: null, deadlineMs: 60_000 },
        async () => {
          for (let step = 1; step <= 8; step++) {
            const seen = renewals.length;
            await until(() => renewals.length > seen);
            expect(renewals.length, `a renewal before step ${step}`).toBeGreaterThan(seen);
            // Half a hold later than the renewal just seen: past the first hold from step 3 on,
            // and the slot is still held (an expired one is gone from the ledger).
            vi.setSystemTime(start + (step * maintenanceRenewal.holdMs) / 2);
            expect((await capacity()).maintenance.byPurpose["test-alive"], `held at step ${step}`).toBe(1);
          }
        },
      );
      expect(renewals.length).toBeGreaterThanOrEqual(8);
      expect(renewals.every(Boolean)).toBe(true);
      // Dead: a holder whose renewals stopped (as a killed one's do) while its work never ends. It
      // asked for a short hold, not its whole deadline (ten minutes here): the slot is free again
      // once that hold has passed on the clock.
      maintenanceRenewal.everyMs = 3_600_000;
      const deadFrom = Date.now();
      let finish: () => void = () => undefined;
      const dead = withMaintenanceSlot(
        env,
        config,
        host,
        { purpose: "test-dead", tenantId: null, deadlineMs: 600_000 },
        () =>
          new Promise<void>((resolve) => {
            finish = resolve;
          }),
      );
      const held = await pollUntil(capacity, (s) => s.maintenance.byPurpose["test-dead"] === 1, {
        attempts: 200,
        intervalMs: 50,
      });
      expect(held.maintenance.byPurpose["test-dead"]).toBe(1);
      vi.setSystemTime(deadFrom + maintenanceRenewal.holdMs - 1);
      expect((await capacity()).maintenance.byPurpose["test-dead"]).toBe(1);
      vi.setSystemTime(deadFrom + maintenanceRenewal.holdMs + 1);
      expect((await capacity()).maintenance.byPurpose["test-dead"] ?? 0).toBe(0);
      finish();
      await dead;
    } finally {
      vi.useRealTimers();
      budgetHooksForTests.onMaintenanceRenewed = undefined;
      Object.assign(maintenanceRenewal, saved);
    }
  });

  it("reconcile terminates a pooled backend that no object confirms, and leaves live ones", async () => {
    const [live, orphaned] = await newTenants("mnt-orphan", 2);
    if (!live || !orphaned) throw new Error("no tenants");
    await serve(live);
    // An orphan: a connection as the tenant's role, named as a pooled connection of generation 999,
    // which no object holds (what a killed object leaves behind when the host never saw its
    // socket close). It is opened the way Lessor opens them: sealed password, login token.
    const config = loadConfig(env);
    const sealed = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        "SELECT sealed_password FROM tenant_credentials WHERE tenant_id = $1",
        [orphaned.id],
      );
      return String(rows[0]?.sealed_password);
    }, "lessor");
    const credential = await tenantCredential(
      config,
      { host, roleName: orphaned.role, databaseName: orphaned.database },
      await unseal(env.LESSOR_SEAL_KEY, orphaned.id, sealed),
    );
    let letGo: () => void = () => undefined;
    const held = withTenantConnection(
      config,
      credential.target,
      {
        applicationName: `lessor:${orphaned.role}:999`,
        limits: sessionLimits(config),
        loginToken: credential.loginToken,
      },
      async (client) => {
        await client.query("SELECT 1");
        await new Promise<void>((resolve) => {
          letGo = resolve;
        });
      },
    );
    try {
      const before = await pollUntil(
        () => backendsOf([live.role, orphaned.role]),
        (rows) => rows.some((b) => b.app === `lessor:${orphaned.role}:999`),
        { attempts: 40, intervalMs: 100 },
      );
      const liveBackends = before.filter((b) => b.user === live.role).length;
      expect(liveBackends).toBeGreaterThan(0);

      const tinyHost = config.hosts.get(host);
      if (!tinyHost) throw new Error("no tiny host");
      const report = await reapOrphanBackends(env, config, tinyHost, 0);
      expect(report.terminated).toBe(1);
      const after = await pollUntil(
        () => backendsOf([live.role, orphaned.role]),
        (rows) => !rows.some((b) => b.app === `lessor:${orphaned.role}:999`),
        { attempts: 40, intervalMs: 100 },
      );
      expect(after.filter((b) => b.user === orphaned.role)).toEqual([]);
      // The live tenant's pooled backends were confirmed by its object and left alone.
      expect(after.filter((b) => b.user === live.role).length).toBe(liveBackends);
      await serve(live);
      // A second run finds nothing more to do; the terminations are counted for operators.
      expect((await reapOrphanBackends(env, config, tinyHost, 0)).terminated).toBe(0);
    } finally {
      letGo();
      // The terminated connection may never answer its close: do not wait on it for long.
      await Promise.race([held.catch(() => undefined), sleep(2_000)]);
    }
  });
});

function backendsOf(roles: string[]): Promise<{ user: string; app: string }[]> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT usename AS user, application_name AS app FROM pg_stat_activity WHERE usename = ANY($1::text[])",
      [roles],
    );
    return rows as { user: string; app: string }[];
  });
}
