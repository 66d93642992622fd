/**
 * The direct TCP path (docs/adr/027-direct-tcp-path.md): a `postgres` host is reached with workerd's
 * `connect()`, Postgres's SSLRequest and STARTTLS, the certificate verified against the host name,
 * and SCRAM only, exactly as deployed; a `neon` host keeps the WebSocket. Against the real test
 * cluster (`ssl = on`, a certificate the test's own authority signed for `localhost`), the TCP fault
 * proxy in front of it (`tcpfault`: cut, stall), and servers that refuse in each way a host can
 * (test/fake-postgres.ts).
 */
import { env } from "cloudflare:test";
import { Client } from "@neondatabase/serverless";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import { configure, pathOf } from "../../src/postgres/driver.ts";
import { SettlingClient, sendCancel, targetOfUrl, withConnection } from "../../src/postgres/index.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  countBackends,
  createTenant,
  hostAdminUrl,
  lessor,
  pollUntil,
  sqlFor,
  uniqueTenantId,
} from "./harness.ts";

type FakeMode = "noTls" | "untrusted" | "cleartext" | "md5";
interface FakeStats {
  connections: number;
  plaintextBytes: number;
  passwords: number;
}

const fakePorts = (): Record<FakeMode, number> => JSON.parse(env.TEST_FAKE_PG_PORTS);
const fakeStats = async (): Promise<Record<FakeMode, FakeStats>> =>
  (await fetch(`${env.TEST_FAKE_PG_CONTROL_URL}/stats`)).json();
const faultProxy = async (action: "cut" | "stall" | "unstall" | "stats") =>
  (await fetch(`${env.TEST_TCP_FAULT_CONTROL_URL}/${action}`)).json<{
    accepted: number;
    open: number;
    cut: number;
  }>();

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
 * The code a connection attempt through Lessor's driver settings fails with, for `url`, declared as
 * a host of kind `postgres` (so on the TCP path, verify-full).
 */
async function refusal(url: string): Promise<string> {
  // Only this host exists here, so no placement list of the stack's may name another.
  const vars = { ...env, LESSOR_HOSTS: JSON.stringify({ probe: url }), LESSOR_PLACEMENT_HOSTS: "" };
  const config = loadConfig(vars as typeof env);
  try {
    await withConnection(config, url, "lessor:test:tcp-refusal", (client) => client.query("SELECT 1"));
    return "connected";
  } catch (error) {
    return String((error as { code?: unknown }).code ?? (error as Error).message);
  }
}

/**
 * A hang detector, not a measurement (as in blackhole.test.ts): the statement bound is 5 s in tests
 * plus the cancel grace of 2 s; a wait that never ends fails by name.
 */
async function answered<T>(what: string, work: Promise<T>): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const hung = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`hung: ${what}`)), 40_000);
  });
  try {
    return await Promise.race([work, hung]);
  } finally {
    clearTimeout(timer);
  }
}

const password = () => new URL(hostAdminUrl("local").replace(/^postgres:/, "http:")).password;

