/**
 * Tenant containment, tried as a hostile tenant would: with nothing but its own key and `/sql`
 * (or a session lease), a tenant's SQL must not leave its database, its budget or its time.
 * Each describe block is an attack from issue 11 that succeeded before containment.
 */

import { env, runDurableObjectAlarm } from "cloudflare:test";
import { Client } from "@neondatabase/serverless";
import { describe, expect, it, vi } from "vitest";
import { unseal } from "../../src/crypto/seal.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  eventsOf,
  lessor,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";
import { markServerLog, serverLogLines } from "./server-log.ts";

interface Answer {
  status: number;
  body: {
    rows?: (string | null)[][];
    results?: { rows: (string | null)[][] }[];
    code?: string;
    message?: string;
  };
}

async function run(tenant: CreatedTenant, query: string, params: unknown[] = []): Promise<Answer> {
  const response = await sqlRequest(tenant.connectionString, { query, params });
  return { status: response.status, body: JSON.parse(await response.text()) as Answer["body"] };
}

async function rows(
  tenant: CreatedTenant,
  query: string,
  params: unknown[] = [],
): Promise<(string | null)[][]> {
  const answer = await run(tenant, query, params);
  if (answer.status !== 200) throw new Error(`${query}: ${answer.status} ${JSON.stringify(answer.body)}`);
  return answer.body.rows ?? [];
}

/** Tries to log in to `database` on the test host directly, as `user`; answers the error code or "connected". */
async function tryLogin(user: string, password: string, database: string, options?: string): Promise<string> {
  const url = new URL(env.TEST_PG_SUPERUSER_URL.replace(/^postgres:/, "http:"));
  const client = new Client({
    host: url.hostname,
    port: Number(url.port),
    user,
    password,
    database,
    ...(options ? { options } : {}),
  });
  client.on("error", () => undefined);
  try {
    await client.connect();
    await client.end().catch(() => undefined);
    return "connected";
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    return typeof code === "string" ? code : String(error);
  }
}

async function databases(): Promise<string[]> {
  return asSuperuser(async (client) => {
    const { rows: list } = await client.query(
      "SELECT datname FROM pg_database WHERE datallowconn ORDER BY 1",
    );
    return list.map((row: { datname: string }) => row.datname);
  });
}

/** The tenant's real password, as Lessor holds it (sealed in the catalog). */
async function sealedPassword(tenant: CreatedTenant): Promise<string> {
  const sealed = await asSuperuser(async (client) => {
    const { rows: list } = await client.query(
      "SELECT sealed_password FROM tenant_credentials WHERE tenant_id = $1",
      [tenant.id],
    );
    return String(list[0]?.sealed_password);
  }, "lessor");
  return unseal(env.LESSOR_SEAL_KEY, tenant.id, sealed);
}

