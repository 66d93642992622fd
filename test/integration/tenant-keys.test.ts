/**
 * A tenant's keys: several at once, issued and revoked with no gap, revocation immediate on every
 * route (leases included), a bounded count that concurrency cannot exceed, and expiry.
 */
import { env, runDurableObjectAlarm } from "cloudflare:test";
import { describe, expect, it, vi } from "vitest";
import { admin, type CreatedTenant, createTenant, lessor, sqlRequest, uniqueTenantId } from "./harness.ts";

function asTenant(key: string, path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  headers.set("Authorization", `Bearer ${key}`);
  return lessor(path, { ...init, headers });
}

function withKey(tenant: CreatedTenant, key: string): string {
  return tenant.connectionString.replace(tenant.key, key);
}

async function issue(tenant: CreatedTenant, byKey: string, body: unknown = {}): Promise<Response> {
  return asTenant(byKey, `/v1/tenants/${tenant.id}/keys`, { method: "POST", body: JSON.stringify(body) });
}

interface KeyView {
  keyId: string;
  createdAt: string;
  lastUsedAt: string | null;
  expiresAt: string | null;
}

describe("tenant keys", () => {
  it("rotates with no gap: a second key works at once, the first dies at once on every route", async () => {
    const tenant = await createTenant(uniqueTenantId("rotate"));
    const issued = await issue(tenant, tenant.key);
    expect(issued.status).toBe(201);
    const second = await issued.json<{
      keyId: string;
      key: string;
      createdAt: string;
      expiresAt: null;
      connectionString: string;
    }>();
    expect(second.key).toMatch(/^lsk_/);
    // The new key's connection string, as the create gave the first one's.
    expect(second.connectionString).toBe(withKey(tenant, second.key));

    // Both work; the list names both and shows neither key nor hash.
    for (const key of [tenant.key, second.key]) {
      expect((await sqlRequest(withKey(tenant, key), { query: "SELECT 1" })).status).toBe(200);
    }
    const listed = await (await admin(`/v1/tenants/${tenant.id}/keys`)).text();
    expect(listed).not.toContain(tenant.key.slice(4));
    expect(listed).not.toContain(second.key.slice(4));
    const keys = (JSON.parse(listed) as { keys: KeyView[] }).keys;
    expect(keys.map((k) => k.keyId)).toContain(second.keyId);
    expect(keys).toHaveLength(2);

    // A lease opened with the first key, to be ended by its revocation.
    const opened = await asTenant(tenant.key, `/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      body: "{}",
    });
    const { lease } = await opened.json<{ lease: string }>();
    const firstId = keys.find((k) => k.keyId !== second.keyId)?.keyId ?? "";

    const revoked = await asTenant(second.key, `/v1/tenants/${tenant.id}/keys/${firstId}`, {
      method: "DELETE",
    });
    expect(revoked.status).toBe(204);
    const sql = await sqlRequest(withKey(tenant, tenant.key), { query: "SELECT 1" });
    expect(sql.status).toBe(400);
    expect(await sql.json()).toMatchObject({ code: "28P01" });
    expect((await asTenant(tenant.key, `/v1/tenants/${tenant.id}/usage`)).status).toBe(401);
    expect(
      (await asTenant(tenant.key, `/v1/tenants/${tenant.id}/leases`, { method: "POST", body: "{}" })).status,
    ).toBe(401);
    const onLease = await asTenant(second.key, `/v1/leases/${lease}/sql`, {
      method: "POST",
      body: JSON.stringify({ query: "SELECT 1" }),
    });
    expect(onLease.status).toBe(409);
    expect(await onLease.json()).toMatchObject({ code: "lease_lost" });
    // The second key never stopped working.
    expect((await sqlRequest(withKey(tenant, second.key), { query: "SELECT 1" })).status).toBe(200);
    // Revoking again is harmless (an answer that was lost can be retried).
    expect(
      (await asTenant(second.key, `/v1/tenants/${tenant.id}/keys/${firstId}`, { method: "DELETE" })).status,
    ).toBe(204);
  });

  it("records last use to the minute, and refuses to revoke the last key unless forced", async () => {
    const tenant = await createTenant(uniqueTenantId("lastkey"));
    expect((await sqlRequest(tenant.connectionString, { query: "SELECT 1" })).status).toBe(200);
    await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id));
    const [only] = (await (await admin(`/v1/tenants/${tenant.id}/keys`)).json<{ keys: KeyView[] }>()).keys;
    expect(only?.lastUsedAt).toMatch(/:00\.000Z$/);
    const refused = await admin(`/v1/tenants/${tenant.id}/keys/${only?.keyId}`, { method: "DELETE" });
    expect(refused.status).toBe(409);
    expect(await refused.json()).toMatchObject({ code: "last_key" });
    expect((await sqlRequest(tenant.connectionString, { query: "SELECT 1" })).status).toBe(200);
    const forced = await admin(`/v1/tenants/${tenant.id}/keys/${only?.keyId}?force=true`, {
      method: "DELETE",
    });
    expect(forced.status).toBe(204);
    expect((await sqlRequest(tenant.connectionString, { query: "SELECT 1" })).status).toBe(400);
    // The operator issues a new one.
    const fresh = await admin(`/v1/tenants/${tenant.id}/keys`, { method: "POST", json: {} });
    expect(fresh.status).toBe(201);
    const { key } = await fresh.json<{ key: string }>();
    expect((await sqlRequest(withKey(tenant, key), { query: "SELECT 1" })).status).toBe(200);
  });

  it("never exceeds the limit, whatever runs concurrently", async () => {
    const tenant = await createTenant(uniqueTenantId("keycap"));
    const answers = await Promise.all(Array.from({ length: 10 }, () => issue(tenant, tenant.key)));
    const statuses = answers.map((a) => a.status);
    // The test deployment allows 5; the tenant holds 1 already.
    expect(statuses.filter((s) => s === 201)).toHaveLength(4);
    expect(statuses.filter((s) => s === 409)).toHaveLength(6);
    const keys = (await (await admin(`/v1/tenants/${tenant.id}/keys`)).json<{ keys: KeyView[] }>()).keys;
    expect(keys).toHaveLength(5);
  });

  it("concurrent issue and revoke never exceed the limit, and a key kept works throughout", async () => {
    const tenant = await createTenant(uniqueTenantId("keyrace"));
    const extra: { keyId: string; key: string }[] = [];
    for (let i = 0; i < 4; i++) extra.push(await (await issue(tenant, tenant.key)).json());
    // Five keys: the limit. Revoke two while six issues race them; the first key keeps working.
    const revokes = extra
      .slice(0, 2)
      .map((k) => asTenant(tenant.key, `/v1/tenants/${tenant.id}/keys/${k.keyId}`, { method: "DELETE" }));
    const issues = Array.from({ length: 6 }, () => issue(tenant, tenant.key));
    const queries = Array.from({ length: 4 }, () =>
      sqlRequest(tenant.connectionString, { query: "SELECT 1" }),
    );
    const [revoked, issued, served] = await Promise.all([
      Promise.all(revokes),
      Promise.all(issues),
      Promise.all(queries),
    ]);
    expect(revoked.map((r) => r.status)).toEqual([204, 204]);
    expect(served.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    const granted = issued.filter((r) => r.status === 201).length;
    expect(issued.every((r) => r.status === 201 || r.status === 409)).toBe(true);
    // At most the two freed places were taken, whatever the interleaving.
    expect(granted).toBeLessThanOrEqual(2);
    const keys = (await (await admin(`/v1/tenants/${tenant.id}/keys`)).json<{ keys: KeyView[] }>()).keys;
    expect(keys.length).toBe(3 + granted);
    expect(keys.length).toBeLessThanOrEqual(5);
    // The revoked keys fail at once on every route.
    for (const gone of extra.slice(0, 2)) {
      expect((await sqlRequest(withKey(tenant, gone.key), { query: "SELECT 1" })).status).toBe(400);
      expect((await asTenant(gone.key, `/v1/tenants/${tenant.id}/usage`)).status).toBe(401);
    }
    expect((await sqlRequest(tenant.connectionString, { query: "SELECT 1" })).status).toBe(200);
  });

  it("a key issued with an expiry stops working then", async () => {
    const tenant = await createTenant(uniqueTenantId("expiry"));
    const expiresAt = new Date(Date.now() + 60_000).toISOString();
    const issued = await issue(tenant, tenant.key, { expiresAt });
    const { key } = await issued.json<{ key: string; expiresAt: string }>();
    expect((await sqlRequest(withKey(tenant, key), { query: "SELECT 1" })).status).toBe(200);
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      vi.setSystemTime(Date.now() + 61_000);
      expect((await sqlRequest(withKey(tenant, key), { query: "SELECT 1" })).status).toBe(400);
      expect((await sqlRequest(tenant.connectionString, { query: "SELECT 1" })).status).toBe(200);
    } finally {
      vi.useRealTimers();
    }
    for (const bad of [{ expiresAt: "tomorrow" }, { expiresAt: "2001-01-01T00:00:00Z" }]) {
      const refused = await issue(tenant, tenant.key, bad);
      expect(refused.status).toBe(400);
      expect(await refused.json()).toMatchObject({ code: "invalid_request" });
    }
  });
});