describe("the TCP path", () => {
  it("each host's path follows its kind: postgres over TCP with TLS verified, neon over the WebSocket", () => {
    const config = loadConfig(env);
    const path = (name: string) => {
      const host = config.hosts.get(name);
      return host ? pathOf(config, { host: host.hostname, port: host.port }) : null;
    };
    expect(path("local")).toMatchObject({ path: "tcp", sslmode: "verify-full" });
    expect(path("tcpfault")).toMatchObject({ path: "tcp", sslmode: "verify-full" });
    expect(path("neonlike")).toMatchObject({ path: "websocket" });
    expect(config.hosts.get("neonlike")?.kind).toBe("neon");
  });

  it("the operator sees each host's path and TLS mode (GET /v1/capacity, lessorctl capacity)", async () => {
    const { hosts } = await (await admin("/v1/capacity")).json<{
      hosts: { host: string; connection?: { path: string; sslmode: string } }[];
    }>();
    const of = (name: string) => hosts.find((h) => h.host === name)?.connection;
    expect(of("local")).toEqual({ path: "tcp", sslmode: "verify-full" });
    expect(of("neonlike")).toEqual({ path: "websocket", sslmode: "verify-full" });
    expect(of("faulty")).toEqual({ path: "websocket", sslmode: "verify-full" });
  });

  it("a tenant's queries and transactions run over TLS on the TCP path", async () => {
    const tenant = await createTenant(uniqueTenantId("tcp"));
    const sql = sqlFor(tenant);
    const [row] = await sql`SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()`;
    expect(row).toMatchObject({ ssl: true });
    expect(String(row?.version)).toMatch(/^TLSv1\.[23]$/);
    const results = await sql.transaction((tx) => [
      tx`INSERT INTO notes (body) VALUES ('over tcp') RETURNING body`,
      tx`SELECT count(*)::int AS n FROM notes`,
    ]);
    expect(results).toEqual([[{ body: "over tcp" }], [{ n: 1 }]]);
    // Every backend of the tenant's pool came in over TLS, as Postgres itself reports.
    const plain = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        `SELECT count(*)::int AS n FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
         WHERE a.application_name LIKE $1 AND NOT s.ssl`,
        [`lessor:${tenant.role}:%`],
      );
      return rows[0]?.n;
    });
    expect(plain).toBe(0);
  });

  it("a server that offers no TLS is refused (host_tls_refused) before any login byte is sent", async () => {
    const before = (await fakeStats()).noTls;
    expect(
      await refusal(`postgres://lessor_admin:${password()}@localhost:${fakePorts().noTls}/postgres`),
    ).toBe("host_tls_refused");
    const after = (await fakeStats()).noTls;
    expect(after.connections).toBe(before.connections + 1);
    expect(after.plaintextBytes).toBe(before.plaintextBytes);
  });

  it("a certificate nothing trusts is refused (host_tls_refused)", async () => {
    const before = (await fakeStats()).untrusted;
    expect(
      await refusal(`postgres://lessor_admin:${password()}@localhost:${fakePorts().untrusted}/postgres`),
    ).toBe("host_tls_refused");
    const after = (await fakeStats()).untrusted;
    expect(after.connections).toBe(before.connections + 1);
    expect(after.passwords).toBe(0);
  });

  it("a trusted certificate for another name is refused (host_tls_refused)", async () => {
    // The real cluster, by 127.0.0.1: its certificate names localhost only.
    const local = new URL(hostAdminUrl("local").replace(/^postgres:/, "http:"));
    const url = `postgres://lessor_admin:${password()}@127.0.0.1:${local.port}/postgres`;
    expect(await refusal(url)).toBe("host_tls_refused");
    // The same cluster by the name its certificate names connects.
    expect(await refusal(hostAdminUrl("local"))).toBe("connected");
  });

  it("a server asking for a cleartext or MD5 password is refused (host_auth_refused), and no password is sent", async () => {
    for (const mode of ["cleartext", "md5"] as const) {
      const before = (await fakeStats())[mode];
      expect(
        await refusal(`postgres://lessor_admin:${password()}@localhost:${fakePorts()[mode]}/postgres`),
      ).toBe("host_auth_refused");
      const after = (await fakeStats())[mode];
      expect(after.connections).toBe(before.connections + 1);
      expect(after.passwords).toBe(0);
      expect(after.plaintextBytes).toBe(0);
    }
  });

  it("configuration refuses sslmode disable off loopback, and the WebSocket path for a postgres host deployed", () => {
    const url = "postgres://a:b@db.example.com:5432/postgres";
    expect(() =>
      loadConfig({ ...env, LESSOR_HOSTS: JSON.stringify({ remote: { url, sslmode: "disable" } }) }),
    ).toThrow(/sslmode "disable" is allowed only/);
    expect(() =>
      loadConfig({
        ...env,
        LESSOR_WS_PROXY: "",
        LESSOR_HOSTS: JSON.stringify({ remote: { url, path: "websocket" } }),
      }),
    ).toThrow(/exists only through LESSOR_WS_PROXY/);
    expect(() =>
      loadConfig({
        ...env,
        LESSOR_WS_PROXY: "proxy.example.com:80",
        LESSOR_HOSTS: JSON.stringify({ remote: url }),
      }),
    ).toThrow(/LESSOR_WS_PROXY/);
  });

  it("a connection cut mid-query fails with connection_lost, and the pool replaces it without leaking", async () => {
    const tenant = await createTenant(uniqueTenantId("tcp-cut"), { host: "tcpfault", tier: "free" });
    tenantHooksForTests.config = (id) => (id === tenant.id ? { statementTimeoutMs: 600_000 } : undefined);
    let response: Response;
    try {
      const sql = sqlFor(tenant);
      await sql`SELECT 1`;
      const slow = sqlRequest(tenant, "SELECT pg_sleep(30)");
      const running = await pollUntil(
        () =>
          asSuperuser(async (client) => {
            const { rows } = await client.query(
              `SELECT count(*)::int AS n FROM pg_stat_activity
               WHERE application_name LIKE $1 AND query LIKE '%pg_sleep(30)%' AND state = 'active'`,
              [`lessor:${tenant.role}:%`],
            );
            return Number(rows[0]?.n ?? 0);
          }),
        (n) => n > 0,
        { attempts: 200, intervalMs: 50 },
      );
      expect(running).toBe(1);
      const cut = await faultProxy("cut");
      expect(cut.cut).toBeGreaterThan(0);
      response = await slow;
    } finally {
      tenantHooksForTests.config = undefined;
    }
    expect(response.status).toBe(503);
    expect(await response.json()).toMatchObject({ code: "connection_lost" });
    // The pool goes on: the next query runs on a fresh connection.
    expect(await sqlFor(tenant)`SELECT 2 AS n`).toEqual([{ n: 2 }]);
    // Nothing leaks: the cut backends end, and the pool holds no more than its size (free: 2).
    const backends = await pollUntil(
      () => countBackends(`lessor:${tenant.role}:`),
      (n) => n <= 2,
    );
    expect(backends).toBeLessThanOrEqual(2);
  });

  it("a warm TCP connection that goes silent mid-query (a blackhole) is answered within its bound and replaced", async () => {
    const tenant = await createTenant(uniqueTenantId("tcp-bh"), { host: "tcpfault", tier: "free" });
    const sql = sqlFor(tenant);
    expect(await sql`SELECT 1 AS one`).toEqual([{ one: 1 }]);
    await faultProxy("stall");
    let stuck: Response;
    try {
      stuck = await answered("a statement on a TCP connection gone silent", sqlRequest(tenant, "SELECT 1"));
    } finally {
      await faultProxy("unstall");
    }
    // As on the WebSocket path (blackhole.test.ts): the statement did not complete, and it says so.
    expect([400, 503]).toContain(stuck.status);
    expect((await stuck.json<{ code: string }>()).code).toMatch(
      /^(statement_timeout|connection_lost|lease_timeout)$/,
    );
    expect((await env.TENANTS.getByName(tenant.id).status()).leases).toBe(0);
    // The network speaks again: the pool serves on a connection that works.
    const after = await pollUntil(
      async () => {
        try {
          return await sql`SELECT 2 AS two`;
        } catch {
          return null;
        }
      },
      (rows) => rows !== null,
      { attempts: 40, intervalMs: 250 },
    );
    expect(after).toEqual([{ two: 2 }]);
  });

  it("a cancel reaches the backend over TLS too: the statement ends with query_canceled, the connection stays", async () => {
    const config = loadConfig(env);
    const url = hostAdminUrl("local");
    const code = await withConnection(config, url, "lessor:test:tcp-cancel", async (client) => {
      const sleeping = client.query("SELECT pg_sleep(30)").then(
        () => "finished",
        (error: { code?: string }) => error.code ?? "failed",
      );
      const running = await pollUntil(
        () =>
          asSuperuser(async (inspector) => {
            const { rows } = await inspector.query(
              "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'lessor:test:tcp-cancel' AND state = 'active'",
            );
            return Number(rows[0]?.n ?? 0);
          }),
        (n) => n > 0,
        { attempts: 200, intervalMs: 50 },
      );
      expect(running).toBe(1);
      sendCancel(config, targetOfUrl(url), client);
      const outcome = await sleeping;
      // The connection outlived the cancel: it answers the next statement.
      expect((await client.query("SELECT 3 AS n")).rows).toEqual([{ n: 3 }]);
      return outcome;
    });
    expect(code).toBe("57014");
  });

  it("a stalled network cannot hold end(): the end waits for the server only within its bound", async () => {
    const config = loadConfig(env);
    const client = configure(
      new SettlingClient({
        connectionString: hostAdminUrl("tcpfault"),
        application_name: "lessor:test:tcp-end",
      }),
      config,
    );
    client.on("error", () => undefined);
    await client.connect();
    expect((await client.query("SELECT 1 AS n")).rows).toEqual([{ n: 1 }]);
    await faultProxy("stall");
    try {
      // The Terminate is dropped by the stalled network; past its bound the end cuts and settles.
      await client.end();
    } finally {
      await faultProxy("unstall");
    }
    expect(client instanceof Client).toBe(true);
  });
});
