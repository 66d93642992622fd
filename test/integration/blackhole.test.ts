/**
 * A silent database (issue 18): the host accepts the connection and then says nothing, as a stalled
 * network, a frozen compute or a proxy that never answers would. The test proxy's stall mode freezes
 * every tunnel to the `silent` host, open or new. Lessor must answer within a bound, free what the
 * silent connection held, replace it once the host speaks again, and never wait forever.
 */
import { env } from "cloudflare:test";
import { afterEach, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import { withConnection } from "../../src/postgres/index.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  hostAdminUrl,
  lessor,
  pollUntil,
  sqlFor,
  uniqueTenantId,
} from "./harness.ts";

/** Address of the `silent` test host as the WebSocket proxy sees it. */
function silentAddress(): string {
  const url = new URL(hostAdminUrl("silent").replace(/^postgres:/, "http:"));
  return `${url.hostname}:${url.port}`;
}

/** Stalls or unstalls the silent host; answers the proxy's stats after the change. */
async function proxy(
  action: "stall" | "unstall",
): Promise<{ frozen: Record<string, number>; stalled: string[] }> {
  const response = await fetch(
    `${env.TEST_PROXY_CONTROL_URL}/${action}?address=${encodeURIComponent(silentAddress())}`,
  );
  expect(response.status).toBe(200);
  return response.json();
}

function sqlRequest(tenant: CreatedTenant, query: string): Promise<Response> {
  return lessor("/sql", {
    method: "POST",
    headers: {
      "Neon-Connection-String": tenant.connectionString,
      "Neon-Raw-Text-Output": "true",
      "Neon-Array-Mode": "true",
    },
    body: JSON.stringify({ query, params: [] }),
  });
}

/**
 * A hang detector, not a measurement: how long an answer may take while the host is silent before
 * the test calls it hung (the connect bound is 10 s, the statement bound 5 s in tests plus the
 * cancel grace of 2 s). It asserts no time; a wait that never ends fails by name instead of
 * running into the test's timeout.
 */
const hungAfterMs = 40_000;

/** The advisory lock the commit test holds in the tenant's database (any key no other code takes). */
const blackholeLockKey = 3_918_118;

/** Settles as `work` does, or throws "hung: <what>" once the detector's bound has passed. */
async function answered<T>(what: string, work: Promise<T>): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const hung = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`hung: ${what}`)), hungAfterMs);
  });
  try {
    return await Promise.race([work, hung]);
  } finally {
    clearTimeout(timer);
  }
}

interface HostStatus {
  host: string;
  allocated: number;
  reserved: number;
  leases: number;
  maintenance: { inUse: number; waiting: number };
}

async function silentHost(): Promise<HostStatus> {
  const response = await admin("/v1/capacity");
  const { hosts } = await response.json<{ hosts: HostStatus[] }>();
  const host = hosts.find((h) => h.host === "silent");
  if (!host) throw new Error("no silent host in /v1/capacity");
  return host;
}

