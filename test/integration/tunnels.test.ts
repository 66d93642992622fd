/**
 * Issue 28: customers' databases behind their own tunnels, leased as resources of their own.
 *
 * A second embedded Postgres plays the customer's server, reachable only through a second
 * WebSocket proxy that plays their tunnel (test/customer-server.ts); the tunnel proxy's fault
 * controls stall and cut it. Each test plays the customer's DBA with that server's superuser (the
 * customer creates their own database and roles), attaches tenants to it through Lessor's API, and
 * looks behind Lessor on both servers.
 */
import { env, runDurableObjectAlarm } from "cloudflare:test";
import { Client } from "@neondatabase/serverless";
import { afterAll, describe, expect, it } from "vitest";
import { runCampaignTick } from "../../src/campaigns/runner.ts";
import type { CapacityStatus } from "../../src/rpc/budget.ts";
import { tenantMigrations } from "../fixtures/tenant-schema/migrations.gen.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  mapConcurrent,
  pollUntil,
  runtimeOf,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";
import { connectionPeaks, type LoggedServer, markServerLog, serverLogLines } from "./server-log.ts";

const customerUrl = env.TEST_CUSTOMER_PG_SUPERUSER_URL ?? "";
const tunnelProxy = env.TEST_TUNNEL_PROXY ?? "";
const customerPort = new URL(customerUrl.replace(/^postgres:/, "http:")).port;
const customerServer: LoggedServer = {
  superuserUrl: customerUrl,
  logPath: env.TEST_CUSTOMER_PG_SERVER_LOG ?? "",
  proxy: tunnelProxy,
};

/** The customer's DBA: their server's superuser, reached through the tunnel like everything there. */
async function asCustomer<T>(work: (client: Client) => Promise<T>, database = "postgres"): Promise<T> {
  const url = new URL(customerUrl.replace(/^postgres:/, "http:"));
  url.pathname = `/${database}`;
  const client = new Client({ connectionString: url.toString().replace(/^http:/, "postgres:") });
  client.neonConfig.wsProxy = (host, port) => `${tunnelProxy}/v2?address=${host}:${port}`;
  client.neonConfig.useSecureWebSocket = false;
  client.neonConfig.pipelineConnect = false;
  client.on("error", () => undefined);
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** The tunnel proxy's fault controls, for one tunnel's address on the customer's server. */
async function tunnelFault(action: "stall" | "unstall" | "block" | "unblock" | "stats", host = "127.0.0.1") {
  const response = await fetch(
    `${env.TEST_TUNNEL_PROXY_CONTROL_URL}/${action}?address=${encodeURIComponent(`${host}:${customerPort}`)}`,
  );
  expect(response.status).toBe(200);
  return response.json<{ open: Record<string, number>; frozen: Record<string, number> }>();
}

interface CustomerDatabase {
  database: string;
  role: string;
  password: string;
  /** The connection URL the customer hands over, as `host` (one tunnel's address) reaches the server. */
  url(host?: string, role?: string, password?: string): string;
}

/**
 * What a customer does before handing a database over: a database of theirs, a role of their own
 * with a connection limit, and the application's table, owned by that role.
 */
async function customerDatabase(prefix: string): Promise<CustomerDatabase> {
  const suffix = crypto.randomUUID().slice(0, 8);
  const database = `${prefix}_${suffix}`.replaceAll("-", "_");
  const role = `app_${suffix}`;
  const password = `pw-${crypto.randomUUID()}`;
  await asCustomer(async (client) => {
    await client.query(`CREATE ROLE ${role} LOGIN PASSWORD '${password}' CONNECTION LIMIT 7`);
    await client.query(`CREATE DATABASE ${database}`);
    await client.query(`REVOKE CONNECT, TEMPORARY ON DATABASE ${database} FROM PUBLIC`);
    await client.query(`GRANT CONNECT ON DATABASE ${database} TO ${role}`);
  });
  await asCustomer(async (client) => {
    await client.query(`GRANT USAGE, CREATE ON SCHEMA public TO ${role}`);
    await client.query("CREATE TABLE public.items (id serial PRIMARY KEY, body text NOT NULL)");
    await client.query(`ALTER TABLE public.items OWNER TO ${role}`);
    await client.query(`ALTER SEQUENCE public.items_id_seq OWNER TO ${role}`);
  }, database);
  return {
    database,
    role,
    password,
    url: (host = "127.0.0.1", as = role, secret = password) =>
      `postgres://${as}:${encodeURIComponent(secret)}@${host}:${customerPort}/${database}`,
  };
}

interface Attached extends CreatedTenant {
  adopted: { tunnel: string; warnings: string[]; loginGuard: string; containment: string; server: string };
}

function attachRequest(id: string, tunnel: string, url: string, extra: Record<string, unknown> = {}) {
  return admin("/v1/tenants", {
    method: "POST",
    json: { id, tier: "free", attach: { tunnel, url }, ...extra },
  });
}

async function attach(
  tunnel: string,
  db: CustomerDatabase,
  options: { host?: string; tier?: string; credentials?: "customer" | "lessor" } = {},
): Promise<Attached> {
  const id = uniqueTenantId("adopted");
  const response = await admin("/v1/tenants", {
    method: "POST",
    json: {
      id,
      tier: options.tier ?? "free",
      attach: { tunnel, url: db.url(options.host), credentials: options.credentials ?? "customer" },
    },
  });
  if (response.status !== 201) throw new Error(`attach ${id}: ${response.status} ${await response.text()}`);
  const body = await response.json<{ key: string; connectionString: string; adopted: Attached["adopted"] }>();
  return {
    id,
    key: body.key,
    connectionString: body.connectionString,
    database: db.database,
    role: db.role,
    adopted: body.adopted,
  };
}

function query(tenant: CreatedTenant, text: string, params: unknown[] = []) {
  return sqlRequest(tenant.connectionString, { query: text, params });
}

async function rows(tenant: CreatedTenant, text: string, params: unknown[] = []): Promise<unknown[][]> {
  const response = await query(tenant, text, params);
  if (response.status !== 200) throw new Error(`${text}: ${response.status} ${await response.text()}`);
  return (await response.json<{ rows: unknown[][] }>()).rows;
}

async function capacity(): Promise<{ hosts: CapacityStatus[]; tunnels: CapacityStatus[] }> {
  const response = await admin("/v1/capacity");
  expect(response.status).toBe(200);
  return response.json();
}

async function tunnelStatus(name: string): Promise<CapacityStatus> {
  const found = (await capacity()).tunnels.find((t) => t.tunnel?.name === name);
  if (!found) throw new Error(`no tunnel ${name} in /v1/capacity`);
  return found;
}

/** Backends on the customer's server as `roles`, by application name. */
function customerBackends(roles: readonly string[]): Promise<string[]> {
  return asCustomer(async (client) => {
    const { rows: found } = await client.query(
      "SELECT application_name FROM pg_stat_activity WHERE usename = ANY($1::text[]) ORDER BY 1",
      [roles],
    );
    return found.map((row: { application_name: string }) => row.application_name);
  });
}

/** What exists on the customer's server that a tenant or Lessor could have made: to compare before and after. */
function customerInventory(database: string) {
  return asCustomer(async (client) => {
    const { rows: found } = await client.query(`
      SELECT (SELECT array_agg(rolname::text ORDER BY rolname) FROM pg_roles) AS roles,
             (SELECT array_agg(datname::text ORDER BY datname) FROM pg_database) AS databases,
             (SELECT array_agg(nspname::text ORDER BY nspname) FROM pg_namespace) AS schemas,
             (SELECT count(*)::int FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
               WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')) AS functions,
             (SELECT count(*)::int FROM pg_event_trigger) AS event_triggers`);
    return found[0];
  }, database);
}

async function openLease(tenant: CreatedTenant): Promise<string> {
  const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs: 60_000 }),
  });
  if (response.status !== 201)
    throw new Error(`lease ${tenant.id}: ${response.status} ${await response.text()}`);
  return (await response.json<{ lease: string }>()).lease;
}

