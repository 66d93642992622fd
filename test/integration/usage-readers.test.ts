/**
 * The usage readers: who may read what, and exactness. Folds may run (or be skipped) at any time
 * while this file runs, from this file or another; every assertion holds whatever they do.
 */
import {
  createExecutionContext,
  createScheduledController,
  runDurableObjectAlarm,
  waitOnExecutionContext,
} from "cloudflare:test";
import { env } from "cloudflare:workers";
import { beforeAll, describe, expect, it } from "vitest";
import worker from "../../src/index.ts";
import type { UsageCounters } from "../../src/usage/index.ts";
import type { FleetUsage, TenantUsage } from "../../src/usage/readers.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  sqlFor,
  uniqueTenantId,
} from "./harness.ts";

/** One cron tick through the real scheduled handler. */
async function tick(): Promise<void> {
  const ctx = createExecutionContext();
  await worker.scheduled(
    createScheduledController({ cron: "* * * * *", scheduledTime: Date.now() }),
    env,
    ctx,
  );
  await waitOnExecutionContext(ctx);
}

function asTenant(tenant: CreatedTenant, path: string): Promise<Response> {
  return lessor(path, { headers: { Authorization: `Bearer ${tenant.key}` } });
}

/** Runs `ok` queries of `rows` rows each and `failing` queries that fail, then flushes the usage outbox. */
async function traffic(tenant: CreatedTenant, ok: number, rows: number, failing: number): Promise<void> {
  const sql = sqlFor(tenant);
  await Promise.all([
    ...Array.from({ length: ok }, () => sql`SELECT g FROM generate_series(1, ${rows}::int) g`),
    ...Array.from({ length: failing }, () =>
      sql`SELECT 1 / 0`.then(
        () => {
          throw new Error("expected a division by zero");
        },
        () => undefined,
      ),
    ),
  ]);
  expect(await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id))).toBe(true);
}

async function usageOf(tenant: CreatedTenant): Promise<TenantUsage> {
  const response = await admin(`/v1/tenants/${tenant.id}/usage`);
  expect(response.status).toBe(200);
  return response.json<TenantUsage>();
}

function withoutLease(usage: UsageCounters): Omit<UsageCounters, "leaseMs"> {
  const { leaseMs: _, ...rest } = usage;
  return rest;
}

describe("usage readers", () => {
  let alpha: CreatedTenant;
  let beta: CreatedTenant;

  beforeAll(async () => {
    alpha = await createTenant(uniqueTenantId("usage-a"));
    beta = await createTenant(uniqueTenantId("usage-b"));
    await traffic(alpha, 5, 3, 2);
    await traffic(beta, 4, 1, 0);
  });

  it("counts queries, rows, errors and pool starts exactly", async () => {
    const a = await usageOf(alpha);
    expect(a.tenantId).toBe(alpha.id);
    expect(withoutLease(a.usage)).toEqual({ queries: 7, rowsReturned: 15, errors: 2, poolStarts: 1 });
    expect(a.usage.leaseMs).toBeGreaterThanOrEqual(0);
    expect(Number.isNaN(Date.parse(a.asOf))).toBe(false);
    const b = await usageOf(beta);
    expect(withoutLease(b.usage)).toEqual({ queries: 4, rowsReturned: 4, errors: 0, poolStarts: 1 });
  });

  it("stays exact across folds and as more deltas arrive", async () => {
    const before = await usageOf(alpha);
    await tick();
    const afterFold = await usageOf(alpha);
    expect(afterFold.usage).toEqual(before.usage);

    await traffic(alpha, 3, 2, 1);
    const more = await usageOf(alpha);
    expect(withoutLease(more.usage)).toEqual({ queries: 11, rowsReturned: 21, errors: 3, poolStarts: 1 });
    expect(more.usage.leaseMs).toBeGreaterThanOrEqual(before.usage.leaseMs);
    await tick();
    await tick();
    expect((await usageOf(alpha)).usage).toEqual(more.usage);
  });

  it("lets a tenant read its own usage with its own key", async () => {
    const response = await asTenant(beta, `/v1/tenants/${beta.id}/usage`);
    expect(response.status).toBe(200);
    const own = await response.json<TenantUsage>();
    expect(own.usage).toEqual((await usageOf(beta)).usage);
  });

  it("answers another tenant's key like an unknown tenant: 401, the same everywhere", async () => {
    const crossed = await asTenant(beta, `/v1/tenants/${alpha.id}/usage`);
    const unknown = await asTenant(beta, `/v1/tenants/${uniqueTenantId("nobody")}/usage`);
    expect(crossed.status).toBe(401);
    expect(unknown.status).toBe(401);
    expect(await crossed.json()).toEqual(await unknown.json());
  });

  it("refuses a missing or invalid key, and validates the tenant id", async () => {
    expect((await lessor(`/v1/tenants/${alpha.id}/usage`)).status).toBe(401);
    const wrong = await lessor(`/v1/tenants/${alpha.id}/usage`, {
      headers: { Authorization: "Bearer lsk_not-a-real-key-at-all" },
    });
    expect(wrong.status).toBe(401);
    const invalid = await admin("/v1/tenants/Not_A_Slug/usage");
    expect(invalid.status).toBe(400);
    expect(await invalid.json()).toMatchObject({ code: "invalid_tenant_id" });
  });

  it("answers 404 to the admin for a tenant that does not exist", async () => {
    const response = await admin(`/v1/tenants/${uniqueTenantId("nobody")}/usage`);
    expect(response.status).toBe(404);
    expect(await response.json()).toMatchObject({ code: "tenant_not_found" });
  });

  it("gives the admin fleet totals that include every tenant's usage", async () => {
    const a = await usageOf(alpha);
    const b = await usageOf(beta);
    const response = await admin("/v1/usage");
    expect(response.status).toBe(200);
    const fleet = await response.json<FleetUsage>();
    expect(fleet.tenantsWithUsage).toBeGreaterThanOrEqual(2);
    for (const key of ["queries", "rowsReturned", "errors", "leaseMs", "poolStarts"] as const) {
      expect(fleet.usage[key]).toBeGreaterThanOrEqual(a.usage[key] + b.usage[key]);
    }
  });

  it("counts the tenants whose usage is recorded under a name that says so: a tenant with none is not counted", async () => {
    const idle = await createTenant(uniqueTenantId("usage-idle"));
    const recorded = () =>
      asSuperuser(async (client) => {
        const { rows } = await client.query(
          `
          SELECT count(*)::int AS tenants,
                 count(*) FILTER (WHERE tenant_id = $1)::int AS idle
            FROM (SELECT tenant_id FROM usage_rollups UNION SELECT tenant_id FROM usage_deltas) recorded`,
          [idle.id],
        );
        return rows[0] as { tenants: number; idle: number };
      }, "lessor");
    const before = await recorded();
    // The idle tenant is in the catalog and has no usage recorded: a count of tenants would count it.
    expect(before.idle).toBe(0);
    const fleet = await (await admin("/v1/usage")).json<FleetUsage & Record<string, unknown>>();
    expect(fleet.tenantsWithUsage).toBe(before.tenants);
    expect(await recorded()).toEqual(before);
    // No field by the bare name, which a reader takes for the catalog's tenants.
    expect(fleet).not.toHaveProperty("tenants");
  });

  it("keeps fleet totals from tenant keys", async () => {
    expect((await asTenant(alpha, "/v1/usage")).status).toBe(401);
    expect((await lessor("/v1/usage")).status).toBe(401);
  });
});