describe("a tenant cannot log in around Lessor", () => {
  it("a password it sets for itself opens no database of the host, and Lessor repairs the drift", async () => {
    const tenant = await createTenant(uniqueTenantId("login"));
    expect(await rows(tenant, "SELECT 1")).toEqual([["1"]]);
    // Postgres lets every role change its own password: the attack itself succeeds.
    expect((await run(tenant, "ALTER ROLE CURRENT_USER PASSWORD 'chosen-by-the-tenant'")).status).toBe(200);

    const all = await databases();
    expect(all).toContain(tenant.database);
    expect(all).toContain("postgres");
    expect(all).toContain("lessor");
    // Every database that is not a tenant's, its own, and a sample of other tenants' (they are all
    // made alike, and the suite's catalog holds hundreds by now: one login each costs a handshake).
    const others = all.filter((d) => d.startsWith("t_") && d !== tenant.database);
    const tried = [
      ...all.filter((d) => !d.startsWith("t_")),
      tenant.database,
      ...others.filter((_, i) => i % Math.max(1, Math.ceil(others.length / 25)) === 0),
    ];
    expect(tried.length).toBeGreaterThanOrEqual(Math.min(all.length, 4));
    for (const database of tried) {
      const outcome = await tryLogin(tenant.role, "chosen-by-the-tenant", database);
      expect({ database, outcome }).not.toEqual({ database, outcome: "connected" });
    }
    // Its own database refuses it at the guard (28000), every other for want of CONNECT (42501).
    expect(await tryLogin(tenant.role, "chosen-by-the-tenant", tenant.database)).toBe("28000");
    expect(await tryLogin(tenant.role, "chosen-by-the-tenant", "postgres")).toBe("42501");

    // The token of a connection it is sitting on was spent at login, so it opens nothing either.
    const [[token]] = (await rows(tenant, "SELECT current_setting('lessor.login', true)")) as [[string]];
    expect(token).toMatch(/^[0-9a-f]{32}\.[0-9]+\.[0-9a-f]{64}$/);
    expect(
      await tryLogin(tenant.role, "chosen-by-the-tenant", tenant.database, `-c lessor.login=${token}`),
    ).toBe("28000");
    // The next start finds the password changed (28P01), repairs it, and serves.
    const drained = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    expect(drained.status).toBe(202);
    expect(await rows(tenant, "SELECT 2")).toEqual([["2"]]);
    // The repair is a lifecycle event (the alarm flushes the object's outbox).
    await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id));
    const reasons = (await eventsOf(tenant.id)).map((event) => event.reason);
    expect(reasons).toContain("credential_repaired");
    // The repaired password is Lessor's again, and not even it opens a direct login without a token.
    expect(await tryLogin(tenant.role, "chosen-by-the-tenant", tenant.database)).toBe("28P01");
    expect(await tryLogin(tenant.role, await sealedPassword(tenant), tenant.database)).toBe("28000");
  });

  it("cannot raise its own connection limit, which is its pool plus one", async () => {
    const tenant = await createTenant(uniqueTenantId("connlimit"));
    const answer = await run(tenant, "ALTER ROLE CURRENT_USER CONNECTION LIMIT 100");
    expect(answer.status).toBe(400);
    expect(answer.body.code).toBe("42501");
    const limit = await asSuperuser(async (client) => {
      const { rows: list } = await client.query("SELECT rolconnlimit FROM pg_roles WHERE rolname = $1", [
        tenant.role,
      ]);
      return Number(list[0]?.rolconnlimit);
    });
    expect(limit).toBe(5 + 1);
    // Nor lift the temporary-file limit (a superuser-only setting).
    expect((await run(tenant, "SET temp_file_limit = -1")).body.code).toBe("42501");
  });

  it("sends the password as a SCRAM verifier: the host stores it as sent, whatever its own hashing", async () => {
    // With the admin role hashing passwords as md5, a plaintext password would be stored as md5.
    await asSuperuser((client) => client.query("ALTER ROLE CURRENT_USER SET password_encryption = 'md5'"));
    try {
      const tenant = await createTenant(uniqueTenantId("scram"));
      const stored = await asSuperuser(async (client) => {
        const { rows: list } = await client.query("SELECT rolpassword FROM pg_authid WHERE rolname = $1", [
          tenant.role,
        ]);
        return String(list[0]?.rolpassword);
      });
      expect(stored).toMatch(/^SCRAM-SHA-256\$4096:[A-Za-z0-9+/=]+\$[A-Za-z0-9+/=]+:[A-Za-z0-9+/=]+$/);
      expect(await rows(tenant, "SELECT 1")).toEqual([["1"]]);
    } finally {
      await asSuperuser((client) => client.query("ALTER ROLE CURRENT_USER RESET password_encryption"));
    }
  });
});

describe("a tenant cannot see the others", () => {
  it("finds no other tenant's id in pg_database, pg_roles, pg_stat_activity or the statistics views", async () => {
    const prying = await createTenant(uniqueTenantId("prying"));
    const other = await createTenant(uniqueTenantId("secretco"));
    // The other tenant is live: it has backends right now.
    expect(await rows(other, "SELECT 1")).toEqual([["1"]]);
    const probes = [
      "SELECT string_agg(datname, ' ') FROM pg_database",
      "SELECT string_agg(rolname, ' ') FROM pg_roles",
      "SELECT string_agg(coalesce(application_name, '') || ' ' || coalesce(usename, '') || ' ' || coalesce(datname, ''), ' ') FROM pg_stat_activity",
      "SELECT string_agg(datname, ' ') FROM pg_stat_database",
      "SELECT string_agg(coalesce(setconfig::text, ''), ' ') FROM pg_db_role_setting",
      "SELECT string_agg(coalesce(description, ''), ' ') FROM pg_shdescription",
    ];
    for (const probe of probes) {
      const text = JSON.stringify(await rows(prying, probe));
      expect({ probe, leaks: text.includes(other.id) }).toEqual({ probe, leaks: false });
      expect({ probe, leaks: text.includes("secretco") }).toEqual({ probe, leaks: false });
    }
    // The names it does see are opaque.
    expect(other.database).toMatch(/^t_[0-9a-f]{16}$/);
    expect(other.role).toBe(other.database);
  });
});

