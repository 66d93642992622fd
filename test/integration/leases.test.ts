/**
 * Session leases: interactive transactions across requests, owner-only use, TTL extension and
 * reclaim, and the differential test that no session state passes from one lease to the next.
 */
import { env, runDurableObjectAlarm } from "cloudflare:test";
import { describe, expect, it, vi } from "vitest";
import {
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  pollUntil,
  uniqueTenantId,
} from "./harness.ts";

interface QueryResult {
  rows: (string | null)[][];
  fields: { name: string }[];
}

function openLease(tenant: CreatedTenant, ttlMs = 30_000, key = tenant.key): Promise<Response> {
  return lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs }),
  });
}

async function lease(tenant: CreatedTenant, ttlMs = 30_000): Promise<string> {
  const response = await openLease(tenant, ttlMs);
  expect(response.status).toBe(201);
  const body = await response.json<{ lease: string; generation: number; expiresAt: string }>();
  expect(body.generation).toBeGreaterThan(0);
  expect(Date.parse(body.expiresAt)).toBeGreaterThan(Date.now());
  return body.lease;
}

function leaseSql(token: string, key: string, query: string, params: unknown[] = []): Promise<Response> {
  return lessor(`/v1/leases/${token}/sql`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ query, params }),
  });
}

async function leaseRows(token: string, key: string, query: string, params: unknown[] = []) {
  const response = await leaseSql(token, key, query, params);
  if (response.status !== 200) throw new Error(`${query}: ${response.status} ${await response.text()}`);
  return (await response.json<QueryResult>()).rows;
}

function release(token: string, key: string): Promise<Response> {
  return lessor(`/v1/leases/${token}`, { method: "DELETE", headers: { Authorization: `Bearer ${key}` } });
}

