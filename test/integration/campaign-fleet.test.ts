/**
 * Migration campaigns against real tenant databases: a fleet of 32 with a canary, a tenant that
 * fails on purpose and one that holds a session lease; pause, resume and cancel; a kill between
 * every pair of durable steps; two ticks at once; the expand/contract guard; and the
 * Lessor-Schema-Version header.
 *
 * 32 tenant databases are provisioned once; each test takes its own slice. Every tenant is
 * provisioned at the newest schema version, so each test first rolls its tenants back by hand
 * (superuser DDL in the tenant database, the catalog version). Campaigns name their tenants
 * (`tenants`), so nothing here touches another test file's tenants, and all but the guard's own
 * are forced, so app versions seen elsewhere never hold them back.
 */
import {
  createExecutionContext,
  createScheduledController,
  env,
  waitOnExecutionContext,
} from "cloudflare:test";
import { beforeAll, describe, expect, it } from "vitest";
import { app } from "../../src/app.ts";
import { type CampaignTickReport, runCampaignTick, type TickOptions } from "../../src/campaigns/runner.ts";
import worker from "../../src/index.ts";
import { tenantMigrations } from "../fixtures/tenant-schema/migrations.gen.ts";
import {
  admin,
  asSuperuser,
  base,
  type CreatedTenant,
  createTenant,
  lessor,
  mapConcurrent,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

/**
 * The example schema's last version. Its three migrations (two expand steps, then the contract step
 * 0002_example_note_slug_unique) are what these tests exercise; a project's own migrations come
 * after them (migrations only grow), so nothing here assumes that a version above 3 does not exist.
 */
const latest = 3;
/** The newest version this deployment bundles: 3 for the example schema, more once you add yours. */
const newest = Math.max(...tenantMigrations.map((step) => step.version));
const minute = 60_000;
/** Past the claim timeout (10 minutes): a resumed tick sees every unrecorded claim as dead. */
const afterClaimTimeout = 11 * minute;

interface CampaignView {
  campaign: {
    id: string;
    state: string;
    reason: string | null;
    blockedReason: string | null;
    contractSteps: number[];
    scope: string;
  };
  counts: {
    pending: number;
    running: number;
    succeeded: number;
    failed: number;
    skipped: number;
    total: number;
  };
  tenants: TenantResultView[];
  nextCursor: string | null;
}

interface TenantResultView {
  tenantId: string;
  cohort: "canary" | "rollout";
  state: string;
  fromVersion: number;
  toVersion: number | null;
  attempts: number;
  startedAt: string | null;
  finishedAt: string | null;
  skipReason: string | null;
  failureSummary: string | null;
}

/**
 * The 32 tenant databases every test draws on (each test takes its own slice and rolls it back
 * first): provisioning is the slow part, so it is done once.
 */
let fleet: CreatedTenant[] = [];

function slice(from: number, to: number): CreatedTenant[] {
  const tenants = fleet.slice(from, to);
  if (tenants.length !== to - from) throw new Error("the fleet was not provisioned");
  return tenants;
}

function one(index: number): CreatedTenant {
  const [tenant] = slice(index, index + 1);
  if (!tenant) throw new Error("the fleet was not provisioned");
  return tenant;
}

async function createTenants(prefix: string, count: number): Promise<CreatedTenant[]> {
  return mapConcurrent(
    Array.from({ length: count }, () => uniqueTenantId(prefix)),
    8,
    (id) => createTenant(id),
  );
}

/**
 * Rolls tenants back to `version` by hand: their databases and the catalog and, with `refresh`,
 * their objects' cached records (only `Lessor-Schema-Version` reads those; a migration reads the
 * database's own ledger).
 */
/**
 * A DDL log in a tenant database, test-only and out of the tenant role's reach: an event trigger
 * (superuser) records the text of every DDL statement that runs there. It is how the tests count a
 * migration's side effects rather than trusting the migrator's own ledger.
 */
const ddlLogSetup = `
  CREATE SCHEMA IF NOT EXISTS lessor_test;
  CREATE TABLE IF NOT EXISTS lessor_test.ddl_log (id serial PRIMARY KEY, tag text NOT NULL, query text NOT NULL);
  CREATE OR REPLACE FUNCTION lessor_test.log_ddl() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
    BEGIN INSERT INTO lessor_test.ddl_log (tag, query) VALUES (tg_tag, current_query()); END $$;
  DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'lessor_test_ddl_log') THEN
      CREATE EVENT TRIGGER lessor_test_ddl_log ON ddl_command_end EXECUTE FUNCTION lessor_test.log_ddl();
    END IF;
  END $$`;

/** Each fleet tenant's database, by id. */
function databaseOf(tenantId: string): string {
  const tenant = fleet.find((t) => t.id === tenantId);
  if (!tenant) throw new Error(`${tenantId} is not in the fleet`);
  return tenant.database;
}

/** The version each tenant was last rolled back to: the DDL log counts from there. */
const rolledBackTo = new Map<string, number>();

async function rollBack(tenants: readonly CreatedTenant[], version: number, refresh = false): Promise<void> {
  await mapConcurrent(tenants, 6, (tenant) =>
    asSuperuser(async (client) => {
      await client.query(ddlLogSetup);
      if (version < 3) await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
      if (version < 2) await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
      await client.query("DELETE FROM lessor.schema_migrations WHERE version > $1", [version]);
      // The rollback's own DDL is not a migration.
      await client.query("TRUNCATE lessor_test.ddl_log");
      rolledBackTo.set(tenant.id, version);
    }, tenant.database),
  );
  await asSuperuser(
    (client) =>
      client.query("UPDATE tenants SET schema_version = $1 WHERE id = ANY($2::text[])", [
        version,
        tenants.map((t) => t.id),
      ]),
    "lessor",
  );
  if (!refresh) return;
  // Enabling an active tenant reloads its object's record from the catalog.
  await mapConcurrent(tenants, 6, async (tenant) => {
    const response = await admin(`/v1/tenants/${tenant.id}/enable`, { method: "POST" });
    expect(response.status).toBe(200);
  });
}

/** The tenant database's own ledger: version → how many rows record it (its primary key makes that 1). */
function ledgerOf(tenantId: string): Promise<Map<number, number>> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT version, count(*)::int AS n FROM lessor.schema_migrations GROUP BY version ORDER BY version",
    );
    return new Map(rows.map((row: { version: number; n: number }) => [Number(row.version), Number(row.n)]));
  }, databaseOf(tenantId));
}

