/**
 * Faults get distinct answers with retry hints, and never an unbounded wait: a backend killed
 * mid-query, a database that cannot be reached or refuses us, a stale generation, a disabled tenant.
 */
import { env, runInDurableObject } from "cloudflare:test";
import { describe, expect, it, vi } from "vitest";
import { provisioningHooksForTests } from "../../src/provisioning/test-hooks.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  countBackends,
  createTenant,
  hostAdminUrl,
  lessor,
  sqlFor,
  uniqueTenantId,
} from "./harness.ts";

function sqlRequest(tenant: CreatedTenant, query: string, params: unknown[] = []): Promise<Response> {
  return lessor("/sql", {
    method: "POST",
    headers: {
      "Neon-Connection-String": tenant.connectionString,
      "Neon-Raw-Text-Output": "true",
      "Neon-Array-Mode": "true",
    },
    body: JSON.stringify({ query, params }),
  });
}

/** Address of the `faulty` test host as the WebSocket proxy sees it. */
function faultyAddress(): string {
  const url = new URL(hostAdminUrl("faulty").replace(/^postgres:/, "http:"));
  return `${url.hostname}:${url.port}`;
}

async function proxy(action: "stats" | "block" | "unblock", address = faultyAddress()) {
  const response = await fetch(
    `${env.TEST_PROXY_CONTROL_URL}/${action}?address=${encodeURIComponent(address)}`,
  );
  expect(response.status).toBe(200);
  return response.json<{ tunnels: Record<string, number>; blocked: string[] }>();
}

async function tunnelsToFaulty(): Promise<number> {
  return (await proxy("stats")).tunnels[faultyAddress()] ?? 0;
}

/** Stops the clock the objects read (this isolate's Date) at now, and answers it. */
function frozenClock(): number {
  const now = Date.now();
  vi.useFakeTimers({ toFake: ["Date"] });
  vi.setSystemTime(now);
  return now;
}