describe("no session state passes from one request to the next", () => {
  const probe = [
    "SELECT current_setting('search_path') AS search_path,",
    // A custom setting's name outlives RESET ALL (Postgres cannot undefine it), its value does not.
    "nullif(current_setting('app.user_id', true), '') AS user_id,",
    "current_setting('statement_timeout') AS statement_timeout,",
    "current_user::text AS usr,",
    "(SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema())::text AS temps,",
    "(SELECT count(*) FROM pg_prepared_statements)::text AS prepared,",
    "(SELECT count(*) FROM pg_listening_channels())::text AS listening,",
    "(SELECT count(*) FROM pg_cursors)::text AS cursors,",
    "(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid())::text AS advisory,",
    "current_setting('transaction_isolation') AS isolation,",
    "pg_backend_pid()::text AS pid",
  ].join(" ");

  /** Everything but the backend pid: the state a request must find as a fresh connection has it. */
  async function state(tenant: CreatedTenant): Promise<{ pid: string; rest: (string | null)[] }> {
    const [row] = await rows(tenant, probe);
    if (!row) throw new Error("no probe row");
    return { pid: String(row.at(-1)), rest: row.slice(0, -1) };
  }

  it("whatever the statement did, on the one pooled connection (every bypass of the old detector)", async () => {
    // Pool of one: every request runs on the same backend, so a leak could not hide on another.
    const tenant = await createTenant(uniqueTenantId("leak"), { tier: "solo" });
    expect(
      (
        await run(
          tenant,
          `CREATE FUNCTION leak() RETURNS int LANGUAGE plpgsql AS $$
           BEGIN
             PERFORM set_config('app.user_id', '44', false);
             PERFORM set_config('search_path', 'evil, public', false);
             PERFORM pg_advisory_lock(7);
             CREATE TEMP TABLE IF NOT EXISTS fn_temp (a int);
             RETURN 1;
           END $$`,
        )
      ).status,
    ).toBe(200);
    expect((await run(tenant, "CREATE SEQUENCE leak_seq START 7000")).status).toBe(200);
    const baseline = await state(tenant);
    // Sequence state is per session: `lastval()` answers 55000 (not yet defined in this session)
    // on a connection that has not called nextval, and the value on one that has, within a request.
    const lastval = async () => {
      const answer = await run(tenant, "SELECT lastval()::text");
      return answer.status === 200 ? (answer.body.rows?.[0]?.[0] ?? null) : (answer.body.code ?? null);
    };
    expect(await lastval()).toBe("55000");
    const within = await sqlRequest(tenant.connectionString, {
      queries: [
        { query: "SELECT nextval('leak_seq')", params: [] },
        { query: "SELECT lastval()", params: [] },
      ],
    });
    expect(((await within.json()) as { results: { rows: string[][] }[] }).results[1]?.rows).toEqual([
      ["7000"],
    ]);
    const corpus: (string | { queries: string[] })[] = [
      "SET search_path TO evil, public",
      "/**/SET search_path TO evil, public",
      "-- note\nSET search_path TO evil, public",
      "SELECT set_config('app.user_id', '42', false)",
      "SELECT U&\"\\0073et_config\"('app.user_id', '43', false)",
      "SELECT leak()",
      "CREATE TABLE pg_temp.x AS SELECT 1 AS a",
      "CREATE TEMP TABLE t2 (a int)",
      "CREATE TEMPORARY TABLE t3 (a int)",
      "SELECT pg_advisory_lock(42)",
      "SELECT pg_advisory_lock(508887041)", // the migrator's own key
      "PREPARE leaked_plan AS SELECT 1",
      "LISTEN leaked_channel",
      { queries: ["DECLARE held CURSOR WITH HOLD FOR SELECT 1"] },
      `SET ROLE "${tenant.role}"`,
      `SET SESSION AUTHORIZATION "${tenant.role}"`,
      "SET statement_timeout = '1234ms'",
      "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
      "BEGIN",
      { queries: ["SET app.user_id = '45'", "SELECT set_config('search_path', 'evil', false)"] },
      "SELECT 1; SET search_path TO evil",
      "SELECT nextval('leak_seq')",
      { queries: ["SELECT nextval('leak_seq')", "SELECT currval('leak_seq')"] },
    ];
    for (const attack of corpus) {
      const response =
        typeof attack === "string"
          ? await sqlRequest(tenant.connectionString, { query: attack, params: [] })
          : await sqlRequest(tenant.connectionString, {
              queries: attack.queries.map((query) => ({ query, params: [] })),
            });
      await response.text();
      for (let i = 0; i < 3; i++) {
        const after = await state(tenant);
        expect({ attack, after: after.rest }).toEqual({ attack, after: baseline.rest });
        // It really is the same backend the attack ran on (nothing was dodged by a reconnect).
        expect(after.pid).toBe(baseline.pid);
      }
      expect({ attack, lastval: await lastval() }).toEqual({ attack, lastval: "55000" });
    }
  });

  it("the reset writes nothing to the server log: no warning per request or per control-plane session", async () => {
    const from = await markServerLog();
    const tenant = await createTenant(uniqueTenantId("quiet"), { tier: "solo" });
    for (let i = 0; i < 5; i++) expect((await run(tenant, "SELECT $1::int AS n", [i])).status).toBe(200);
    expect((await run(tenant, "SELECT 1/0")).status).toBe(400);
    const batch = await sqlRequest(tenant.connectionString, {
      queries: [
        { query: "SELECT 1", params: [] },
        { query: "SELECT 2", params: [] },
      ],
    });
    expect(batch.status).toBe(200);
    await batch.text();
    // The last reset has run once the next request finds the one connection free again.
    expect(await rows(tenant, "SELECT 1")).toEqual([["1"]]);
    const to = await markServerLog();
    // The prefix is `time|pid|application|user|database|` (test/server-log.ts). The tenant's
    // database, and the control plane's sessions (its creation and first start opened several).
    const warnings = (await serverLogLines(from, to, "WARNING")).filter(
      (line) => line.split("|")[4] === tenant.database || line.split("|")[2] === "lessor-control-plane",
    );
    expect(warnings).toEqual([]);
    // A request that leaves a transaction open still has it ended before the next one: the two
    // reads after it run in transactions of their own.
    expect((await run(tenant, "BEGIN")).status).toBe(200);
    const xid = "SELECT pg_current_xact_id()::text";
    expect(await rows(tenant, xid)).not.toEqual(await rows(tenant, xid));
  });

  it("a multi-statement string is refused by Postgres, as on Neon", async () => {
    const tenant = await createTenant(uniqueTenantId("multi"));
    const answer = await run(tenant, "SELECT 1; SELECT 2");
    expect(answer.status).toBe(400);
    expect(answer.body.code).toBe("42601");
  });
});

