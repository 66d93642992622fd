/**
 * A campaign under live traffic (issue 18): `/sql` and session-lease traffic keeps running against a
 * tenant while a campaign migrates it, once with an expand step and once with a contract step under
 * the guard. Every answer must be a 200, or a `503 tenant_migrating` with Retry-After; once the
 * migration ends, traffic is all 200 again.
 *
 * A migration takes milliseconds on an empty table, so the test holds the migrator's advisory lock
 * in the tenant's database (it waits for it with no lock timeout): the tenant stays `migrating` until
 * every kind of traffic has met the migration and been answered while it still held. Those answers
 * prove the waits are bounded (by the admission wait, not by the migration's end), with no clock in
 * the test: they came while the migration could not have ended.
 */
import { env } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { runCampaignTick } from "../../src/campaigns/runner.ts";
import { migrationLockKey } from "../../src/tenant-db/migrator.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

const minute = 60_000;

interface Answer {
  kind: "sql" | "lease_open" | "lease_sql" | "lease_close";
  status: number;
  code: string | null;
  retryAfter: string | null;
  /** Logical times (one counter per test) the request was sent and answered. */
  sent: number;
  answered: number;
}

let clock = 0;

async function answer(kind: Answer["kind"], request: () => Promise<Response>): Promise<Answer> {
  const sent = clock++;
  const response = await request();
  const answered = clock++;
  const text = await response.text();
  let code: string | null = null;
  try {
    code = (JSON.parse(text) as { code?: string }).code ?? null;
  } catch {
    code = null;
  }
  return {
    kind,
    status: response.status,
    code,
    retryAfter: response.headers.get("Retry-After"),
    sent,
    answered,
  };
}

function tenantSql(tenant: CreatedTenant, query: string): Promise<Answer> {
  return answer("sql", () => sqlRequest(tenant.connectionString, { query, params: [] }));
}

/** Opens a session lease, runs one statement in a transaction on it, and closes it. */
async function leaseCycle(tenant: CreatedTenant): Promise<Answer[]> {
  const auth = { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" };
  let lease: string | null = null;
  const opened = await answer("lease_open", async () => {
    const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: auth,
      body: JSON.stringify({ ttlMs: 10_000 }),
    });
    if (response.status === 201) {
      lease = (await response.clone().json<{ lease: string }>()).lease;
    }
    return response;
  });
  if (!lease) return [opened];
  const run = (query: string) =>
    answer("lease_sql", () =>
      lessor(`/v1/leases/${lease}/sql`, { method: "POST", headers: auth, body: JSON.stringify({ query }) }),
    );
  const answers = [opened, await run("BEGIN"), await run("SELECT count(*) FROM notes"), await run("COMMIT")];
  answers.push(
    await answer("lease_close", () => lessor(`/v1/leases/${lease}`, { method: "DELETE", headers: auth })),
  );
  return answers;
}

/** Runs `/sql` and lease traffic against `tenant` until `stop` resolves, into `answers`. */
async function trafficUntil(tenant: CreatedTenant, stop: Promise<unknown>, answers: Answer[]): Promise<void> {
  let stopped = false;
  void stop.finally(() => {
    stopped = true;
  });
  const sqlWorker = async () => {
    for (let i = 0; i < 500 && !stopped; i++) {
      answers.push(await tenantSql(tenant, "SELECT count(*) FROM notes"));
    }
  };
  const leaseWorker = async () => {
    for (let i = 0; i < 200 && !stopped; i++) answers.push(...(await leaseCycle(tenant)));
  };
  await Promise.all([sqlWorker(), sqlWorker(), leaseWorker()]);
}

/** Every answer is a 200 (201/204 for a lease's open and close), or a tenant_migrating with a hint. */
function expectOnlyOkOrMigrating(answers: readonly Answer[]): void {
  for (const a of answers) {
    if (a.status >= 200 && a.status < 300) continue;
    expect(a, JSON.stringify(a)).toMatchObject({ status: 503, code: "tenant_migrating" });
    expect(Number(a.retryAfter), JSON.stringify(a)).toBeGreaterThanOrEqual(1);
  }
}

/** Puts the tenant's database and the catalog back at `version` (as campaign-fleet.test.ts does). */
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

async function schemaVersionOf(tenant: CreatedTenant): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT max(version)::int AS v FROM lessor.schema_migrations");
    return Number(rows[0]?.v ?? 0);
  }, tenant.database);
}

async function campaignState(id: string): Promise<{ state: string; succeeded: number; pending: number }> {
  const response = await admin(`/v1/campaigns/${id}`);
  const body = await response.json<{
    campaign: { state: string };
    counts: { succeeded: number; pending: number };
  }>();
  return { state: body.campaign.state, succeeded: body.counts.succeeded, pending: body.counts.pending };
}

/**
 * Migrates `tenant` to `toVersion` by campaign ticks while traffic runs, with the DDL held up by a
 * lock; returns the traffic's answers and the campaign's end state.
 */
async function createCampaign(tenant: CreatedTenant, toVersion: number): Promise<string> {
  const created = await admin("/v1/campaigns", { method: "POST", json: { toVersion, tenants: [tenant.id] } });
  const text = await created.text();
  expect(created.status, text).toBe(201);
  return (JSON.parse(text) as { campaign: { id: string } }).campaign.id;
}