async function expectStartRefused(response: Response) {
  expect(response.status).toBe(503);
  expect(Number(response.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
  expect(await response.json()).toMatchObject({ code: "tenant_starting_failed" });
}

describe("faults", () => {
  it("a backend killed mid-query fails the lease with a retryable error and is replaced", async () => {
    const tenant = await createTenant(uniqueTenantId("kill"));
    // The statement bound (5 s in tests) is far past the test for this tenant (test-only setting,
    // Postgres's own limits with it, from the pool's start): what ends the sleep is the kill, never
    // the bound on a machine slow to find the backend.
    tenantHooksForTests.config = (id) => (id === tenant.id ? { statementTimeoutMs: 600_000 } : undefined);
    const sql = sqlFor(tenant);
    let response: Response;
    try {
      await sql`SELECT 1`;
      const slow = sqlRequest(tenant, "SELECT pg_sleep(30)");
      // Find the backend running the sleep, and kill it.
      let killed = false;
      for (let i = 0; i < 200 && !killed; i++) {
        killed = await asSuperuser(async (client) => {
          const { rows } = await client.query(
            `SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
             WHERE application_name LIKE $1 AND query LIKE '%pg_sleep(30)%' AND state = 'active'`,
            [`lessor:${tenant.role}:%`],
          );
          return rows.some((row: { ok: boolean }) => row.ok);
        });
        if (!killed) await new Promise((resolve) => setTimeout(resolve, 50));
      }
      expect(killed).toBe(true);
      response = await slow;
    } finally {
      tenantHooksForTests.config = undefined;
    }
    expect(response.status).toBe(503);
    expect(response.headers.get("Retry-After")).toBeTruthy();
    expect(await response.json()).toMatchObject({ code: "connection_lost" });
    // The next query works on a replacement connection of the same generation.
    expect(await sql`SELECT current_setting('application_name') AS app`).toEqual([
      { app: `lessor:${tenant.role}:1` },
    ]);
    const idleInTx = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE $1 AND state LIKE 'idle in transaction%'",
        [`lessor:${tenant.role}:%`],
      );
      return rows[0]?.n;
    });
    expect(idleInTx).toBe(0);
  });

  it("a backend killed under a session lease ends that lease as lease_lost", async () => {
    const tenant = await createTenant(uniqueTenantId("kill-lease"));
    const opened = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: "{}",
    });
    const { lease } = await opened.json<{ lease: string }>();
    const run = (query: string) =>
      lessor(`/v1/leases/${lease}/sql`, {
        method: "POST",
        headers: { Authorization: `Bearer ${tenant.key}` },
        body: JSON.stringify({ query }),
      });
    expect((await run("BEGIN")).status).toBe(200);
    const pid = await (await run("SELECT pg_backend_pid()")).json<{ rows: string[][] }>();
    await asSuperuser((client) =>
      client.query("SELECT pg_terminate_backend($1)", [Number(pid.rows[0]?.[0])]),
    );
    const during = await run("INSERT INTO notes (body) VALUES ('lost')");
    expect(during.status).toBe(503);
    expect(await during.json()).toMatchObject({ code: "connection_lost" });
    const after = await run("COMMIT");
    expect(after.status).toBe(409);
    expect(await after.json()).toMatchObject({ code: "lease_lost" });
    const status = await env.TENANTS.getByName(tenant.id).status();
    expect(status.leases).toBe(0);
  });

  it("an unreachable database: failed with a reason, backoff with Retry-After, zero attempts while backing off", async () => {
    const tenant = await createTenant(uniqueTenantId("unreach"), { host: "faulty" });
    // The objects' clock stands still unless the test moves it: the backoff ends when the test
    // says, not when a loaded machine gets round to the next request.
    const now = frozenClock();
    await proxy("block");
    try {
      await expectStartRefused(await sqlRequest(tenant, "SELECT 1"));
      const status = await env.TENANTS.getByName(tenant.id).status();
      expect(status.state).toBe("failed");
      expect(status.failureReason).toBe("unreachable");
      const retryAt = Date.parse(status.retryAt ?? "");
      expect(retryAt).toBeGreaterThan(now);
      // During the backoff: N requests make 0 connection attempts.
      await proxy("unblock");
      const before = await tunnelsToFaulty();
      const during = await Promise.all(Array.from({ length: 20 }, () => sqlRequest(tenant, "SELECT 1")));
      for (const response of during) await expectStartRefused(response);
      expect(await tunnelsToFaulty()).toBe(before);
      // At the end of the backoff, the next request starts a generation and works.
      vi.setSystemTime(retryAt);
      expect(await sqlFor(tenant)`SELECT 1 AS one`).toEqual([{ one: 1 }]);
      expect((await env.TENANTS.getByName(tenant.id).status()).state).toBe("ready");
    } finally {
      vi.useRealTimers();
      await proxy("unblock");
    }
  });

  it("consecutive failures back off exponentially", async () => {
    const tenant = await createTenant(uniqueTenantId("backoff"), { host: "faulty" });
    let now = frozenClock();
    await proxy("block");
    try {
      const delays: number[] = [];
      for (let i = 0; i < 3; i++) {
        await expectStartRefused(await sqlRequest(tenant, "SELECT 1"));
        const retryAt = Date.parse((await env.TENANTS.getByName(tenant.id).status()).retryAt ?? "");
        delays.push(retryAt - now);
        // The next attempt comes exactly when the backoff ends.
        now = retryAt;
        vi.setSystemTime(now);
      }
      // Jitter keeps each delay in [½, 1] of its ceiling: 500 ms, 1 s, 2 s.
      const ceilings = [500, 1_000, 2_000];
      delays.forEach((delay, i) => {
        const ceiling = ceilings[i] ?? 0;
        expect(delay, `delay ${i + 1}`).toBeGreaterThanOrEqual(ceiling / 2);
        expect(delay, `delay ${i + 1}`).toBeLessThanOrEqual(ceiling);
      });
    } finally {
      vi.useRealTimers();
      await proxy("unblock");
    }
  });

  for (const [fault, breakIt, mendIt, reason] of [
    [
      // A changed password is repaired by Lessor itself (containment.test.ts); a role that may not
      // log in at all is an operator's problem.
      "refusing the login",
      (t: CreatedTenant) => `ALTER ROLE "${t.role}" NOLOGIN`,
      (t: CreatedTenant) => `ALTER ROLE "${t.role}" LOGIN`,
      "auth_failed",
    ],
    [
      "at too many connections",
      (t: CreatedTenant) => `ALTER DATABASE "${t.database}" CONNECTION LIMIT 0`,
      (t: CreatedTenant) => `ALTER DATABASE "${t.database}" CONNECTION LIMIT -1`,
      "too_many_connections",
    ],
    [
      "missing",
      (t: CreatedTenant) => `ALTER DATABASE "${t.database}" RENAME TO "gone_${t.id}"`,
      (t: CreatedTenant) => `ALTER DATABASE "gone_${t.id}" RENAME TO "${t.database}"`,
      "database_missing",
    ],
  ] as const) {
    it(`a database ${fault} gives failed:${reason} and a retryable 503`, async () => {
      const tenant = await createTenant(uniqueTenantId("dbfault"));
      await asSuperuser((client) => client.query(breakIt(tenant)));
      try {
        await expectStartRefused(await sqlRequest(tenant, "SELECT 1"));
        const status = await env.TENANTS.getByName(tenant.id).status();
        expect(status.state).toBe("failed");
        expect(status.failureReason).toBe(reason);
        // The answer never names the role, the database or a password.
        const again = await sqlRequest(tenant, "SELECT 1");
        const text = await again.text();
        expect(text).not.toContain(tenant.database);
        expect(text).not.toMatch(/password|postgres:\/\//i);
      } finally {
        await asSuperuser((client) => client.query(mendIt(tenant)));
      }
    });
  }

  it("a lease of a generation that died gets 409 stale_generation and never runs on the new one", async () => {
    const tenant = await createTenant(uniqueTenantId("stale"));
    const opened = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: JSON.stringify({ ttlMs: 60_000 }),
    });
    const { lease, generation } = await opened.json<{ lease: string; generation: number }>();
    // The object dies with its pool live, as in a deploy or a crash (evictDurableObject waits for
    // the open connections forever, so reset it from inside).
    const outcome = await runInDurableObject(env.TENANTS.getByName(tenant.id), (_instance, state) => {
      state.abort("test: object reset");
    }).then(
      () => "not reset",
      (error: unknown) => String(error),
    );
    expect(outcome).toMatch(/object reset/);
    // A new generation starts for other work.
    expect(await sqlFor(tenant)`SELECT current_setting('application_name') AS app`).toEqual([
      { app: `lessor:${tenant.role}:${generation + 1}` },
    ]);
    const response = await lessor(`/v1/leases/${lease}/sql`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: JSON.stringify({ query: "INSERT INTO notes (body) VALUES ('must not run')" }),
    });
    expect(response.status).toBe(409);
    expect(response.headers.get("Retry-After")).toBeTruthy();
    expect(await response.json()).toMatchObject({ code: "stale_generation" });
    const notes = await sqlFor(tenant)`SELECT count(*)::int AS n FROM notes`;
    expect(notes).toEqual([{ n: 0 }]);
  });

  it("a disabled tenant gets 423 tenant_disabled, and works again once enabled", async () => {
    const tenant = await createTenant(uniqueTenantId("disabled"));
    expect(await sqlFor(tenant)`SELECT 1 AS one`).toEqual([{ one: 1 }]);
    expect((await admin(`/v1/tenants/${tenant.id}/disable`, { method: "POST" })).status).toBe(200);
    const refused = await sqlRequest(tenant, "SELECT 1");
    expect(refused.status).toBe(423);
    expect(await refused.json()).toMatchObject({ code: "tenant_disabled" });
    // An unauthenticated caller cannot learn that the tenant is disabled.
    const stranger = await lessor("/sql", {
      method: "POST",
      headers: {
        "Neon-Connection-String": tenant.connectionString.replace(tenant.key, "lsk_wrongwrongwrong"),
      },
      body: JSON.stringify({ query: "SELECT 1" }),
    });
    expect(stranger.status).toBe(400);
    expect(await stranger.json()).toMatchObject({ code: "28P01" });
    expect((await admin(`/v1/tenants/${tenant.id}/enable`, { method: "POST" })).status).toBe(200);
    expect(await sqlFor(tenant)`SELECT 1 AS one`).toEqual([{ one: 1 }]);
  });

  it("no pooled backend of a stopped tenant is left behind", async () => {
    const tenant = await createTenant(uniqueTenantId("leftover"));
    await sqlFor(tenant)`SELECT 1`;
    expect(await countBackends(`lessor:${tenant.role}:`)).toBeGreaterThan(0);
    const drained = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    expect(drained.status).toBe(202);
    expect((await drained.json<{ runtime: { state: string } }>()).runtime.state).toBe("stopped");
    for (let i = 0; i < 50 && (await countBackends(`lessor:${tenant.role}:`)) > 0; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(await countBackends(`lessor:${tenant.role}:`)).toBe(0);
  });

  describe("a create cut by a transient fault (issue 32)", () => {
    /** Blocks the faulty host's proxy when the create's database is made; unblocks after `mendAfterMs` (never if null). */
    function breakAtDatabaseClosed(tenantId: string, mendAfterMs: number | null): { reached: () => number } {
      let reached = 0;
      provisioningHooksForTests.onStep = async (event) => {
        if (event.tenantId !== tenantId || event.step !== "database_closed") return;
        reached++;
        if (reached > 1) return;
        await proxy("block");
        if (mendAfterMs !== null) setTimeout(() => void proxy("unblock"), mendAfterMs);
      };
      return { reached: () => reached };
    }

    it("runs its steps again within the request and answers 201", async () => {
      const id = uniqueTenantId("prov-retry");
      const fault = breakAtDatabaseClosed(id, 400);
      try {
        const created = await admin("/v1/tenants", { method: "POST", json: { id, host: "faulty" } });
        expect(created.status).toBe(201);
        // The fault landed: the steps ran again after the refused connection.
        expect(fault.reached()).toBeGreaterThanOrEqual(2);
        const { key } = await created.json<{ key: string }>();
        expect(key).toMatch(/^lsk_/);
      } finally {
        provisioningHooksForTests.onStep = undefined;
        await proxy("unblock");
      }
    });

    it("answers 503 provisioning_interrupted with Retry-After when the fault outlasts the bound, and the same create resumes", async () => {
      const id = uniqueTenantId("prov-cut");
      const fault = breakAtDatabaseClosed(id, null);
      try {
        const cut = await admin("/v1/tenants", { method: "POST", json: { id, host: "faulty" } });
        expect(cut.status).toBe(503);
        expect(Number(cut.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
        expect(await cut.json()).toMatchObject({ code: "provisioning_interrupted" });
        // The fault landed after the database was made; every later attempt met it at its first step.
        expect(fault.reached()).toBe(1);
      } finally {
        provisioningHooksForTests.onStep = undefined;
        await proxy("unblock");
      }
      const resumed = await admin("/v1/tenants", { method: "POST", json: { id, host: "faulty" } });
      expect(resumed.status).toBe(201);
    });
  });
});