/**
 * The tenant database is at `version` (its ledger lists 1…`version`), and since its last rollback
 * every statement of every step up to `version` ran exactly once, by the DDL log: a step applied
 * twice, or a step re-run below the rollback point, fails this.
 */
async function expectMigratedOnce(tenantId: string, version: number): Promise<void> {
  const ledger = await ledgerOf(tenantId);
  expect([...ledger.keys()], tenantId).toEqual(Array.from({ length: version }, (_, i) => i + 1));
  const from = rolledBackTo.get(tenantId);
  if (from === undefined) return;
  const ran = await asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT query FROM lessor_test.ddl_log ORDER BY id");
    return rows.map((row: { query: string }) => row.query.trim());
  }, databaseOf(tenantId));
  for (const step of tenantMigrations) {
    for (const statement of step.statements) {
      const times = ran.filter((query) => query === statement.trim()).length;
      const expected = step.version > from && step.version <= version ? 1 : 0;
      expect({ tenantId, step: step.version, times }).toEqual({
        tenantId,
        step: step.version,
        times: expected,
      });
    }
  }
}

async function createCampaign(body: Record<string, unknown>) {
  const response = await admin("/v1/campaigns", { method: "POST", json: body });
  const text = await response.text();
  expect(response.status, text).toBe(201);
  return JSON.parse(text) as {
    campaign: CampaignView["campaign"];
    enrolled: number;
    canary: string[];
    alreadyCurrent: number;
  };
}

async function view(id: string, query = "limit=200"): Promise<CampaignView> {
  const response = await admin(`/v1/campaigns/${id}?${query}`);
  const text = await response.text();
  expect(response.status, text).toBe(200);
  return JSON.parse(text) as CampaignView;
}

function tick(campaignId: string, options: Omit<TickOptions, "campaignId"> = {}) {
  return runCampaignTick(env, { campaignId, ...options });
}