describe("a silent database (blackhole)", () => {
  afterEach(async () => {
    tenantHooksForTests.config = undefined;
    await proxy("unstall");
  });

  it("a cold start to a silent host answers 503 with Retry-After and a classified reason, within the bound", async () => {
    const tenant = await createTenant(uniqueTenantId("bh-cold"), { host: "silent" });
    await proxy("stall");
    const response = await answered("a cold start to the silent host", sqlRequest(tenant, "SELECT 1"));
    expect(response.status).toBe(503);
    expect(Number(response.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
    expect(await response.json()).toMatchObject({ code: "tenant_starting_failed" });
    const status = await env.TENANTS.getByName(tenant.id).status();
    expect(status.state).toBe("failed");
    expect(status.failureReason).toBe("timeout");
    // The failed start holds nothing of the host: no allocation, no reservation, no maintenance slot.
    const host = await pollUntil(silentHost, (h) => h.maintenance.inUse === 0);
    expect(host).toMatchObject({ allocated: 0, reserved: 0, leases: 0, maintenance: { inUse: 0 } });
    // Once the host speaks again, the first request after the backoff starts a generation.
    await proxy("unstall");
    const wait = Date.parse(status.retryAt ?? "") - Date.now();
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, wait) + 50));
    expect(await sqlFor(tenant)`SELECT 1 AS one`).toEqual([{ one: 1 }]);
  });

  it("a warm connection that goes silent mid-query frees its pool slot within the bound and is replaced", async () => {
    const tenant = await createTenant(uniqueTenantId("bh-warm"), { host: "silent" });
    const sql = sqlFor(tenant);
    expect(await sql`SELECT current_setting('application_name') AS app`).toEqual([
      { app: `lessor:${tenant.role}:1` },
    ]);
    await proxy("stall");
    // The statement goes into a tunnel that will never answer.
    const stuck = await answered("a statement on a connection gone silent", sqlRequest(tenant, "SELECT 1"));
    // Lessor cannot tell a silent database from a statement that ignores its cancel (or, if the
    // pooled connection was replaced first, from a checkout that timed out): each answer says the
    // statement did not complete.
    expect([400, 503]).toContain(stuck.status);
    expect((await stuck.json<{ code: string }>()).code).toMatch(
      /^(statement_timeout|connection_lost|lease_timeout)$/,
    );
    // The lease is back, and whatever the cut connection's cleanup took is released within the bound.
    const status = await env.TENANTS.getByName(tenant.id).status();
    expect(status.leases).toBe(0);
    const host = await pollUntil(silentHost, (h) => h.maintenance.inUse === 0 && h.leases === 0, {
      attempts: 100,
      intervalMs: 250,
    });
    expect(host.maintenance.inUse).toBe(0);
    expect(host.leases).toBe(0);
    // While the host stays silent, a new request is refused within the bound too (no slot waits on
    // the dead connection).
    const again = await answered("a new request while the host is silent", sqlRequest(tenant, "SELECT 1"));
    expect(again.status).toBe(503);
    expect(again.headers.get("Retry-After")).toBeTruthy();
    // The host speaks again: the same generation serves on a replacement connection.
    await proxy("unstall");
    const replaced = await pollUntil(
      async () => (await sqlRequest(tenant, "SELECT current_setting('application_name')")).status,
      (code) => code === 200,
      { attempts: 20, intervalMs: 500 },
    );
    expect(replaced).toBe(200);
    expect(await sql`SELECT current_setting('application_name') AS app`).toEqual([
      { app: `lessor:${tenant.role}:1` },
    ]);
  });

  it("a statement that commits while its answer is stuck is never answered as not committed", async () => {
    // The soak's find: the answer of a committed write stalled in the network past the bound; the
    // connection was cut and the answer said `statement_timeout` ("did not commit"), a lie.
    const tenant = await createTenant(uniqueTenantId("bh-commit"), { host: "silent" });
    // The pool starts with Postgres's own limits (lock and statement timeouts) far past the test, so
    // the statement below waits for the test's lock however long the test takes; its statement
    // bound, read at each statement, is the deployment's again before it is sent (5 s).
    tenantHooksForTests.config = (id) => (id === tenant.id ? { statementTimeoutMs: 120_000 } : undefined);
    const sql = sqlFor(tenant);
    let pid: number;
    try {
      pid = Number((await sql`SELECT pg_backend_pid() AS pid`)[0]?.pid);
    } finally {
      tenantHooksForTests.config = undefined;
    }
    const marker = `stuck-${tenant.id}`;
    const committed = () =>
      asSuperuser(async (client) => {
        const { rows } = await client.query("SELECT count(*)::int AS n FROM notes WHERE body = $1", [marker]);
        return (rows[0] as { n: number }).n;
      }, tenant.database);
    // The statement cannot commit before the test lets it: it waits on a lock the test holds (behind
    // Lessor, not through the silent host's tunnel), so the stall is in place before Postgres answers.
    const stuck = await asSuperuser(async (lock) => {
      await lock.query("SELECT pg_catalog.pg_advisory_lock($1)", [blackholeLockKey]);
      const answer = answered(
        "a committed write whose answer is stuck",
        lessor("/sql", {
          method: "POST",
          headers: { "Neon-Connection-String": tenant.connectionString },
          body: JSON.stringify({
            query: `INSERT INTO notes (body) SELECT $1 FROM pg_catalog.pg_advisory_xact_lock(${blackholeLockKey})`,
            params: [marker],
          }),
        }),
      );
      let before: { frozen: Record<string, number> };
      try {
        // The fault lands only once the statement waits on the host: seen in pg_stat_activity first,
        // on the connection whose limits are the long ones.
        const waiting = await pollUntil(
          () =>
            asSuperuser(async (client) => {
              const { rows } = await client.query(
                "SELECT pid FROM pg_catalog.pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO notes (body) SELECT $1%'",
              );
              return rows.map((row: { pid: number }) => Number(row.pid));
            }),
          (pids) => pids.length > 0,
          { attempts: 200, intervalMs: 25 },
        );
        expect(waiting).toEqual([pid]);
        before = await proxy("stall");
      } finally {
        await lock.query("SELECT pg_catalog.pg_advisory_unlock($1)", [blackholeLockKey]);
      }
      // The tunnel that carries the statement was frozen before it could commit.
      expect(before.frozen[silentAddress()] ?? 0).toBeGreaterThan(0);
      // It commits now, while its answer is frozen in the tunnel: seen behind Lessor.
      expect(
        await pollUntil(committed, (n) => n === 1, {
          attempts: 200,
          intervalMs: 50,
        }),
      ).toBe(1);
      return answer;
    }, tenant.database);
    // Answered while the host was still stalled (unstalled only now): the answer is Lessor's bound,
    // not Postgres's, whose answer never left the frozen tunnel.
    expect((await proxy("unstall")).stalled).toEqual([]);
    const body = await stuck.json<{ code: string; message: string }>();
    expect({ status: stuck.status, code: body.code }).toEqual({ status: 503, code: "connection_lost" });
    expect(body.message).toContain("may or may not have committed");
    // And it did commit: the answer that says "unknown" was the only true one.
    expect(await committed()).toBe(1);
  });

  it("a session lease whose connection goes silent inside a transaction ends as lease_lost, never hangs", async () => {
    const tenant = await createTenant(uniqueTenantId("bh-lease"), { host: "silent" });
    const opened = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: "{}",
    });
    expect(opened.status).toBe(201);
    const { lease } = await opened.json<{ lease: string }>();
    const run = (query: string) =>
      lessor(`/v1/leases/${lease}/sql`, {
        method: "POST",
        headers: { Authorization: `Bearer ${tenant.key}` },
        body: JSON.stringify({ query }),
      });
    expect((await run("BEGIN")).status).toBe(200);
    await proxy("stall");
    const during = await answered(
      "a lease's statement on a silent connection",
      run("INSERT INTO notes (body) VALUES ('silent')"),
    );
    expect([400, 503]).toContain(during.status);
    expect((await during.json<{ code: string }>()).code).toMatch(
      /^(statement_timeout|connection_lost|lease_timeout)$/,
    );
    const after = await answered("the lost lease's COMMIT", run("COMMIT"));
    expect(after.status).toBe(409);
    expect(await after.json()).toMatchObject({ code: "lease_lost" });
    expect((await env.TENANTS.getByName(tenant.id).status()).leases).toBe(0);
    await proxy("unstall");
    const notes = await pollUntil(
      async () => {
        try {
          return await sqlFor(tenant)`SELECT count(*)::int AS n FROM notes`;
        } catch {
          return null;
        }
      },
      (rows) => rows !== null,
      { attempts: 20, intervalMs: 500 },
    );
    expect(notes).toEqual([{ n: 0 }]);
  });
  it("closing a connection the host already cut never hangs (found by the chaos soak)", async () => {
    const config = loadConfig(env);
    const outcome = answered(
      "closing a connection the host cut",
      withConnection(config, hostAdminUrl("silent"), "lessor:host:silent:test", async (client) => {
        await client.query("SELECT 1");
        // The tunnel freezes mid-query, then is cut, as a stall that ends does.
        await proxy("stall");
        const query = client.query("SELECT 1").then(
          () => "answered",
          () => "failed",
        );
        await new Promise((resolve) => setTimeout(resolve, 200));
        await proxy("unstall");
        expect(await query).toBe("failed");
        throw new Error("the host cut the connection");
      }).then(
        () => "no error",
        (error: unknown) => String(error),
      ),
    );
    // The work's own error comes back within the bound: closing the dead connection does not wait
    // for an end the connection already had.
    expect(await outcome).toMatch(/the host cut the connection/);
  });
  it("a credential rotation whose host goes silent answers 503 connection_lost with Retry-After, not 500 (found by the chaos soak)", async () => {
    const tenant = await createTenant(uniqueTenantId("bh-rotate"), { host: "silent" });
    expect(await sqlFor(tenant)`SELECT 1 AS one`).toEqual([{ one: 1 }]);
    await proxy("stall");
    const answer = await answered(
      "a rotation on a silent host",
      admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" }),
    );
    expect(answer.status).toBe(503);
    expect(Number(answer.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
    expect(await answer.json()).toMatchObject({ code: "connection_lost" });
  });
});