describe("session leases", () => {
  it("carries a transaction across requests: BEGIN, statements, COMMIT or ROLLBACK", async () => {
    const tenant = await createTenant(uniqueTenantId("lease-tx"));
    const token = await lease(tenant);
    await leaseRows(token, tenant.key, "BEGIN");
    await leaseRows(token, tenant.key, "INSERT INTO notes (body) VALUES ($1)", ["kept"]);
    await leaseRows(token, tenant.key, "INSERT INTO notes (body) VALUES ($1)", ["also kept"]);
    await leaseRows(token, tenant.key, "COMMIT");
    await leaseRows(token, tenant.key, "BEGIN");
    await leaseRows(token, tenant.key, "INSERT INTO notes (body) VALUES ($1)", ["rolled back"]);
    // Another connection must not see the open transaction's write.
    const outside = await asSuperuser(
      (client) => client.query("SELECT body FROM notes ORDER BY id"),
      tenant.database,
    );
    expect(outside.rows.map((row) => row.body)).toEqual(["kept", "also kept"]);
    await leaseRows(token, tenant.key, "ROLLBACK");
    const rows = await leaseRows(token, tenant.key, "SELECT body FROM notes ORDER BY id");
    expect(rows).toEqual([["kept"], ["also kept"]]);
    expect((await release(token, tenant.key)).status).toBe(204);
    expect((await leaseSql(token, tenant.key, "SELECT 1")).status).toBe(404);
  });

  it("answers Postgres errors in the /sql shape and keeps the lease usable", async () => {
    const tenant = await createTenant(uniqueTenantId("lease-err"));
    const token = await lease(tenant);
    const response = await leaseSql(token, tenant.key, "SELECT 1/0");
    expect(response.status).toBe(400);
    expect(await response.json()).toMatchObject({ code: "22012" });
    expect(await leaseRows(token, tenant.key, "SELECT 2")).toEqual([["2"]]);
    await release(token, tenant.key);
  });

  it("only the owning tenant's key can use or release a lease, and a stranger learns nothing", async () => {
    const owner = await createTenant(uniqueTenantId("lease-own"));
    const other = await createTenant(uniqueTenantId("lease-oth"));
    const token = await lease(owner);
    // Another tenant's key on the owner's lease, and a key on a lease of a tenant that never
    // existed: the same refusal, decided at the edge (the key is not one minted for that tenant).
    const stolen = await leaseSql(token, other.key, "SELECT current_database()");
    const nobody = await leaseSql(`lsl_${uniqueTenantId("nobody")}_${"0".repeat(48)}`, other.key, "SELECT 1");
    expect(stolen.status).toBe(401);
    expect(nobody.status).toBe(401);
    expect(await stolen.json()).toEqual(await nobody.json());
    expect((await release(token, other.key)).status).toBe(401);
    expect((await leaseSql(token, "lsk_not-a-key", "SELECT 1")).status).toBe(401);
    expect((await openLease(owner, 1_000, other.key)).status).toBe(401);
    // The owner asking about a lease that does not exist is told so.
    expect((await leaseSql(`lsl_${owner.id}_${"0".repeat(48)}`, owner.key, "SELECT 1")).status).toBe(404);
    // The owner's lease is untouched by all of that.
    expect(await leaseRows(token, owner.key, "SELECT 1")).toEqual([["1"]]);
    expect((await release(token, owner.key)).status).toBe(204);
  });

  it("refuses malformed tokens and bodies with codes", async () => {
    const tenant = await createTenant(uniqueTenantId("lease-bad"));
    expect((await leaseSql("not-a-lease", tenant.key, "SELECT 1")).status).toBe(404);
    expect((await leaseSql("lsl_Bad_Tenant_abc", tenant.key, "SELECT 1")).status).toBe(404);
    const badTtl = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: JSON.stringify({ ttlMs: "soon" }),
    });
    expect(badTtl.status).toBe(400);
    expect(await badTtl.json()).toMatchObject({ code: "invalid_request" });
    const token = await lease(tenant);
    const batch = await lessor(`/v1/leases/${token}/sql`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: JSON.stringify({ queries: [{ query: "SELECT 1" }] }),
    });
    expect(batch.status).toBe(400);
    await release(token, tenant.key);
  });

  it("reclaims an expired lease with an alarm: rolls back its transaction and frees the pool", async () => {
    const tenant = await createTenant(uniqueTenantId("lease-exp"), { tier: "solo" });
    const stub = env.TENANTS.getByName(tenant.id);
    // The objects' clock (this isolate's Date) moves only when the test moves it: the 1 s TTL runs
    // out when the test says, not between two of its requests on a loaded machine.
    const opened = Date.now();
    vi.useFakeTimers({ toFake: ["Date"] });
    let status: Awaited<ReturnType<typeof stub.status>>;
    let late: Response;
    try {
      vi.setSystemTime(opened);
      const token = await lease(tenant, 1_000);
      await leaseRows(token, tenant.key, "BEGIN");
      await leaseRows(token, tenant.key, "INSERT INTO notes (body) VALUES ('abandoned')");
      // Still alive just before its TTL: nothing reclaimed it early.
      vi.setSystemTime(opened + 999);
      await runDurableObjectAlarm(stub);
      expect((await stub.status()).reclaimedLeases).toBe(0);
      // The owner vanishes. Past the TTL, the alarm runs.
      vi.setSystemTime(opened + 1_200);
      await runDurableObjectAlarm(stub);
      // The alarm may already have been running on its own schedule: wait for its reclaim to finish.
      status = await pollUntil(
        () => stub.status(),
        (s) => s.sessions === 0 && s.leases === 0,
      );
      // Its owner learns why: the lease expired (not "no such lease").
      late = await leaseSql(token, tenant.key, "SELECT 1");
    } finally {
      vi.useRealTimers();
    }
    expect(status.leases).toBe(0);
    expect(status.sessions).toBe(0);
    expect(status.reclaimedLeases).toBe(1);
    expect(late.status).toBe(409);
    expect(((await late.json()) as { code: string }).code).toBe("lease_expired");
    // The transaction was rolled back and no backend is left idle in transaction.
    const leftovers = await asSuperuser(async (client) => {
      const notes = await client.query("SELECT count(*)::int AS n FROM notes");
      return notes.rows[0]?.n;
    }, tenant.database);
    expect(leftovers).toBe(0);
    const idleInTx = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE $1 AND state LIKE 'idle in transaction%'",
        [`lessor:${tenant.role}:%`],
      );
      return rows[0]?.n;
    });
    expect(idleInTx).toBe(0);
    // The solo pool's one connection is usable again, so the pool can drain.
    const next = await lease(tenant);
    expect(await leaseRows(next, tenant.key, "SELECT count(*) FROM notes")).toEqual([["0"]]);
    await release(next, tenant.key);
  });

  it("each use extends the TTL", async () => {
    const tenant = await createTenant(uniqueTenantId("lease-ttl"));
    // The objects' clock (this isolate's Date) moves only when the test moves it.
    const opened = Date.now();
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      vi.setSystemTime(opened);
      const token = await lease(tenant, 1_500);
      const stub = env.TENANTS.getByName(tenant.id);
      let at = opened;
      for (let i = 0; i < 3; i++) {
        at += 700;
        vi.setSystemTime(at);
        await leaseRows(token, tenant.key, "SELECT 1");
        await runDurableObjectAlarm(stub);
      }
      // 2.1 s after opening a 1.5 s lease, it is still alive because each use extended it.
      expect(await leaseRows(token, tenant.key, "SELECT 1")).toEqual([["1"]]);
      expect((await stub.status()).reclaimedLeases).toBe(0);
      // And the TTL is real: 1.5 s after its last use, the alarm reclaims it.
      vi.setSystemTime(at + 1_500);
      await runDurableObjectAlarm(stub);
      expect((await stub.status()).reclaimedLeases).toBe(1);
      const late = await leaseSql(token, tenant.key, "SELECT 1");
      expect(late.status).toBe(409);
      expect(((await late.json()) as { code: string }).code).toBe("lease_expired");
    } finally {
      vi.useRealTimers();
    }
  });

  it("never passes session state from one lease to the next on the same backend", async () => {
    // A pool of one connection: both leases get the same backend, which the test checks.
    const tenant = await createTenant(uniqueTenantId("lease-diff"), { tier: "solo" });
    const probe = [
      "SELECT current_setting('search_path') AS search_path, current_setting('statement_timeout') AS statement_timeout,",
      "current_user AS usr, session_user AS session_usr,",
      "(SELECT count(*) FROM pg_prepared_statements) AS prepared,",
      "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS advisory,",
      "(SELECT count(*) FROM pg_listening_channels()) AS listening,",
      "(SELECT count(*) FROM pg_class WHERE relpersistence = 't') AS temp_tables,",
      "current_setting('application_name') AS app, current_setting('work_mem') AS work_mem, pg_backend_pid() AS pid",
    ].join(" ");
    const fresh = await lease(tenant);
    const baseline = await leaseRows(fresh, tenant.key, probe);
    await leaseRows(fresh, tenant.key, "CREATE SEQUENCE leak_seq START 7000");
    // Sequence state is per session: lastval() answers 55000 until this session calls nextval.
    const lastval = async (token: string) => {
      const response = await leaseSql(token, tenant.key, "SELECT lastval()::text");
      const body = await response.json<{ rows?: string[][]; code?: string }>();
      return response.status === 200 ? (body.rows?.[0]?.[0] ?? null) : (body.code ?? null);
    };
    expect(await lastval(fresh)).toBe("55000");
    await release(fresh, tenant.key);

    const dirty = await lease(tenant);
    for (const statement of [
      "SET search_path = pg_catalog",
      "SET statement_timeout = '1234ms'",
      `SET ROLE "${tenant.role}"`,
      "PREPARE leaked_plan AS SELECT 1",
      "CREATE TEMP TABLE leaked_temp (x int)",
      "SELECT pg_advisory_lock(42)",
      "LISTEN leaked_channel",
      "SELECT nextval('public.leak_seq')",
      "BEGIN",
      "SET work_mem = '7MB'",
      "ROLLBACK",
      "SET work_mem = '9MB'",
    ]) {
      await leaseRows(dirty, tenant.key, statement);
    }
    const dirtyView = await leaseRows(dirty, tenant.key, probe);
    expect(dirtyView[0]).not.toEqual(baseline[0]);
    expect(await lastval(dirty)).toBe("7000");
    await release(dirty, tenant.key);

    const next = await lease(tenant);
    const after = await leaseRows(next, tenant.key, probe);
    // Same backend (so the test means something), and exactly what a fresh connection sees.
    expect(after[0]?.at(-1)).toBe(baseline[0]?.at(-1));
    expect(after).toEqual(baseline);
    expect(await lastval(next)).toBe("55000");
    await release(next, tenant.key);
  });

  it("caps session leases at the pool size with a retryable refusal", async () => {
    const tenant = await createTenant(uniqueTenantId("lease-cap"), { tier: "free" });
    const first = await lease(tenant);
    const second = await lease(tenant);
    const third = await openLease(tenant);
    expect(third.status).toBe(503);
    expect(third.headers.get("Retry-After")).toBeTruthy();
    expect(await third.json()).toMatchObject({ code: "lease_limit" });
    await release(first, tenant.key);
    await release(second, tenant.key);
  });
});