/** Ticks (bounded) until `done` holds for the campaign; returns the reports. */
async function tickUntil(
  campaignId: string,
  done: (v: CampaignView) => boolean,
  options: { now?: () => number; max?: number } = {},
): Promise<CampaignTickReport[]> {
  const reports: CampaignTickReport[] = [];
  for (let i = 0; i < (options.max ?? 30); i++) {
    if (done(await view(campaignId))) return reports;
    const report = await tick(campaignId, options.now ? { now: options.now() } : {});
    reports.push(...report.campaigns);
  }
  expect(done(await view(campaignId)), `campaign ${campaignId} did not get there`).toBe(true);
  return reports;
}

const finished = (v: CampaignView) => ["done", "failed", "cancelled"].includes(v.campaign.state);

function control(id: string, action: "pause" | "resume" | "cancel"): Promise<Response> {
  return admin(`/v1/campaigns/${id}/${action}`, { method: "POST" });
}

function leaseRequest(path: string, key: string, body?: unknown, method = "POST"): Promise<Response> {
  return lessor(path, {
    method,
    headers: { Authorization: `Bearer ${key}`, "content-type": "application/json" },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
}

describe("migration campaigns", () => {
  beforeAll(async () => {
    fleet = await createTenants("cmp", 32);
  }, 240_000);

  it("migrates 32 tenants: canary first, one failing tenant fails alone, a leased tenant is retried later", {
    timeout: 240_000,
  }, async () => {
    const [bad, held, canaryA, canaryB] = fleet;
    if (!bad || !held || !canaryA || !canaryB) throw new Error("fleet too small");
    const rest = fleet.filter((t) => t !== bad);
    await rollBack(rest, 1);
    // The failing tenant is at version 2 and already holds a duplicate slug: the contract step's
    // unique constraint cannot be added there.
    await rollBack([bad], 2);
    await asSuperuser(
      (client) => client.query("INSERT INTO notes (body, slug) VALUES ('a', 'same'), ('b', 'same')"),
      bad.database,
    );
    // A long session lease with an open transaction: its tenant cannot drain in time.
    const opened = await leaseRequest(`/v1/tenants/${held.id}/leases`, held.key, { ttlMs: 120_000 });
    expect(opened.status).toBe(201);
    const { lease } = await opened.json<{ lease: string }>();
    expect((await leaseRequest(`/v1/leases/${lease}/sql`, held.key, { query: "BEGIN" })).status).toBe(200);
    expect((await leaseRequest(`/v1/leases/${lease}/sql`, held.key, { query: "SELECT 1" })).status).toBe(200);

    const created = await createCampaign({
      toVersion: latest,
      concurrency: 8,
      canary: [canaryA.id, canaryB.id],
      continueOnFailure: true,
      force: true,
      drainTimeoutMs: 300,
      tenants: fleet.map((t) => t.id),
    });
    expect(created.enrolled).toBe(32);
    expect(created.canary).toEqual([canaryA.id, canaryB.id]);
    expect(created.campaign.state).toBe("pending");
    expect(created.campaign.contractSteps).toEqual([3]);
    const id = created.campaign.id;

    // Every tenant but the leased one finishes; the leased one is skipped and waits for a retry.
    await tickUntil(id, (v) => v.counts.pending === 0 && v.counts.running === 0);
    let state = await view(id);
    expect(state.campaign.state).toBe("rollout");
    expect(state.counts).toEqual({
      pending: 0,
      running: 0,
      succeeded: 30,
      failed: 1,
      skipped: 1,
      erased: 0,
      total: 32,
    });
    const heldResult = state.tenants.find((t) => t.tenantId === held.id);
    expect(heldResult?.state).toBe("skipped");
    expect(heldResult?.skipReason).toContain("leases_held");

    // Released, it is retried once its retry time comes, and succeeds.
    expect((await leaseRequest(`/v1/leases/${lease}`, held.key, undefined, "DELETE")).status).toBe(204);
    await tickUntil(id, finished, { now: () => Date.now() + 15 * minute });
    state = await view(id);
    expect(state.campaign.state).toBe("done");
    expect(state.campaign.reason).toBe("finished with 1 failed and 0 skipped tenant(s)");
    expect(state.counts).toEqual({
      pending: 0,
      running: 0,
      succeeded: 31,
      failed: 1,
      skipped: 0,
      erased: 0,
      total: 32,
    });

    // The canary went first: it finished before any other tenant started.
    const results = new Map(state.tenants.map((t) => [t.tenantId, t]));
    const canaryDone = Math.max(
      ...[canaryA, canaryB].map((t) => Date.parse(results.get(t.id)?.finishedAt ?? "")),
    );
    expect(Number.isFinite(canaryDone)).toBe(true);
    for (const tenant of fleet.filter((t) => t !== canaryA && t !== canaryB)) {
      const result = results.get(tenant.id);
      expect(result?.cohort).toBe("rollout");
      expect(Date.parse(result?.startedAt ?? "")).toBeGreaterThanOrEqual(canaryDone);
    }

    // The failure is that tenant's alone, explained, and free of secrets.
    const badResult = results.get(bad.id);
    expect(badResult).toMatchObject({ state: "failed", fromVersion: 2, toVersion: 2, attempts: 1 });
    expect(badResult?.failureSummary).toContain("0002_example_note_slug_unique");
    expect(badResult?.failureSummary).toMatch(/23505|unique|duplicate/i);
    expect(badResult?.failureSummary).not.toMatch(/postgres:\/\/|password|lsk_/i);
    const heldFinal = results.get(held.id);
    expect(heldFinal).toMatchObject({ state: "succeeded", fromVersion: 1, toVersion: 3 });
    expect(heldFinal?.attempts).toBeGreaterThanOrEqual(2); // skipped at least once, then migrated

    // Every database tells the same story: each step applied exactly once.
    await mapConcurrent(rest, 6, (tenant) => expectMigratedOnce(tenant.id, latest));
    await expectMigratedOnce(bad.id, 2);
    for (const tenant of rest.filter((t) => t !== held)) {
      expect(results.get(tenant.id)).toMatchObject({
        state: "succeeded",
        attempts: 1,
        fromVersion: 1,
        toVersion: 3,
      });
    }

    // The catalog follows, and the migrated schema works through Lessor.
    const catalog = await admin(`/v1/tenants/${canaryA.id}`);
    expect((await catalog.json<{ tenant: { schemaVersion: number } }>()).tenant.schemaVersion).toBe(3);

    // Per-tenant results are paged in claim order (canary first).
    const seen: string[] = [];
    let cursor: string | null = null;
    for (let page = 0; page < 10; page++) {
      const pageView: CampaignView = await view(id, `limit=10${cursor === null ? "" : `&cursor=${cursor}`}`);
      expect(pageView.tenants.length).toBeLessThanOrEqual(10);
      seen.push(...pageView.tenants.map((t) => t.tenantId));
      cursor = pageView.nextCursor;
      if (cursor === null) break;
    }
    expect(seen).toHaveLength(32);
    expect(new Set(seen).size).toBe(32);
    expect(seen.slice(0, 2)).toEqual([canaryA.id, canaryB.id]);
    const failedOnly = await view(id, "state=failed");
    expect(failedOnly.tenants.map((t) => t.tenantId)).toEqual([bad.id]);

    // Fix the failing tenant's data and run a campaign for it alone.
    await asSuperuser((client) => client.query("UPDATE notes SET slug = NULL"), bad.database);
    const retry = await createCampaign({ toVersion: latest, force: true, tenants: [bad.id] });
    expect(retry.enrolled).toBe(1);
    await tickUntil(retry.campaign.id, finished);
    expect((await view(retry.campaign.id)).campaign.state).toBe("done");
    await expectMigratedOnce(bad.id, latest);
  });

  it("stops at a failing canary and leaves the rest of the fleet untouched", {
    timeout: 120_000,
  }, async () => {
    const tenants = slice(0, 4);
    const [bad, ...others] = tenants;
    if (!bad) throw new Error("no tenant");
    await rollBack(others, 1);
    await rollBack([bad], 2);
    await asSuperuser(
      (client) => client.query("INSERT INTO notes (body, slug) VALUES ('a', 'dup'), ('b', 'dup')"),
      bad.database,
    );
    // continueOnFailure does not open the canary gate.
    const created = await createCampaign({
      toVersion: latest,
      canary: [bad.id],
      continueOnFailure: true,
      force: true,
      tenants: tenants.map((t) => t.id),
    });
    await tickUntil(created.campaign.id, finished);
    const state = await view(created.campaign.id);
    expect(state.campaign.state).toBe("failed");
    expect(state.campaign.reason).toContain("canary");
    expect(state.counts).toMatchObject({ failed: 1, pending: 3, succeeded: 0, running: 0 });
    for (const tenant of others) await expectMigratedOnce(tenant.id, 1);
    // A failed campaign is finished: it cannot be resumed.
    const resumed = await control(created.campaign.id, "resume");
    expect(resumed.status).toBe(409);
    expect((await resumed.json<{ code: string }>()).code).toBe("campaign_state_conflict");

    // Repaired, a new campaign takes everyone to the latest version.
    await asSuperuser((client) => client.query("DELETE FROM notes"), bad.database);
    const again = await createCampaign({
      toVersion: latest,
      canary: [bad.id],
      force: true,
      tenants: tenants.map((t) => t.id),
    });
    await tickUntil(again.campaign.id, finished);
    expect((await view(again.campaign.id)).counts).toMatchObject({ succeeded: 4, failed: 0 });
    for (const tenant of tenants) await expectMigratedOnce(tenant.id, latest);
  });

  it("pauses, resumes and cancels", { timeout: 120_000 }, async () => {
    const tenants = slice(4, 12);
    await rollBack(tenants, 1);
    const created = await createCampaign({
      toVersion: 2,
      concurrency: 2,
      force: true,
      tenants: tenants.map((t) => t.id),
    });
    const id = created.campaign.id;
    expect(created.campaign.contractSteps).toEqual([]);
    const first = await tick(id);
    expect(first.campaigns[0]?.succeeded).toBe(2);

    const paused = await control(id, "pause");
    expect(paused.status).toBe(200);
    expect((await paused.json<{ campaign: { state: string } }>()).campaign.state).toBe("paused");
    expect((await control(id, "pause")).status).toBe(200); // repeating is harmless
    const whilePaused = await tick(id);
    expect(whilePaused.campaigns).toEqual([]); // a paused campaign is not advanced
    const afterPause = await view(id);
    expect(afterPause.campaign.state).toBe("paused");
    expect(afterPause.counts.succeeded).toBe(afterPause.counts.total - afterPause.counts.pending);

    expect((await control(id, "resume")).status).toBe(200);
    expect((await view(id)).campaign.state).toBe("rollout");
    await tick(id);
    const resumed = await view(id);
    expect(resumed.counts.succeeded).toBeGreaterThanOrEqual(4);

    const cancelled = await control(id, "cancel");
    expect(cancelled.status).toBe(200);
    expect((await tick(id)).campaigns).toEqual([]);
    const after = await view(id);
    expect(after.campaign).toMatchObject({ state: "cancelled", reason: "cancelled by the operator" });
    expect(after.counts.pending).toBe(8 - after.counts.succeeded);
    expect((await control(id, "cancel")).status).toBe(200);
    for (const action of ["pause", "resume"] as const) {
      const refused = await control(id, action);
      expect(refused.status).toBe(409);
      expect((await refused.json<{ code: string }>()).code).toBe("campaign_state_conflict");
    }
    // Tenants left pending were not touched.
    for (const result of after.tenants) {
      await expectMigratedOnce(result.tenantId, result.state === "succeeded" ? 2 : 1);
    }

    // The cron's scheduled handler advances campaigns too: a new one finishes the job.
    const rest = await createCampaign({
      toVersion: latest,
      concurrency: 8,
      force: true,
      tenants: tenants.map((t) => t.id),
    });
    for (let i = 0; i < 5 && !finished(await view(rest.campaign.id)); i++) {
      const ctx = createExecutionContext();
      await worker.scheduled(
        createScheduledController({ cron: "* * * * *", scheduledTime: Date.now() }),
        env,
        ctx,
      );
      await waitOnExecutionContext(ctx);
    }
    expect((await view(rest.campaign.id)).counts).toMatchObject({ succeeded: 8, total: 8 });
    for (const tenant of tenants) await expectMigratedOnce(tenant.id, latest);
  });

  it("resumes after a kill between every pair of steps and migrates each tenant exactly once", {
    timeout: 300_000,
  }, async () => {
    // One campaign of three tenants (one canary, concurrency 2) per kill point, each on its own
    // three tenants so the kill points run side by side.
    const trios = Array.from({ length: 10 }, (_, i) => slice(i * 3, i * 3 + 3));
    const bodyFor = (tenants: CreatedTenant[]) => ({
      toVersion: latest,
      concurrency: 2,
      canary: [tenants[0]?.id],
      force: true,
      tenants: tenants.map((t) => t.id),
    });

    // A run that is never killed, to count its steps.
    const [first] = trios;
    if (!first) throw new Error("no tenants");
    await rollBack(first, 1);
    const reference = await createCampaign(bodyFor(first));
    const referenceSteps: string[] = [];
    for (let i = 0; i < 10 && !finished(await view(reference.campaign.id)); i++) {
      referenceSteps.push(...(await tick(reference.campaign.id)).steps);
    }
    expect((await view(reference.campaign.id)).counts).toMatchObject({ succeeded: 3 });
    expect(referenceSteps.map((step) => step.split(":")[0])).toEqual([
      ...["start", "claim", "migrate", "record", "phase"],
      ...["claim", "migrate", "migrate", "record", "record", "phase"],
    ]);

    // Kill after step k, for every k between the first and the last step.
    const kills = Array.from({ length: referenceSteps.length - 1 }, (_, i) => i + 1);
    await mapConcurrent(kills, 4, async (k) => {
      const tenants = trios[(k - 1) % trios.length] ?? first;
      await rollBack(tenants, 1);
      const { campaign } = await createCampaign(bodyFor(tenants));
      let budget = k;
      let killed = false;
      for (let i = 0; i < 10 && budget > 0 && !killed; i++) {
        const report = await tick(campaign.id, { stepBudget: budget });
        budget -= report.steps.length;
        killed = report.killed;
      }
      // Exactly k steps were taken (unless a cron tick of another test file finished the job first).
      if (budget !== 0) expect(finished(await view(campaign.id)), `kill after step ${k}`).toBe(true);
      // Restart: later ticks see the dead tick's claims as stale and finish the campaign.
      let clock = Date.now();
      await tickUntil(campaign.id, finished, {
        now: () => {
          clock += afterClaimTimeout;
          return clock;
        },
        max: 12,
      });
      const state = await view(campaign.id);
      expect(state.campaign.state, `killed after step ${k}`).toBe("done");
      expect(state.counts, `killed after step ${k}`).toMatchObject({ succeeded: 3, failed: 0, skipped: 0 });
      for (const tenant of tenants) await expectMigratedOnce(tenant.id, latest);
      // Whatever was interrupted, each tenant's recorded move is the real one.
      for (const result of state.tenants) expect(result).toMatchObject({ fromVersion: 1, toVersion: 3 });
    });
  });

  it("never migrates a tenant twice when two ticks run at the same moment", {
    timeout: 120_000,
  }, async () => {
    const tenants = slice(15, 25);
    await rollBack(tenants, 1);
    const { campaign } = await createCampaign({
      toVersion: latest,
      concurrency: 4,
      force: true,
      tenants: tenants.map((t) => t.id),
    });
    for (let round = 0; round < 10 && !finished(await view(campaign.id)); round++) {
      const now = Date.now();
      const [a, b] = await Promise.all([tick(campaign.id, { now }), tick(campaign.id, { now })]);
      const claimed = (a.campaigns[0]?.claimed ?? 0) + (b.campaigns[0]?.claimed ?? 0);
      // Together they stay within the campaign's concurrency.
      expect(claimed).toBeLessThanOrEqual(4);
    }
    const state = await view(campaign.id);
    expect(state.campaign.state).toBe("done");
    expect(state.counts).toMatchObject({ succeeded: 10, total: 10 });
    // Claimed once each: no second tick ever ran a tenant's migration.
    expect(state.tenants.map((t) => t.attempts)).toEqual(Array(10).fill(1));
    for (const tenant of tenants) await expectMigratedOnce(tenant.id, latest);
  });

  it("enrolls the whole fleet below the target version when no tenants are listed", {
    timeout: 120_000,
  }, async () => {
    const behind = slice(25, 28);
    const current = one(28);
    await rollBack(behind, 2);
    const created = await createCampaign({
      toVersion: latest,
      force: true,
      continueOnFailure: true,
      concurrency: 8,
    });
    expect(created.campaign.scope).toBe("fleet");
    expect(created.enrolled).toBeGreaterThanOrEqual(3);
    const id = created.campaign.id;
    await tickUntil(id, finished);
    const all: TenantResultView[] = [];
    let cursor: string | null = null;
    for (let page = 0; page < 50; page++) {
      const pageView: CampaignView = await view(id, `limit=200${cursor === null ? "" : `&cursor=${cursor}`}`);
      all.push(...pageView.tenants);
      cursor = pageView.nextCursor;
      if (cursor === null) break;
    }
    const mine = all.filter((t) => behind.some((b) => b.id === t.tenantId));
    expect(mine.map((t) => [t.state, t.fromVersion, t.toVersion])).toEqual(
      Array(3).fill(["succeeded", 2, 3]),
    );
    // A tenant already at the target version (as every newly provisioned one is) is not enrolled.
    expect(all.some((t) => t.tenantId === current.id)).toBe(false);
    for (const tenant of behind) await expectMigratedOnce(tenant.id, latest);
  });

  it("validates campaign requests and ids", async () => {
    for (const body of [
      { toVersion: newest + 1 },
      { toVersion: 0 },
      { toVersion: latest, concurrency: 0 },
      { toVersion: latest, canary: ["x"], canaryPercent: 5 },
      { toVersion: latest, tenants: ["no-such-tenant-anywhere"] },
      { toVersion: latest, canary: ["no-such-tenant-anywhere"], tenants: [] },
    ]) {
      const response = await admin("/v1/campaigns", { method: "POST", json: body });
      expect(response.status, JSON.stringify(body)).toBe(400);
      expect((await response.json<{ code: string }>()).code).toBe("invalid_request");
    }
    const tenant = one(29);
    // A canary must be one of the tenants the campaign migrates (this one is already current).
    const canary = await admin("/v1/campaigns", {
      method: "POST",
      json: { toVersion: latest, canary: [tenant.id], tenants: [tenant.id] },
    });
    expect(canary.status).toBe(400);
    expect((await canary.json<{ message: string }>()).message).toContain(tenant.id);
    expect((await admin("/v1/campaigns/nope")).status).toBe(404);
    expect((await admin("/v1/campaigns/cmp_0000000000000000")).status).toBe(404);
    expect((await admin("/v1/campaigns/cmp_0000000000000000/pause", { method: "POST" })).status).toBe(404);
    expect((await admin("/v1/campaigns?limit=0")).status).toBe(400);
    expect((await admin("/v1/campaigns?cursor=abc")).status).toBe(400);
    // Operator endpoints: no key, or a tenant key, is refused.
    expect((await lessor("/v1/campaigns")).status).toBe(401);
    const withTenantKey = await lessor("/v1/campaigns", {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
      body: JSON.stringify({ toVersion: latest }),
    });
    expect(withTenantKey.status).toBe(401);
    // Lists are paged, newest first.
    const listed = await admin("/v1/campaigns?limit=2");
    expect(listed.status).toBe(200);
    const page = await listed.json<{ campaigns: { id: string }[]; nextCursor: string | null }>();
    expect(page.campaigns.length).toBeLessThanOrEqual(2);
    if (page.nextCursor !== null) {
      const next = await admin(`/v1/campaigns?limit=2&cursor=${page.nextCursor}`);
      const nextPage = await next.json<{ campaigns: { id: string }[] }>();
      expect(nextPage.campaigns.map((c) => c.id)).not.toContain(page.campaigns[0]?.id);
    }
  });

  it("holds a contract step while older apps are seen, unless forced; expand steps go ahead", {
    timeout: 120_000,
  }, async () => {
    const [app2, target, expandOnly] = slice(29, 32);
    if (!app2 || !target || !expandOnly) throw new Error("no tenants");
    // An app built for schema version 2 talks to some tenant: Lessor records the sighting.
    const sighting = await sqlRequest(
      app2.connectionString,
      { query: "SELECT 1", params: [] },
      {
        "Lessor-Schema-Version": "2",
      },
    );
    expect(sighting.status).toBe(200);
    const seen = await pollUntil(
      () =>
        asSuperuser(async (client) => {
          const { rows } = await client.query(
            "SELECT count(*)::int AS n FROM app_schema_versions_seen WHERE version = 2 AND minute > now() - interval '10 minutes'",
          );
          return Number(rows[0]?.n ?? 0);
        }, "lessor"),
      (n) => n > 0,
    );
    expect(seen).toBeGreaterThan(0);

    await rollBack([target], 2);
    const held = await createCampaign({
      toVersion: latest,
      tenants: [target.id],
      stabilityWindowMs: 30 * minute,
    });
    await tick(held.campaign.id);
    await tick(held.campaign.id);
    let state = await view(held.campaign.id);
    expect(state.campaign.blockedReason).toContain("contract step 3 waits");
    expect(state.counts).toMatchObject({ pending: 1, succeeded: 0 });
    await expectMigratedOnce(target.id, 2);
    // Once the window has passed without another sighting, it runs.
    await tick(held.campaign.id, { now: Date.now() + 45 * minute });
    state = await view(held.campaign.id);
    expect(state.campaign.blockedReason).toBeNull();
    expect(state.campaign.state).toBe("done");
    await expectMigratedOnce(target.id, latest);

    // Forced, it does not wait.
    await rollBack([target], 2);
    const forced = await createCampaign({ toVersion: latest, tenants: [target.id], force: true });
    await tickUntil(forced.campaign.id, finished);
    expect((await view(forced.campaign.id)).counts).toMatchObject({ succeeded: 1 });

    // A campaign of expand steps only is never held back.
    await rollBack([expandOnly], 1);
    const expand = await createCampaign({ toVersion: 2, tenants: [expandOnly.id] });
    expect(expand.campaign.contractSteps).toEqual([]);
    await tickUntil(expand.campaign.id, finished);
    expect((await view(expand.campaign.id)).campaign.state).toBe("done");
    await expectMigratedOnce(expandOnly.id, 2);
  });

  it("answers Lessor-Schema-Version: 409 schema_too_old (or schema_version_unknown), 400 when malformed, upgrade on demand when configured", {
    timeout: 120_000,
  }, async () => {
    const tenant = one(28);
    const select = { query: "SELECT 1", params: [] };
    const withVersion = (version: string) =>
      sqlRequest(tenant.connectionString, select, { "Lessor-Schema-Version": version });

    expect((await withVersion(String(latest))).status).toBe(200);
    // A version this deployment does not bundle is not "too old": it is unknown here.
    const tooNew = await withVersion(String(newest + 1));
    expect(tooNew.status).toBe(409);
    const unknown = await tooNew.json<{ code: string; message: string }>();
    expect(unknown.code).toBe("schema_version_unknown");
    expect(unknown.message).toContain(`up to ${newest}`);
    for (const malformed of ["abc", "0", "-1", "2.0", ""]) {
      const response = await withVersion(malformed);
      expect(response.status, malformed).toBe(400);
      expect((await response.json<{ code: string }>()).code).toBe("invalid_request");
    }

    await rollBack([tenant], 1, true);
    const old = await withVersion("2");
    expect(old.status).toBe(409);
    const refusal = await old.json<{ code: string; message: string }>();
    expect(refusal).toMatchObject({ code: "schema_too_old" });
    expect(refusal.message).toContain("version 1");
    // Without the header nothing changes.
    expect((await sqlRequest(tenant.connectionString, select)).status).toBe(200);
    await expectMigratedOnce(tenant.id, 1);

    // LESSOR_UPGRADE_ON_DEMAND = "true": the tenant is migrated to the version asked for, then served.
    const onDemand = { ...env, LESSOR_UPGRADE_ON_DEMAND: "true" };
    const viaApp = async (version: string) => {
      const ctx = createExecutionContext();
      const request = new Request(`${base}/sql`, {
        method: "POST",
        headers: {
          "Neon-Connection-String": tenant.connectionString,
          "Neon-Raw-Text-Output": "true",
          "Neon-Array-Mode": "true",
          "content-type": "application/json",
          "Lessor-Schema-Version": version,
        },
        body: JSON.stringify({ query: "SELECT count(*) FROM lessor.schema_migrations", params: [] }),
      });
      const response = await app.fetch(request, onDemand, ctx);
      await waitOnExecutionContext(ctx);
      return response;
    };
    const upgraded = await viaApp("2");
    expect(upgraded.status).toBe(200);
    expect((await upgraded.json<{ rows: string[][] }>()).rows).toEqual([["2"]]);
    await expectMigratedOnce(tenant.id, 2);
    // The contract step is not taken on demand while apps needing version 2 are still seen.
    const contract = await viaApp("3");
    expect(contract.status).toBe(409);
    expect((await contract.json<{ message: string }>()).message).toContain("contract step");
    await expectMigratedOnce(tenant.id, 2);
  });
});
