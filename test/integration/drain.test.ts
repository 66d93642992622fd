/**
 * Operator drains: a draining generation refuses new leases and lets existing ones finish; a lease
 * held past the maximum drain time is reported (event and status), never killed unless forced.
 */
import { env, runDurableObjectAlarm } from "cloudflare:test";
import { describe, expect, it, vi } from "vitest";
import { admin, type CreatedTenant, countBackends, createTenant, lessor, uniqueTenantId } from "./harness.ts";

async function openLease(tenant: CreatedTenant): Promise<string> {
  const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}` },
    body: JSON.stringify({ ttlMs: 300_000 }),
  });
  expect(response.status).toBe(201);
  return (await response.json<{ lease: string }>()).lease;
}

function onLease(tenant: CreatedTenant, lease: string, query: string): Promise<Response> {
  return lessor(`/v1/leases/${lease}/sql`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}` },
    body: JSON.stringify({ query }),
  });
}

function sql(tenant: CreatedTenant): Promise<Response> {
  return lessor("/sql", {
    method: "POST",
    headers: {
      "Neon-Connection-String": tenant.connectionString,
      "Neon-Raw-Text-Output": "true",
      "Neon-Array-Mode": "true",
    },
    body: JSON.stringify({ query: "SELECT 1", params: [] }),
  });
}

interface EventRow {
  generation: number;
  from: string;
  to: string;
  reason: string;
}

async function events(tenant: CreatedTenant): Promise<EventRow[]> {
  const response = await admin(`/v1/tenants/${tenant.id}/events?limit=200`);
  return (await response.json<{ events: EventRow[] }>()).events;
}

describe("operator drain", () => {
  it("refuses new leases, lets the held one finish, reports it overdue, and stops only when forced", async () => {
    const tenant = await createTenant(uniqueTenantId("drain"));
    const lease = await openLease(tenant);
    expect((await onLease(tenant, lease, "BEGIN")).status).toBe(200);
    expect((await onLease(tenant, lease, "INSERT INTO notes (body) VALUES ('in flight')")).status).toBe(200);

    const drained = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    expect(drained.status).toBe(202);
    const runtime = (await drained.json<{ runtime: { state: string; leases: number } }>()).runtime;
    expect(runtime).toMatchObject({ state: "draining", leases: 1 });

    // New leases are refused with a retry hint; the held lease keeps working.
    const refused = await sql(tenant);
    expect(refused.status).toBe(503);
    expect(refused.headers.get("Retry-After")).toBeTruthy();
    expect(await refused.json()).toMatchObject({ code: "tenant_draining" });
    expect((await onLease(tenant, lease, "SELECT count(*) FROM notes")).status).toBe(200);

    // Past the maximum drain time: reported in the status and as an event, and not killed.
    const stub = env.TENANTS.getByName(tenant.id);
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      // Past the 30 s drain maximum, well inside the lease's 300 s TTL.
      vi.setSystemTime(Date.now() + 60_000);
      await runDurableObjectAlarm(stub);
      const status = await stub.status();
      expect(status.state).toBe("draining");
      expect(status.drain?.overdue).toBe(true);
      expect(status.drain?.heldLeases).toHaveLength(1);
    } finally {
      vi.useRealTimers();
    }
    expect((await onLease(tenant, lease, "SELECT 1")).status).toBe(200);
    expect((await events(tenant)).some((e) => e.reason.startsWith("drain_overdue"))).toBe(true);

    // Forced: the lease's connection is closed (its transaction rolls back) and the drain finishes.
    const forced = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: { force: true } });
    expect((await forced.json<{ runtime: { state: string; leases: number } }>()).runtime).toMatchObject({
      state: "stopped",
      leases: 0,
    });
    const after = await onLease(tenant, lease, "COMMIT");
    expect(after.status).toBe(409);
    expect(await after.json()).toMatchObject({ code: "stale_generation" });
    for (let i = 0; i < 50 && (await countBackends(`lessor:${tenant.role}:`)) > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(await countBackends(`lessor:${tenant.role}:`)).toBe(0);

    // The write of the killed transaction never committed, and the next request starts generation 2.
    const next = await lessor("/sql", {
      method: "POST",
      // As the driver asks: raw text, array mode.
      headers: {
        "Neon-Connection-String": tenant.connectionString,
        "Neon-Raw-Text-Output": "true",
        "Neon-Array-Mode": "true",
      },
      body: JSON.stringify({
        query: "SELECT (SELECT count(*)::int FROM notes) AS n, current_setting('application_name') AS app",
        params: [],
      }),
    });
    expect((await next.json<{ rows: string[][] }>()).rows).toEqual([["0", `lessor:${tenant.role}:2`]]);
  });

  it("a drain without leases stops at once and a later request starts a new generation", async () => {
    const tenant = await createTenant(uniqueTenantId("drain-idle"));
    expect((await sql(tenant)).status).toBe(200);
    const drained = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    expect((await drained.json<{ runtime: { state: string } }>()).runtime.state).toBe("stopped");
    expect((await sql(tenant)).status).toBe(200);
    expect((await env.TENANTS.getByName(tenant.id).status()).generation).toBe(2);
  });

  it("answers 404 for a drain of a tenant that does not exist", async () => {
    const response = await admin(`/v1/tenants/${uniqueTenantId("nobody")}/drain`, {
      method: "POST",
      json: {},
    });
    expect(response.status).toBe(404);
    expect(await response.json()).toMatchObject({ code: "tenant_not_found" });
  });
});
