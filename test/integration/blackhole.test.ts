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
import {
  admin,
  type CreatedTenant,
  createTenant,
  lessor,
  pollUntil,
  sqlFor,
  uniqueTenantId,
} from "./harness.ts";

/** Address of the `silent` test host as the WebSocket proxy sees it. */
function silentAddress(): string {
  const hosts = JSON.parse(env.LESSOR_HOSTS) as Record<string, string>;
  const url = new URL((hosts.silent ?? "").replace(/^postgres:/, "http:"));
  return `${url.hostname}:${url.port}`;
}

async function proxy(action: "stall" | "unstall") {
  const response = await fetch(
    `${env.TEST_PROXY_CONTROL_URL}/${action}?address=${encodeURIComponent(silentAddress())}`,
  );
  expect(response.status).toBe(200);
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
 * The longest any answer may take while the host is silent: the connect bound (10 s) or the
 * statement bound (5 s in tests) plus the cancel grace (2 s), with a wide margin for a loaded
 * machine. It only proves the wait ends; it measures nothing.
 */
const answerBoundMs = 25_000;

/** Settles with the response, or with "no answer" once the bound has passed. */
async function within<T>(work: Promise<T>, boundMs = answerBoundMs): Promise<T | "no answer"> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"no answer">((resolve) => {
    timer = setTimeout(() => resolve("no answer"), boundMs);
  });
  try {
    return await Promise.race([work, late]);
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
    await proxy("unstall");
  });

  it("a cold start to a silent host answers 503 with Retry-After and a classified reason, within the bound", async () => {
    const tenant = await createTenant(uniqueTenantId("bh-cold"), { host: "silent" });
    await proxy("stall");
    const response = await within(sqlRequest(tenant, "SELECT 1"));
    expect(response).not.toBe("no answer");
    if (response === "no answer") return;
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
    const stuck = await within(sqlRequest(tenant, "SELECT 1"));
    expect(stuck).not.toBe("no answer");
    if (stuck === "no answer") return;
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
    const again = await within(sqlRequest(tenant, "SELECT 1"));
    expect(again).not.toBe("no answer");
    if (again === "no answer") return;
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
    const sql = sqlFor(tenant);
    expect(await sql`SELECT 1 AS one`).toEqual([{ one: 1 }]);
    const marker = `stuck-${tenant.id}`;
    const sentAt = Date.now();
    const answer = within(
      lessor("/sql", {
        method: "POST",
        headers: { "Neon-Connection-String": tenant.connectionString },
        body: JSON.stringify({
          query: "INSERT INTO notes (body) SELECT $1 FROM pg_catalog.pg_sleep(1.5)",
          params: [marker],
        }),
      }),
    );
    // The fault lands only once the statement runs on the host: seen in pg_stat_activity first.
    const hosts = JSON.parse(env.LESSOR_HOSTS) as Record<string, string>;
    const running = await pollUntil(
      () =>
        withConnection(loadConfig(env), hosts.silent ?? "", "lessor:host:silent:test", async (client) => {
          const { rows } = await client.query(
            "SELECT count(*)::int AS n FROM pg_catalog.pg_stat_activity WHERE state = 'active' AND query LIKE 'INSERT INTO notes (body) SELECT $1%'",
          );
          return (rows[0] as { n: number }).n;
        }),
      (n) => n > 0,
      { attempts: 50, intervalMs: 20 },
    );
    expect(running).toBeGreaterThan(0);
    await proxy("stall");
    const stuck = await answer;
    expect(stuck).not.toBe("no answer");
    if (stuck === "no answer") return;
    // It was answered by the bound, not by Postgres (whose answer was frozen in the tunnel).
    expect(Date.now() - sentAt).toBeGreaterThanOrEqual(5_000);
    await proxy("unstall");
    const body = await stuck.json<{ code: string; message: string }>();
    expect({ status: stuck.status, code: body.code }).toEqual({ status: 503, code: "connection_lost" });
    expect(body.message).toContain("may or may not have committed");
    // And it did commit: the answer that says "unknown" was the only true one.
    const landed = await pollUntil(
      async () => {
        try {
          return (await sql`SELECT count(*)::int AS n FROM notes WHERE body = ${marker}`)[0]?.n;
        } catch {
          return -1;
        }
      },
      (n) => n === 1,
      { attempts: 40, intervalMs: 500 },
    );
    expect(landed).toBe(1);
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
    const during = await within(run("INSERT INTO notes (body) VALUES ('silent')"));
    expect(during).not.toBe("no answer");
    if (during === "no answer") return;
    expect([400, 503]).toContain(during.status);
    expect((await during.json<{ code: string }>()).code).toMatch(
      /^(statement_timeout|connection_lost|lease_timeout)$/,
    );
    const after = await within(run("COMMIT"));
    expect(after).not.toBe("no answer");
    if (after === "no answer") return;
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
    const hosts = JSON.parse(env.LESSOR_HOSTS) as Record<string, string>;
    const config = loadConfig(env);
    const outcome = within(
      withConnection(config, hosts.silent ?? "", "lessor:host:silent:test", async (client) => {
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
    const answer = await within(admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" }));
    expect(answer).not.toBe("no answer");
    if (answer === "no answer") return;
    expect(answer.status).toBe(503);
    expect(Number(answer.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
    expect(await answer.json()).toMatchObject({ code: "connection_lost" });
  });
});