/** The tenant's statements running on the host right now. */
function activeStatements(tenant: CreatedTenant): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows: list } = await client.query(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND state = 'active'",
      [tenant.role],
    );
    return Number(list[0]?.n);
  });
}

describe("a tenant's work is bounded in time", () => {
  it("frees a pool held by sleeps and by a statement that catches its cancel, and answers meanwhile", async () => {
    // Pool of two, both held: one plain sleep, one that swallows cancels (only a cut ends it).
    const tenant = await createTenant(uniqueTenantId("sleeper"), { tier: "free" });
    await run(
      tenant,
      `CREATE FUNCTION stubborn() RETURNS int LANGUAGE plpgsql AS $$
       BEGIN
         LOOP
           BEGIN
             PERFORM pg_sleep(1);
           EXCEPTION WHEN query_canceled THEN NULL;
           END;
         END LOOP;
       END $$`,
    );
    const sleepy = run(tenant, "SELECT pg_sleep(86400)");
    const stubborn = run(tenant, "SELECT stubborn()");
    // Both connections are held (both statements are running) before the plain query asks.
    const active = await pollUntil(
      () => activeStatements(tenant),
      (n) => n >= 2,
      { attempts: 40, intervalMs: 100 },
    );
    expect(active).toBe(2);
    const plain = await run(tenant, "SELECT 'answered' AS a");
    expect(plain).toEqual({ status: 200, body: expect.objectContaining({ rows: [["answered"]] }) });
    // The plain sleep stopped at its cancel: Postgres said so (57014), so it did not commit.
    const slept = await sleepy;
    expect(slept.status).toBe(400);
    expect(slept.body.code).toBe("statement_timeout");
    expect(slept.body.message).toContain("LESSOR_STATEMENT_TIMEOUT_MS");
    // The stubborn one swallowed its cancel and its connection was cut: Postgres never said it
    // stopped, so Lessor never claims it did not commit (the soak's answer stuck in a stalled
    // network after its commit is the same case).
    const cut = await stubborn;
    expect(cut.status).toBe(503);
    expect(cut.body.code).toBe("connection_lost");
    expect(cut.body.message).toContain("LESSOR_STATEMENT_TIMEOUT_MS");
    expect(cut.body.message).toContain("may or may not have committed");
    // A batch that turns Postgres's own timeout off first: Lessor's bound is not Postgres's.
    const batch = await sqlRequest(tenant.connectionString, {
      queries: [
        { query: "SET LOCAL statement_timeout = 0", params: [] },
        { query: "SELECT pg_sleep(86400)", params: [] },
      ],
    });
    expect(batch.status).toBe(400);
    expect(((await batch.json()) as { code: string }).code).toBe("statement_timeout");
    // Nothing of it runs on the host any more.
    expect(
      await pollUntil(
        () => activeStatements(tenant),
        (n) => n === 0,
      ),
    ).toBe(0);
    expect(await rows(tenant, "SELECT 3")).toEqual([["3"]]);
  });

  it("a session lease cannot outlive its absolute lifetime by renewing it", async () => {
    const tenant = await createTenant(uniqueTenantId("forever"));
    const opened = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
      body: JSON.stringify({ ttlMs: 30_000 }),
    });
    const { lease } = await opened.json<{ lease: string }>();
    const use = () =>
      lessor(`/v1/leases/${lease}/sql`, {
        method: "POST",
        headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
        body: JSON.stringify({ query: "SELECT 1", params: [] }),
      });
    // Used every 25 s, well inside its 30 s TTL: it stays alive until the test deployment's
    // lifetime (120 s, vitest.config.ts) and not one use longer.
    let last: Response | undefined;
    let served = 0;
    const start = Date.now();
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      for (let step = 0; step < 10; step++) {
        vi.setSystemTime(start + step * 25_000);
        last = await use();
        if (last.status !== 200) break;
        served++;
      }
    } finally {
      vi.useRealTimers();
    }
    expect(served).toBe(5);
    if (!last) throw new Error("no answer");
    expect(last.status).toBe(409);
    expect(((await last.json()) as { code: string }).code).toBe("lease_expired");
  });
});