function leaseSql(tenant: CreatedTenant, token: string, text: string, params: unknown[] = []) {
  return lessor(`/v1/leases/${token}/sql`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
    body: JSON.stringify({ query: text, params }),
  });
}

function releaseLease(tenant: CreatedTenant, token: string) {
  return lessor(`/v1/leases/${token}`, {
    method: "DELETE",
    headers: { Authorization: `Bearer ${tenant.key}` },
  });
}

async function erase(id: string): Promise<{ state: string; database?: string }> {
  const response = await admin(`/v1/tenants/${id}?confirm=${id}`, { method: "DELETE" });
  expect([200, 202]).toContain(response.status);
  return pollUntil(
    async () => (await admin(`/v1/tenants/${id}/erase`)).json<{ state: string; database?: string }>(),
    (status) => status.state === "erased",
    { attempts: 120, intervalMs: 250 },
  );
}

/** Tenants a test attached, erased at the end so the next test's tunnel starts empty. */
const attachedHere: string[] = [];
afterAll(async () => {
  for (const id of attachedHere) await erase(id).catch(() => undefined);
});

describe("customers' databases behind tunnels", () => {
  it("is reachable only through the tunnel, never through Lessor's own proxy", async () => {
    // Lessor's own proxy (LESSOR_WS_PROXY) knows only the hosts' address: the customer's is refused.
    const response = await fetch(
      `http://${env.LESSOR_WS_PROXY}/v2?address=${encodeURIComponent(`127.0.0.1:${customerPort}`)}`,
      { headers: { Upgrade: "websocket" } },
    ).catch((error: unknown) => error);
    expect(response instanceof Response ? response.status : 403).not.toBe(101);
    // Through the tunnel it is there.
    expect(await asCustomer(async (c) => (await c.query("SELECT 1 AS one")).rows[0])).toEqual({ one: 1 });
  });

  it("attaches, queries, rotates the customer's credential with no failed request, and detaches", async () => {
    const db = await customerDatabase("attach");
    const before = await customerInventory(db.database);
    const tenant = await attach("cust", db);
    attachedHere.push(tenant.id);
    // What the probe found and what Lessor gives there: no guard, the customer's containment.
    expect(tenant.adopted).toMatchObject({
      tunnel: "cust",
      containment: "customer",
      loginGuard: "not_possible",
    });
    expect(tenant.adopted.server).toMatch(/^\d+/);
    const detail = await (await admin(`/v1/tenants/${tenant.id}`)).json<{
      tenant: { host: string };
      adopted: { tunnel: string; role: string; credential: string };
    }>();
    expect(detail.tenant.host).toBe("tunnel:cust");
    expect(detail.adopted).toMatchObject({ tunnel: "cust", role: db.role, credential: "ok" });

    // Query: the rows are in the customer's own table, written by Lessor's pool named for the role.
    await rows(tenant, "INSERT INTO items (body) VALUES ($1)", ["from lessor"]);
    expect(await rows(tenant, "SELECT body FROM items ORDER BY id")).toEqual([["from lessor"]]);
    expect(await customerBackends([db.role])).toEqual(
      expect.arrayContaining([expect.stringMatching(new RegExp(`^lessor:${db.role}:\\d+$`))]),
    );
    // The tunnel's leases are counted apart from every host's.
    const leased = await tunnelStatus("cust");
    expect(leased.host).toBe("tunnel:cust");
    expect(leased.allocated + leased.reserved).toBeGreaterThanOrEqual(2);
    expect((await capacity()).hosts.every((h) => !h.host.startsWith("tunnel:"))).toBe(true);

    // A credential the server refuses changes nothing.
    const wrong = await admin(`/v1/tenants/${tenant.id}/credentials`, {
      method: "PUT",
      json: { password: "not-the-password" },
    });
    expect(wrong.status).toBe(409);
    expect(await wrong.json()).toMatchObject({ code: "credential_rejected" });
    expect(await rows(tenant, "SELECT count(*)::int FROM items")).toEqual([["1"]]);

    // Rotation in the customer's direction, under load: the customer issues a second role (a role
    // has one password), hands it over, and revokes the first once the old generation retired.
    const next = { role: `${db.role}_v2`, password: `pw2-${crypto.randomUUID()}` };
    await asCustomer((c) =>
      c.query(`CREATE ROLE ${next.role} LOGIN PASSWORD '${next.password}' IN ROLE ${db.role}`),
    );
    await asCustomer((c) => c.query(`GRANT CONNECT ON DATABASE ${db.database} TO ${next.role}`));
    let loading = true;
    const statuses: number[] = [];
    const load = mapConcurrent([0, 1, 2], 3, async (worker) => {
      for (let i = 0; loading; i++) {
        const response = await query(tenant, "INSERT INTO items (body) VALUES ($1) RETURNING id", [
          `w${worker}-${i}`,
        ]);
        statuses.push(response.status);
        await response.arrayBuffer();
      }
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const rotated = await admin(`/v1/tenants/${tenant.id}/credentials`, {
      method: "PUT",
      json: { user: next.role, password: next.password },
    });
    expect(rotated.status).toBe(202);
    expect(await rotated.json()).toMatchObject({ overlapped: true });
    const retired = await pollUntil(
      async () => (await runtimeOf(tenant.id)) as unknown as { retiring: unknown },
      (runtime) => runtime.retiring === null,
      { attempts: 80, intervalMs: 250 },
    );
    expect(retired.retiring).toBeNull();
    await asCustomer((c) => c.query(`ALTER ROLE ${db.role} NOLOGIN`));
    await new Promise((resolve) => setTimeout(resolve, 300));
    loading = false;
    await load;
    expect(statuses.length).toBeGreaterThan(10);
    expect(statuses.filter((s) => s !== 200)).toEqual([]);
    // Lessor's connections are the new role's now; none of the revoked one's is left.
    const backends = await customerBackends([db.role, next.role]);
    expect(backends.filter((name) => name.startsWith(`lessor:${db.role}:`))).toEqual([]);
    expect(backends.some((name) => name.startsWith(`lessor:${next.role}:`))).toBe(true);

    // Detach: erase forgets the tenant and its credential, never the customer's database.
    const erased = await erase(tenant.id);
    expect(erased).toMatchObject({ state: "erased", database: "detached" });
    const after = await customerInventory(db.database);
    // The customer's server holds exactly what the customer made (their second role included).
    expect({ ...after, roles: (after.roles as string[]).filter((r) => r !== next.role) }).toEqual(before);
    expect(
      await asCustomer(
        async (c) => (await c.query("SELECT count(*)::int AS n FROM items")).rows[0],
        db.database,
      ),
    ).toEqual({
      n: statuses.length + 1,
    });
    expect(
      await pollUntil(
        () => customerBackends([db.role, next.role]),
        (names) => names.length === 0,
        { attempts: 40, intervalMs: 250 },
      ),
    ).toEqual([]);
    const catalog = await asSuperuser(async (client) => {
      const { rows: found } = await client.query(
        `SELECT (SELECT count(*)::int FROM adopted_databases WHERE tenant_id = $1) AS adopted,
                (SELECT count(*)::int FROM tenant_credentials WHERE tenant_id = $1) AS credentials,
                (SELECT detached FROM tenant_erasures WHERE tenant_id = $1) AS detached,
                (SELECT array_agg(action ORDER BY id) FROM audit_log WHERE tenant_id = $1) AS actions,
                (SELECT detail->>'database' FROM audit_log WHERE tenant_id = $1 AND action = 'tenant.erase') AS erased`,
        [tenant.id],
      );
      return found[0];
    }, "lessor");
    expect(catalog).toEqual({
      adopted: 0,
      credentials: 0,
      detached: true,
      actions: ["tenant.attach", "tenant.credentials", "tenant.detach", "tenant.erase"],
      erased: "detached",
    });
  });

  it("refuses what it cannot serve, says why, and keeps nothing", async () => {
    const db = await customerDatabase("refuse");
    const tries: [string, Response, number, string][] = [];
    const expectRefusal = async (
      label: string,
      response: Promise<Response>,
      status: number,
      code: string,
    ) => {
      tries.push([label, await response, status, code]);
    };
    const superuser = new URL(customerUrl.replace(/^postgres:/, "http:"));
    await expectRefusal(
      "superuser",
      attachRequest(
        uniqueTenantId("refused"),
        "cust",
        db.url("127.0.0.1", "postgres", decodeURIComponent(superuser.password)),
      ),
      409,
      "attach_refused",
    );
    await expectRefusal(
      "wrong password",
      attachRequest(uniqueTenantId("refused"), "cust", db.url("127.0.0.1", db.role, "nope")),
      409,
      "credential_rejected",
    );
    await expectRefusal(
      "unknown tunnel",
      attachRequest(uniqueTenantId("refused"), "nowhere", db.url()),
      400,
      "unknown_tunnel",
    );
    // cust-full carries 3 connections, 1 of them its reserve: a standard pool (5) cannot fit.
    await expectRefusal(
      "pool larger than the tunnel",
      attachRequest(uniqueTenantId("refused"), "cust-full", db.url(), { tier: "standard" }),
      409,
      "attach_refused",
    );
    await expectRefusal(
      "no such database",
      attachRequest(
        uniqueTenantId("refused"),
        "cust",
        db.url().replace(db.database, `${db.database}_missing`),
      ),
      409,
      "attach_refused",
    );
    await expectRefusal(
      "not a url",
      attachRequest(uniqueTenantId("refused"), "cust", "mysql://x"),
      400,
      "invalid_request",
    );
    for (const [label, response, status, code] of tries) {
      const body = await response.json<{ code: string; message: string }>();
      expect({ label, status: response.status, code: body.code }).toEqual({ label, status, code });
      // Never the password, in any answer.
      expect(body.message).not.toContain(db.password);
    }
    const superuserBody = await (
      await attachRequest(
        uniqueTenantId("refused"),
        "cust",
        db.url("127.0.0.1", "postgres", decodeURIComponent(superuser.password)),
      )
    ).json<{ message: string }>();
    expect(superuserBody.message).toContain("superuser");
    const left = await asSuperuser(async (client) => {
      const { rows: found } = await client.query(
        "SELECT count(*)::int AS n FROM tenants WHERE id LIKE 'refused-%' AND database_name LIKE $1",
        [`${db.database}%`],
      );
      return found[0]?.n;
    }, "lessor");
    expect(left).toBe(0);

    // What applies only to Lessor's own databases is refused for a customer's, with the reason.
    const tenant = await attach("cust", db);
    attachedHere.push(tenant.id);
    const jwt = await admin(`/v1/tenants/${tenant.id}/jwt`, { method: "DELETE" });
    expect(jwt.status).toBe(409);
    expect(await jwt.json()).toMatchObject({ code: "adopted_database" });
    const rotate = await admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" });
    expect(rotate.status).toBe(409);
    expect(await rotate.json()).toMatchObject({ code: "adopted_database" });
  });

  it("rotates a credential Lessor manages through overlapping generations: the role sets its own password", async () => {
    const db = await customerDatabase("managed");
    const tenant = await attach("cust", db, { credentials: "lessor" });
    attachedHere.push(tenant.id);
    expect(await rows(tenant, "INSERT INTO items (body) VALUES ('before') RETURNING id")).toEqual([["1"]]);
    const rotated = await admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" });
    expect(rotated.status).toBe(202);
    expect(await rotated.json()).toMatchObject({ overlapped: true });
    expect(await rows(tenant, "SELECT body FROM items")).toEqual([["before"]]);
    // The password the customer handed over no longer opens the role: only Lessor knows the new one.
    const stale = await attachRequest(uniqueTenantId("stale"), "cust", db.url());
    expect(await stale.json()).toMatchObject({ code: "credential_rejected" });
    // Nothing was created on the customer's server for it: the role changed its own password.
    expect(
      await asCustomer(
        async (c) => (await c.query("SELECT count(*)::int AS n FROM pg_event_trigger")).rows[0],
      ),
    ).toEqual({ n: 0 });
  });

  it("a full tunnel refuses its own tenants' new pools while host tenants keep starting", async () => {
    // cust-full: 3 connections, 1 reserved for maintenance: one free pool (2) fills it.
    const db = await customerDatabase("full");
    const holder = await attach("cust-full", db);
    const waiting = await attach("cust-full", db);
    attachedHere.push(holder.id, waiting.id);
    const token = await openLease(holder);
    expect((await leaseSql(holder, token, "SELECT 1")).status).toBe(200);

    const refused = await query(waiting, "SELECT 1");
    expect(refused.status).toBe(503);
    expect(Number(refused.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
    expect(await refused.json()).toMatchObject({ code: "tunnel_unavailable", reason: "full" });

    // Hosts are untouched: fresh host tenants start and answer meanwhile.
    const hostTenants = await mapConcurrent([0, 1, 2], 3, () => createTenant(uniqueTenantId("host-beside")));
    const answers = await Promise.all(
      hostTenants.map((t) => sqlRequest(t.connectionString, { query: "SELECT 1", params: [] })),
    );
    expect(answers.map((a) => a.status)).toEqual([200, 200, 200]);
    const full = await tunnelStatus("cust-full");
    expect(full.allocated + full.reserved).toBeLessThanOrEqual(full.poolCapacity);
    expect(full.saturations).toBeGreaterThanOrEqual(1);
    expect(full.leases).toBeGreaterThanOrEqual(1);

    // The lease ends: the idle pool is evicted for the waiting tenant, within the tunnel.
    expect((await releaseLease(holder, token)).status).toBe(204);
    await pollUntil(
      async () => (await tunnelStatus("cust-full")).leases,
      (leases) => leases === 0,
      { attempts: 120, intervalMs: 500 },
    );
    const served = await pollUntil(
      async () => (await query(waiting, "SELECT 1")).status,
      (status) => status === 200,
      { attempts: 40, intervalMs: 500 },
    );
    expect(served).toBe(200);
  });

  it("a stalled tunnel: its tenants get tunnel_unavailable at the connect bound, host tenants see no change", async () => {
    const db = await customerDatabase("stall");
    const behind = await Promise.all([0, 1, 2].map(() => attach("cust-stall", db, { host: "127.0.0.2" })));
    attachedHere.push(...behind.map((t) => t.id));
    const [first, second, third] = behind as [Attached, Attached, Attached];
    const host = await createTenant(uniqueTenantId("host-stall"));
    const hostLatencies = async (n: number) => {
      const times: number[] = [];
      for (let i = 0; i < n; i++) {
        const started = performance.now();
        const response = await sqlRequest(host.connectionString, { query: "SELECT 1", params: [] });
        expect(response.status).toBe(200);
        await response.arrayBuffer();
        times.push(performance.now() - started);
      }
      return times.sort((a, b) => a - b);
    };
    const baseline = await hostLatencies(40);
    const hostBefore = (await capacity()).hosts.find((h) => h.host === "local");

    await tunnelFault("stall", "127.0.0.2");
    try {
      // The first start through the stalled tunnel hangs until the tunnel's connect bound: meanwhile
      // the host tenant keeps answering, and none of its requests waits behind it.
      let settled = false;
      const stalled = query(first, "SELECT 1").finally(() => {
        settled = true;
      });
      let servedWhileStalled = 0;
      const during: number[] = [];
      while (!settled && servedWhileStalled < 1_000) {
        const started = performance.now();
        const response = await sqlRequest(host.connectionString, { query: "SELECT 1", params: [] });
        expect(response.status).toBe(200);
        await response.arrayBuffer();
        during.push(performance.now() - started);
        servedWhileStalled++;
      }
      const answer = await stalled;
      expect(answer.status).toBe(503);
      expect(await answer.json()).toMatchObject({ code: "tunnel_unavailable", reason: "slow" });
      // Sampled, not asserted on the clock: the host's requests went on while the tunnel hung.
      const p99 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length * 0.99)] ?? 0;
      expect(
        servedWhileStalled,
        `host requests served while the tunnel hung (host p99 ${p99(baseline).toFixed(1)} ms before, ${p99(during).toFixed(1)} ms during)`,
      ).toBeGreaterThan(3);
      // The connect bound acted: the start failed as a timeout (slow), not a refusal.
      expect((await runtimeOf(first.id)) as unknown).toMatchObject({
        state: "failed",
        failureReason: "timeout",
      });
      // A second tenant's start fails the same way; the tunnel's breaker then opens, and the
      // third tenant is refused at once, without trying the tunnel.
      const secondAnswer = await query(second, "SELECT 1");
      expect(await secondAnswer.json()).toMatchObject({ code: "tunnel_unavailable", reason: "slow" });
      const thirdAnswer = await query(third, "SELECT 1");
      expect(thirdAnswer.status).toBe(503);
      expect(await thirdAnswer.json()).toMatchObject({ code: "tunnel_unavailable", reason: "slow" });
      const stall = await tunnelStatus("cust-stall");
      expect(stall.tunnel).toMatchObject({ health: "slow", breaker: "open" });
      expect(stall.tunnel?.refusedByBreaker).toBeGreaterThanOrEqual(1);
      expect(await runtimeOf(third.id)).toMatchObject({ state: "stopped" });
    } finally {
      await tunnelFault("unstall", "127.0.0.2");
    }
    // The host's budget saw nothing of it.
    const hostAfter = (await capacity()).hosts.find((h) => h.host === "local");
    expect(hostAfter?.saturations).toBe(hostBefore?.saturations);
    expect(hostAfter?.tunnel ?? null).toBeNull();
    // The tunnel recovers: its tenants serve again once the breaker and their backoff pass.
    const recovered = await pollUntil(
      async () => (await query(first, "SELECT 1")).status,
      (status) => status === 200,
      { attempts: 60, intervalMs: 500 },
    );
    expect(recovered).toBe(200);
    expect((await tunnelStatus("cust-stall")).tunnel).toMatchObject({ health: "up", breaker: "closed" });
  });

  it("a tunnel cut mid-transaction on a lease: the lease fails cleanly and nothing leaks", async () => {
    const db = await customerDatabase("cut");
    const tenant = await attach("cust-cut", db, { host: "127.0.0.3" });
    attachedHere.push(tenant.id);
    const token = await openLease(tenant);
    expect((await leaseSql(tenant, token, "BEGIN")).status).toBe(200);
    expect((await leaseSql(tenant, token, "INSERT INTO items (body) VALUES ('uncommitted')")).status).toBe(
      200,
    );

    await tunnelFault("block", "127.0.0.3");
    try {
      // The statement on the cut connection learns it may not have run; the lease is lost for good.
      const cut = await leaseSql(tenant, token, "COMMIT");
      expect(cut.status).toBe(503);
      expect(await cut.json()).toMatchObject({ code: "connection_lost" });
      const again = await leaseSql(tenant, token, "SELECT 1");
      expect(again.status).toBe(409);
      expect(await again.json()).toMatchObject({ code: "lease_lost" });
    } finally {
      await tunnelFault("unblock", "127.0.0.3");
    }
    expect(
      await asCustomer(
        async (c) => (await c.query("SELECT count(*)::int AS n FROM items")).rows[0],
        db.database,
      ),
    ).toEqual({ n: 0 });
    // Nothing leaks: no lease is counted, the tunnel holds at most the tenant's one pool, the
    // customer's server at most its connections, and the tenant serves again.
    const serving = await pollUntil(
      async () => (await query(tenant, "SELECT count(*)::int FROM items")).status,
      (status) => status === 200,
      { attempts: 40, intervalMs: 500 },
    );
    expect(serving).toBe(200);
    const settled = await pollUntil(
      async () => ({ runtime: await runtimeOf(tenant.id), tunnel: await tunnelStatus("cust-cut") }),
      ({ runtime, tunnel }) => runtime.leases === 0 && tunnel.leases === 0 && tunnel.maintenance.inUse === 0,
      { attempts: 80, intervalMs: 250 },
    );
    expect(settled.runtime.leases).toBe(0);
    expect(settled.tunnel.allocated + settled.tunnel.reserved + settled.tunnel.draining).toBeLessThanOrEqual(
      2,
    );
    expect(settled.tunnel.maintenance.inUse).toBe(0);
    const backends = await pollUntil(
      () => customerBackends([db.role]),
      (names) => names.length <= 2,
      { attempts: 40, intervalMs: 250 },
    );
    expect(backends.length).toBeLessThanOrEqual(2);
  });

  it("a revoked customer credential is reported as such, not as unreachable, and a new one heals it", async () => {
    const db = await customerDatabase("revoked");
    const tenant = await attach("cust", db);
    attachedHere.push(tenant.id);
    expect(await rows(tenant, "SELECT 1")).toEqual([["1"]]);
    // The customer changes the role's password on their side; Lessor's next start finds out.
    await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: { force: true } });
    await pollUntil(
      () => runtimeOf(tenant.id),
      (runtime) => runtime.state === "stopped",
      { attempts: 40, intervalMs: 250 },
    );
    const changed = `pw3-${crypto.randomUUID()}`;
    await asCustomer((c) => c.query(`ALTER ROLE ${db.role} PASSWORD '${changed}'`));
    const refused = await query(tenant, "SELECT 1");
    expect(refused.status).toBe(503);
    expect(await refused.json()).toMatchObject({ code: "credential_revoked" });
    expect(await runtimeOf(tenant.id)).toMatchObject({
      state: "failed",
      failureReason: "credential_revoked",
    });
    const detail = await (await admin(`/v1/tenants/${tenant.id}`)).json<{
      adopted: { credential: string };
    }>();
    expect(detail.adopted.credential).toBe("revoked");
    // Not the tunnel's fault: it carried the connection, so its health stays up.
    expect((await tunnelStatus("cust")).tunnel).toMatchObject({ health: "up", breaker: "closed" });
    // Backing off, the tenant keeps answering the same code, without trying again.
    expect(await (await query(tenant, "SELECT 1")).json()).toMatchObject({ code: "credential_revoked" });

    // The customer hands the new password over: the tenant serves at once.
    const supplied = await admin(`/v1/tenants/${tenant.id}/credentials`, {
      method: "PUT",
      json: { password: changed },
    });
    expect(supplied.status).toBe(202);
    expect(await supplied.json()).toMatchObject({ overlapped: false });
    expect(await rows(tenant, "SELECT 2")).toEqual([["2"]]);
  });

  it("fleet work respects ownership: campaigns skip customers' databases or include them, and say which", async () => {
    const db = await customerDatabase("campaign");
    const tenant = await attach("cust", db);
    attachedHere.push(tenant.id);
    const newest = tenantMigrations.length;
    const create = async (adopted?: "skip" | "include") => {
      const response = await admin("/v1/campaigns", {
        method: "POST",
        // Forced: the contract step's stability window is fleet-wide, and other files in this run
        // send apps needing an older version; ownership, not the window, is what this test is about.
        json: { toVersion: newest, tenants: [tenant.id], force: true, ...(adopted ? { adopted } : {}) },
      });
      const body = await response.json<{
        campaign: { id: string; adopted: unknown };
        enrolled: number;
        adoptedSkipped: number;
      }>();
      expect(response.status, JSON.stringify(body)).toBe(201);
      return body;
    };
    // By default a campaign leaves the customer's database alone, and counts it.
    const skipped = await create();
    expect(skipped).toMatchObject({
      enrolled: 0,
      adoptedSkipped: 1,
      campaign: { adopted: { policy: "skip", skipped: 1 } },
    });
    // Included on purpose: migrated through the tunnel like any tenant, as the customer's role, with
    // the rights the customer gave it (Lessor's migrations make a schema: CREATE on the database).
    await asCustomer((c) => c.query(`GRANT CREATE ON DATABASE ${db.database} TO ${db.role}`));
    const included = await create("include");
    expect(included).toMatchObject({
      enrolled: 1,
      adoptedSkipped: 0,
      campaign: { adopted: { policy: "include", skipped: 0 } },
    });
    for (let i = 0; i < 20; i++) {
      const view = await (await admin(`/v1/campaigns/${included.campaign.id}`)).json<{
        campaign: { state: string };
      }>();
      if (view.campaign.state === "done") break;
      await runCampaignTick(env, { campaignId: included.campaign.id });
    }
    const done = await (await admin(`/v1/campaigns/${included.campaign.id}`)).json<{
      campaign: { state: string; adopted: unknown };
    }>();
    expect(done.campaign, JSON.stringify(done)).toMatchObject({
      state: "done",
      adopted: { policy: "include", skipped: 0 },
    });
    const migrated = await asCustomer(async (c) => {
      const { rows: found } = await c.query("SELECT max(version)::int AS v FROM lessor.schema_migrations");
      return found[0]?.v;
    }, db.database);
    expect(migrated).toBe(newest);
    // The usage readers count the tenant like any other (its object's alarm flushes the outbox).
    await rows(tenant, "SELECT count(*) FROM notes");
    expect(await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id))).toBe(true);
    const usage = await (await admin(`/v1/tenants/${tenant.id}/usage`)).json<{
      usage: { queries: number };
    }>();
    expect(usage.usage.queries).toBeGreaterThanOrEqual(1);
  });

  it("a customer's planted objects and settings never run in Lessor's sessions there", async () => {
    const db = await customerDatabase("traps");
    const run = crypto.randomUUID().slice(0, 8);
    const tenant = await attach("cust", db, { credentials: "lessor" });
    attachedHere.push(tenant.id);
    // The tenant key plants, in `public`, a shadow of every catalog function, view and operator
    // Lessor's statements there name; each logs that it ran. The customer's DBA points the role's
    // and the database's search_path at them.
    const plant = [
      `CREATE FUNCTION public.lessor_trap_fired(label text) RETURNS bool LANGUAGE plpgsql SET search_path = pg_catalog AS $f$ BEGIN RAISE LOG 'customer_trap run=${run} fired=[%] user=%', label, current_user; RETURN true; END $f$`,
      ...[
        ["current_setting", "text", "text"],
        ["current_database", "", "name"],
        ["pg_has_role", "oid, oid, text", "bool"],
        ["has_database_privilege", "oid, oid, text", "bool"],
        ["has_function_privilege", "oid, text", "bool"],
        ["to_char", "timestamp, text", "text"],
        ["timezone", "text, timestamptz", "timestamp"],
        ["isfinite", "timestamptz", "bool"],
        ["pg_terminate_backend", "int4, int8", "bool"],
        ["pg_backend_pid", "", "int4"],
        ["starts_with", "text, text", "bool"],
        ["pg_advisory_unlock_all", "", "void"],
      ].map(
        ([name, args, result]) =>
          `CREATE FUNCTION public.${name}(${args}) RETURNS ${result} LANGUAGE plpgsql AS $f$ BEGIN PERFORM public.lessor_trap_fired('${name}'); RETURN${result === "void" ? "" : " NULL"}; END $f$`,
      ),
      ...["pg_roles", "pg_database", "pg_stat_activity", "pg_proc", "pg_namespace"].map(
        (view) =>
          `CREATE VIEW public.${view} AS SELECT * FROM pg_catalog.${view} WHERE public.lessor_trap_fired('view ${view}')`,
      ),
      "CREATE FUNCTION public.trap_eq(oid, oid) RETURNS bool LANGUAGE plpgsql AS $f$ BEGIN PERFORM public.lessor_trap_fired('operator ='); RETURN true; END $f$",
      "CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = public.trap_eq)",
    ];
    for (const statement of plant) await rows(tenant, statement);
    await asCustomer(async (c) => {
      await c.query(`ALTER ROLE ${db.role} SET search_path = public, pg_catalog`);
      await c.query(`ALTER DATABASE ${db.database} SET search_path = public, pg_catalog`);
      await c.query(`ALTER DATABASE ${db.database} SET standard_conforming_strings = off`);
    });
    const from = await markServerLog(customerServer);
    // Everything Lessor does there: the attach probe, pooled requests and their reset, a session
    // lease, a Lessor-managed rotation (the role sets its own password), a supplied credential.
    const second = await attach("cust", db);
    attachedHere.push(second.id);
    await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: { force: true } });
    for (let i = 0; i < 3; i++) expect((await query(second, "SELECT 1")).status).toBe(200);
    const token = await openLease(second);
    expect((await leaseSql(second, token, "SELECT 1")).status).toBe(200);
    expect((await releaseLease(second, token)).status).toBe(204);
    const rotated = await admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" });
    expect(rotated.status).toBe(202);
    expect((await query(tenant, "SELECT 1")).status).toBe(200);
    // The positive control: the trap does log when something calls it.
    expect((await query(second, "SELECT public.lessor_trap_fired('positive control')")).status).toBe(200);
    const to = await markServerLog(customerServer);
    const fired = (await serverLogLines(from, to, `customer_trap run=${run}`, customerServer)).map(
      (line) => /fired=\[([^\]]*)\]/.exec(line)?.[1],
    );
    expect(fired).toEqual(["positive control"]);
  });

  it("the budget sampler covers tunnels too: no tunnel ever goes past its capacity", async () => {
    const db = await customerDatabase("sampled");
    // Five free pools (2 each) behind a tunnel whose pools may hold 7: they must take turns.
    const tenants = await Promise.all([0, 1, 2, 3, 4].map(() => attach("cust", db)));
    attachedHere.push(...tenants.map((t) => t.id));
    const from = await markServerLog(customerServer);
    let sampling = true;
    const samples: { used: number; capacity: number; maintenance: number; reserve: number }[] = [];
    const sampler = (async () => {
      while (sampling) {
        const status = await tunnelStatus("cust");
        samples.push({
          used: status.allocated + status.reserved + status.draining,
          capacity: status.poolCapacity,
          maintenance: status.maintenance.inUse,
          reserve: status.reserve,
        });
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();
    const outcomes = await mapConcurrent(
      Array.from({ length: 60 }, (_, i) => i),
      10,
      async (i) => {
        const tenant = tenants[i % tenants.length] as Attached;
        const response = await query(tenant, "INSERT INTO items (body) VALUES ($1) RETURNING id", [`s${i}`]);
        const body = await response.json<{ code?: string }>();
        return response.status === 200 ? "ok" : (body.code ?? String(response.status));
      },
    );
    sampling = false;
    await sampler;
    const to = await markServerLog(customerServer);
    // Only the tunnel's own refusal may answer a request that found no room (never a failure).
    expect(outcomes.filter((o) => o !== "ok" && o !== "tunnel_unavailable")).toEqual([]);
    expect(outcomes.filter((o) => o === "ok").length).toBeGreaterThan(10);
    expect(samples.length).toBeGreaterThan(0);
    for (const sample of samples) {
      expect(sample.used).toBeLessThanOrEqual(sample.capacity);
      expect(sample.maintenance).toBeLessThanOrEqual(sample.reserve);
    }
    // What the customer's server itself logged: Lessor's backends of these roles, exactly, at every moment.
    const peaks = await connectionPeaks(
      from,
      to,
      { users: [db.role], appPatterns: [] },
      ({ app }) =>
        /^lessor:[^:]+:\d+$/.test(app) ? "pool" : app.startsWith("lessor:") ? "maintenance" : null,
      customerServer,
    );
    expect(peaks.opened).toBeGreaterThan(0);
    expect(peaks.pool, `at peak: ${peaks.atPeak.join(", ")}`).toBeLessThanOrEqual(7);
    expect(peaks.total, `at peak: ${peaks.atPeak.join(", ")}`).toBeLessThanOrEqual(8);
  });
});
