/**
 * Restarts: an object that is evicted or reset between requests finds its persisted generation
 * with no pool behind it, the next request starts generation + 1 and works, and nothing is ever
 * served by the dead generation.
 *
 * `evictDurableObject` waits for the object to be idle, and an object whose pool holds open
 * connections (outgoing WebSockets) never is: workerd gives up after 30 s. So the eviction tests let
 * the idle alarm drain the pool first, and the crash/deploy case, where a live generation dies with
 * its object, uses `ctx.abort()`, which resets the object the way a deploy does.
 */

import { evictDurableObject, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it, vi } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  type CreatedTenant,
  createTenant,
  eventsOf,
  type LifecycleEvent,
  ledgerGenerations,
  lessor,
  pollUntil,
  runtimeOf,
  sqlFor,
  tenantBackends,
  uniqueTenantId,
} from "./harness.ts";

async function servingApplicationNames(tenant: CreatedTenant, requests = 1): Promise<Set<string>> {
  const sql = sqlFor(tenant);
  const rows = await Promise.all(
    Array.from({ length: requests }, async () => {
      const [row] = await sql`SELECT current_setting('application_name') AS app, current_database() AS db`;
      expect(row?.db).toBe(tenant.database);
      return String(row?.app);
    }),
  );
  return new Set(rows);
}

/** Lets the idle alarm drain the pool: the alarm runs with the clock past the idle timeout. */
async function drainByIdleAlarm(tenant: CreatedTenant): Promise<void> {
  vi.useFakeTimers({ toFake: ["Date"] });
  try {
    vi.setSystemTime(Date.now() + 5 * 60_000);
    expect(await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id))).toBe(true);
  } finally {
    vi.useRealTimers();
  }
  expect(await runtimeOf(tenant.id)).toMatchObject({ state: "stopped", leases: 0 });
}

/** Resets the object with its pool live, as a deploy or a crash does. */
async function resetObject(tenant: CreatedTenant): Promise<void> {
  const outcome = await runInDurableObject(env.TENANTS.getByName(tenant.id), (_instance, state) => {
    state.abort("test: object reset");
  }).then(
    () => "not reset",
    (error: unknown) => String(error),
  );
  expect(outcome).toMatch(/object reset/);
}

const diedOnRestart = (generation: number) => (event: LifecycleEvent) =>
  event.generation === generation && event.to === "stopped" && event.reason === "object_restarted";

