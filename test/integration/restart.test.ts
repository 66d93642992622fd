/**
 * Restarts: an object that is evicted between requests finds its persisted generation with no pool
 * behind it, records it as dead, and the next request starts generation + 1 and works. Nothing is
 * ever served by the dead generation.
 */
import { env } from "cloudflare:workers";
import { evictDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import {
  type CreatedTenant,
  createTenant,
  eventsOf,
  ledgerGenerations,
  pollUntil,
  runtimeOf,
  sqlFor,
  tenantBackends,
  uniqueTenantId,
} from "./harness.ts";

async function servingGeneration(tenant: CreatedTenant): Promise<string> {
  const sql = sqlFor(tenant);
  const rows = await sql`SELECT current_setting('application_name') AS app, current_database() AS db`;
  expect(rows[0]?.db).toBe(`tenant_${tenant.id}`);
  return String(rows[0]?.app);
}

describe("object restart", () => {
  it("the next request after an eviction starts generation + 1 and works", async () => {
    const tenant = await createTenant(uniqueTenantId("restart"), { tier: "free" });
    expect(await servingGeneration(tenant)).toBe(`lessor:${tenant.id}:1`);
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "ready", generation: 1 });

    await evictDurableObject(env.TENANTS.getByName(tenant.id));

    // The restarted object knows generation 1 is gone: stopped, not ready on a pool it does not have.
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "stopped", generation: 1, leases: 0 });

    const sql = sqlFor(tenant);
    const apps = await Promise.all(
      Array.from({ length: 20 }, async () => (await sql`SELECT current_setting('application_name') AS app`)[0]?.app),
    );
    expect(new Set(apps)).toEqual(new Set([`lessor:${tenant.id}:2`]));
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "ready", generation: 2 });
    expect(await ledgerGenerations(tenant.id)).toEqual([1, 2]);
  });

  it("records the dead generation in the control plane's lifecycle events", async () => {
    const tenant = await createTenant(uniqueTenantId("restart-ev"), { tier: "free" });
    await servingGeneration(tenant);
    await evictDurableObject(env.TENANTS.getByName(tenant.id));
    expect(await servingGeneration(tenant)).toBe(`lessor:${tenant.id}:2`);

    const isDeathRecorded = (events: Awaited<ReturnType<typeof eventsOf>>) =>
      events.some((event) => event.generation === 1 && event.to === "stopped" && event.reason === "object_restarted");
    const events = await pollUntil(() => eventsOf(tenant.id), isDeathRecorded);
    expect(events).toContainEqual(
      expect.objectContaining({ generation: 1, from: "ready", to: "stopped", reason: "object_restarted" }),
    );
    // In order: generation 1 started and died before generation 2 started.
    const death = events.findIndex((event) => event.reason === "object_restarted");
    const secondStart = events.findIndex((event) => event.generation === 2 && event.to === "starting");
    expect(secondStart).toBeGreaterThan(death);
    // Sequence numbers are unique (a replayed flush does not duplicate them).
    expect(new Set(events.map((event) => event.seq)).size).toBe(events.length);
  });

  it("no request is served by the old generation's backends, which go away", async () => {
    const tenant = await createTenant(uniqueTenantId("restart-be"), { tier: "free" });
    const sql = sqlFor(tenant);
    await Promise.all(Array.from({ length: 10 }, () => sql`SELECT pg_sleep(0.05)`));
    expect(new Set(await tenantBackends(tenant.id))).toEqual(new Set([`lessor:${tenant.id}:1`]));

    await evictDurableObject(env.TENANTS.getByName(tenant.id));
    const apps = await Promise.all(
      Array.from({ length: 10 }, async () => (await sql`SELECT current_setting('application_name') AS app`)[0]?.app),
    );
    expect(new Set(apps)).toEqual(new Set([`lessor:${tenant.id}:2`]));

    const backends = await pollUntil(
      () => tenantBackends(tenant.id),
      (names) => !names.includes(`lessor:${tenant.id}:1`),
    );
    expect(backends.filter((name) => name !== `lessor:${tenant.id}:2`)).toEqual([]);
  });

  it("survives repeated evictions, one new generation each time", async () => {
    const tenant = await createTenant(uniqueTenantId("restart-x3"), { tier: "free" });
    for (const generation of [1, 2, 3]) {
      expect(await servingGeneration(tenant)).toBe(`lessor:${tenant.id}:${generation}`);
      await evictDurableObject(env.TENANTS.getByName(tenant.id));
    }
    expect(await servingGeneration(tenant)).toBe(`lessor:${tenant.id}:4`);
    expect(await ledgerGenerations(tenant.id)).toEqual([1, 2, 3, 4]);
  });
});