describe("no prepared transaction is left behind", () => {
  /** The prepared transactions Postgres holds in the tenant's own database. */
  function preparedIn(tenant: CreatedTenant): Promise<string[]> {
    return asSuperuser(async (client) => {
      const { rows: list } = await client.query(
        "SELECT gid FROM pg_catalog.pg_prepared_xacts WHERE database = current_database() ORDER BY gid",
      );
      return list.map((row: { gid: string }) => row.gid);
    }, tenant.database);
  }

  /** Rolls back whatever a failed run left prepared: it would pin the host's horizon for every other test. */
  async function rollBackLeftovers(tenant: CreatedTenant): Promise<void> {
    await asSuperuser(async (client) => {
      for (const gid of await preparedIn(tenant)) {
        await client.query(`ROLLBACK PREPARED '${gid.replaceAll("'", "''")}'`);
      }
    }, tenant.database);
  }

  it("a PREPARE TRANSACTION on a lease is refused and rolled back; nothing pins the horizon", async () => {
    const tenant = await createTenant(uniqueTenantId("prepared"));
    try {
      const opened = await lessor(`/v1/tenants/${tenant.id}/leases`, {
        method: "POST",
        headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
        body: JSON.stringify({ ttlMs: 30_000 }),
      });
      const { lease } = await opened.json<{ lease: string }>();
      const on = (query: string) =>
        lessor(`/v1/leases/${lease}/sql`, {
          method: "POST",
          headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
          body: JSON.stringify({ query, params: [] }),
        });
      expect((await on("BEGIN")).status).toBe(200);
      expect((await on("INSERT INTO notes (body) VALUES ('prepared')")).status).toBe(200);
      const prepared = await on("PREPARE TRANSACTION 'tenant-held'");
      expect(prepared.status).toBe(400);
      expect(((await prepared.json()) as { code: string }).code).toBe("prepared_transaction_refused");
      expect(await preparedIn(tenant)).toEqual([]);
      expect(await rows(tenant, "SELECT count(*) FROM notes WHERE body = 'prepared'")).toEqual([["0"]]);
    } finally {
      await rollBackLeftovers(tenant);
    }
  });

  it("a PREPARE TRANSACTION in a /sql transaction is refused and rolled back; nothing pins the horizon", async () => {
    const tenant = await createTenant(uniqueTenantId("prepared-sql"));
    try {
      const batch = await sqlRequest(tenant.connectionString, {
        queries: [
          { query: "INSERT INTO notes (body) VALUES ('prepared')", params: [] },
          { query: "PREPARE TRANSACTION 'tenant-held-2'", params: [] },
        ],
      });
      expect(batch.status).toBe(400);
      expect(((await batch.json()) as { code: string }).code).toBe("prepared_transaction_refused");
      expect(await preparedIn(tenant)).toEqual([]);
      expect(await rows(tenant, "SELECT count(*) FROM notes WHERE body = 'prepared'")).toEqual([["0"]]);
    } finally {
      await rollBackLeftovers(tenant);
    }
  });
});