describe("object restart", () => {
  it("keeps the pool's last use across its idle stop and the object's eviction (lessorctl status's last_used)", async () => {
    const tenant = await createTenant(uniqueTenantId("lastuse"), { tier: "free" });
    await servingApplicationNames(tenant);
    const { lastUsedAt } = await env.TENANTS.getByName(tenant.id).status();
    expect(lastUsedAt).not.toBeNull();
    await drainByIdleAlarm(tenant);
    await evictDurableObject(env.TENANTS.getByName(tenant.id));
    expect((await env.TENANTS.getByName(tenant.id).status()).lastUsedAt).toBe(lastUsedAt);
  });

  it("keeps a first use across a reset right after it (a deploy seconds after the first request)", async () => {
    const tenant = await createTenant(uniqueTenantId("lastuse-reset"), { tier: "free" });
    await servingApplicationNames(tenant);
    const { lastUsedAt } = await env.TENANTS.getByName(tenant.id).status();
    expect(lastUsedAt).not.toBeNull();
    await resetObject(tenant);
    expect((await env.TENANTS.getByName(tenant.id).status()).lastUsedAt).toBe(lastUsedAt);
  });

  it("evictDurableObject between requests: the next request starts generation + 1 and works", async () => {
    const tenant = await createTenant(uniqueTenantId("evict"), { tier: "free" });
    expect(await servingApplicationNames(tenant)).toEqual(new Set([`lessor:${tenant.role}:1`]));
    await drainByIdleAlarm(tenant);

    await evictDurableObject(env.TENANTS.getByName(tenant.id));

    // A fresh instance, from storage: the generation survived the eviction, the pool did not.
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "stopped", generation: 1, leases: 0 });
    expect(await servingApplicationNames(tenant, 20)).toEqual(new Set([`lessor:${tenant.role}:2`]));
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "ready", generation: 2 });
    expect(await ledgerGenerations(tenant.id)).toEqual([1, 2]);
    expect(new Set(await tenantBackends(tenant))).toEqual(new Set([`lessor:${tenant.role}:2`]));
  });

  it("a reset with a live pool records that generation as dead, and the next request starts generation + 1", async () => {
    const tenant = await createTenant(uniqueTenantId("reset"), { tier: "free" });
    expect(await servingApplicationNames(tenant, 5)).toEqual(new Set([`lessor:${tenant.role}:1`]));
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "ready", generation: 1 });

    await resetObject(tenant);

    // The restarted object does not pretend generation 1 is still ready.
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "stopped", generation: 1, leases: 0 });
    expect(await servingApplicationNames(tenant, 20)).toEqual(new Set([`lessor:${tenant.role}:2`]));
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "ready", generation: 2 });
    expect(await ledgerGenerations(tenant.id)).toEqual([1, 2]);

    const events = await pollUntil(
      () => eventsOf(tenant.id),
      (list) => list.some(diedOnRestart(1)),
    );
    expect(events).toContainEqual(
      expect.objectContaining({ generation: 1, from: "ready", to: "stopped", reason: "object_restarted" }),
    );
    const death = events.findIndex(diedOnRestart(1));
    const secondStart = events.findIndex((event) => event.generation === 2 && event.to === "starting");
    expect(secondStart).toBeGreaterThan(death);
    expect(new Set(events.map((event) => event.seq)).size).toBe(events.length);
  });

  it("no request is served by the dead generation's backends, and they go away", async () => {
    const tenant = await createTenant(uniqueTenantId("reset-be"), { tier: "free" });
    const sql = sqlFor(tenant);
    await Promise.all(Array.from({ length: 6 }, () => sql`SELECT pg_sleep(0.05)`));
    expect(new Set(await tenantBackends(tenant))).toEqual(new Set([`lessor:${tenant.role}:1`]));

    await resetObject(tenant);
    expect(await servingApplicationNames(tenant, 10)).toEqual(new Set([`lessor:${tenant.role}:2`]));

    const backends = await pollUntil(
      () => tenantBackends(tenant),
      (names) => !names.includes(`lessor:${tenant.role}:1`),
    );
    expect(backends.filter((name) => name !== `lessor:${tenant.role}:2`)).toEqual([]);
  });

  it("survives repeated evictions and resets, one new generation each time", async () => {
    const tenant = await createTenant(uniqueTenantId("restart-x"), { tier: "free" });
    for (const generation of [1, 2, 3]) {
      expect(await servingApplicationNames(tenant)).toEqual(new Set([`lessor:${tenant.role}:${generation}`]));
      if (generation % 2 === 1) {
        await drainByIdleAlarm(tenant);
        await evictDurableObject(env.TENANTS.getByName(tenant.id));
      } else {
        await resetObject(tenant);
      }
    }
    expect(await servingApplicationNames(tenant)).toEqual(new Set([`lessor:${tenant.role}:4`]));
    expect(await ledgerGenerations(tenant.id)).toEqual([1, 2, 3, 4]);
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "ready", generation: 4 });
  });

  it("a tier raised while the object was down reaches its next pool: size, bounds, ledger and connections", async () => {
    const tenant = await createTenant(uniqueTenantId("restart-tier"));
    const loaded = loadConfig(env);
    const tier = "standard";
    const before = loaded.poolSizes.get(tier) ?? 0;
    expect(before).toBe(5);
    expect(await servingApplicationNames(tenant)).toEqual(new Set([`lessor:${tenant.role}:1`]));
    expect(await runtimeOf(tenant.id)).toMatchObject({ generation: 1, poolSize: before });

    // The deployment's tier raised by one (as a deploy with a new LESSOR_POOL_SIZES would), for this
    // tenant's object only, then the object restarted: its record was kept in storage at the old size.
    const raised = before + 1;
    tenantHooksForTests.config = (id) =>
      id === tenant.id
        ? {
            poolSizes: new Map(loaded.poolSizes).set(tier, raised),
            poolStartSizes: new Map(loaded.poolStartSizes).set(tier, raised),
          }
        : undefined;
    const leases: string[] = [];
    try {
      await resetObject(tenant);
      expect(await servingApplicationNames(tenant)).toEqual(new Set([`lessor:${tenant.role}:2`]));

      const detail = await (await admin(`/v1/tenants/${tenant.id}`)).json<{
        runtime: { generation: number; poolSize: number; pool: { size: number; max: number } | null };
      }>();
      expect(detail.runtime).toMatchObject({
        generation: 2,
        poolSize: raised,
        pool: { size: raised, max: raised },
      });
      // The host's ledger holds the generation at the raised size.
      const report = await env.BUDGETS.getByName("local").evictionReport("local", 1);
      expect(report.pools.find((p) => p.tenantId === tenant.id)).toMatchObject({
        generation: 2,
        size: raised,
      });

      // And the pool holds that many connections at once: one session lease on each, in Postgres.
      for (let i = 0; i < raised; i++) {
        const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
          method: "POST",
          headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
          body: JSON.stringify({ ttlMs: 30_000 }),
        });
        expect(response.status, `lease ${i + 1}: ${await response.clone().text()}`).toBe(201);
        leases.push((await response.json<{ lease: string }>()).lease);
      }
      const backends = await tenantBackends(tenant);
      expect(backends.filter((name) => name === `lessor:${tenant.role}:2`)).toHaveLength(raised);
    } finally {
      for (const lease of leases) {
        const released = await lessor(`/v1/leases/${lease}`, {
          method: "DELETE",
          headers: { Authorization: `Bearer ${tenant.key}` },
        });
        await released.body?.cancel();
      }
      tenantHooksForTests.config = undefined;
    }
  });
});