async function migrateUnderTraffic(
  tenant: CreatedTenant,
  campaignId: string,
  tickAt: () => number,
): Promise<{ answers: Answer[]; whileHeld: Answer[]; state: { state: string; succeeded: number } }> {
  let finished: () => void = () => undefined;
  const done = new Promise<void>((resolve) => {
    finished = resolve;
  });
  const answers: Answer[] = [];
  const traffic = trafficUntil(tenant, done, answers);
  // Traffic has warmed the pool once each kind has been served.
  await pollUntil(
    async () => new Set(answers.filter((a) => a.status < 300).map((a) => a.kind)),
    (kinds) => kinds.has("sql") && kinds.has("lease_close"),
    { attempts: 100, intervalMs: 50 },
  );
  return asSuperuser(async (lock) => {
    // The migration starts (the tenant is `migrating`) and then waits for this lock.
    await lock.query("SELECT pg_advisory_lock($1)", [migrationLockKey]);
    const heldFrom = clock++;
    let heldUntil = Number.POSITIVE_INFINITY;
    let state = await campaignState(campaignId);
    const ticks = (async () => {
      for (let i = 0; i < 15 && state.state !== "done" && state.state !== "failed"; i++) {
        await runCampaignTick(env, { campaignId, now: tickAt() });
        state = await campaignState(campaignId);
      }
    })();
    try {
      // Held until both kinds of traffic have been refused by the migration, and answered, while
      // it could not end.
      await pollUntil(
        async () =>
          new Set(
            answers.filter((a) => a.sent > heldFrom && a.code === "tenant_migrating").map((a) => a.kind),
          ),
        (kinds) => kinds.has("sql") && kinds.has("lease_open"),
        { attempts: 300, intervalMs: 100 },
      );
    } finally {
      heldUntil = clock++;
      await lock.query("SELECT pg_advisory_unlock($1)", [migrationLockKey]);
    }
    await ticks;
    finished();
    await traffic;
    const whileHeld = answers.filter((a) => a.sent > heldFrom && a.answered < heldUntil);
    return { answers, whileHeld, state };
  }, tenant.database);
}

/** The migration met both kinds of traffic, and each was answered while it still held. */
function expectBoundedWhileMigrating(whileHeld: readonly Answer[]): void {
  const refused = whileHeld.filter((a) => a.code === "tenant_migrating");
  expect(new Set(refused.map((a) => a.kind))).toEqual(new Set(["sql", "lease_open"]));
}

describe("a campaign under live traffic", () => {
  it("an expand step: every answer is 200 or a bounded 503 tenant_migrating; all 200 after", {
    timeout: 120_000,
  }, async () => {
    const tenant = await createTenant(uniqueTenantId("cmp-live-x"));
    await rollBack(tenant, 1);
    const campaignId = await createCampaign(tenant, 2);
    const { answers, whileHeld, state } = await migrateUnderTraffic(tenant, campaignId, () => Date.now());
    expect(state).toMatchObject({ state: "done", succeeded: 1 });
    expect(await schemaVersionOf(tenant)).toBe(2);
    expectOnlyOkOrMigrating(answers);
    // The traffic did meet the migration (else this test proves nothing), and its waits ended
    // while the migration still held.
    expectBoundedWhileMigrating(whileHeld);
    expect(answers.filter((a) => a.status === 200).length).toBeGreaterThan(0);
    // Once the migration has ended, everything is 200.
    const after = await Promise.all([
      tenantSql(tenant, "SELECT slug FROM notes"),
      tenantSql(tenant, "SELECT 1"),
      leaseCycle(tenant),
    ]);
    for (const a of after.flat()) expect(a.status, JSON.stringify(a)).toBeLessThan(300);
  });

  it("a contract step under the guard: held while an old app is seen, then bounded the same way", {
    timeout: 120_000,
  }, async () => {
    const tenant = await createTenant(uniqueTenantId("cmp-live-c"));
    await rollBack(tenant, 2);
    // An app built for version 2 is seen: the contract step waits for its stability window, so the
    // ticks run an hour ahead (the window is 30 minutes by default).
    const sighting = await lessor("/sql", {
      method: "POST",
      headers: { "Neon-Connection-String": tenant.connectionString, "Lessor-Schema-Version": "2" },
      body: JSON.stringify({ query: "SELECT 1", params: [] }),
    });
    expect(sighting.status).toBe(200);
    const campaignId = await createCampaign(tenant, 3);
    // The guard holds the step while the sighting is inside its window.
    const held = await pollUntil(
      async () => {
        await runCampaignTick(env, { campaignId });
        const response = await admin(`/v1/campaigns/${campaignId}`);
        return (await response.json<{ campaign: { blockedReason: string | null } }>()).campaign.blockedReason;
      },
      (reason) => reason !== null,
      { attempts: 20, intervalMs: 250 },
    );
    expect(held).toContain("contract step 3 waits");
    expect(await schemaVersionOf(tenant)).toBe(2);
    const { answers, whileHeld, state } = await migrateUnderTraffic(
      tenant,
      campaignId,
      () => Date.now() + 60 * minute,
    );
    expect(state).toMatchObject({ state: "done", succeeded: 1 });
    expect(await schemaVersionOf(tenant)).toBe(3);
    expectOnlyOkOrMigrating(answers);
    expectBoundedWhileMigrating(whileHeld);
    const after = await pollUntil(
      () => tenantSql(tenant, "SELECT count(*) FROM notes"),
      (a) => a.status === 200,
      { attempts: 4 },
    );
    expect(after.status).toBe(200);
  });
});
