/**
 * Issue 24: tenants own nothing Lessor trusts (docs/adr/007-tenant-containment.md).
 *
 * - The tenant's database belongs to Lessor's admin: the tenant creates and owns its objects, and
 *   changes nothing of the database itself; a new database is closed until its guard is in.
 * - A database its tenant owned (provisioned before) is taken over by the host-hygiene pass, which
 *   a kill half way does not stop.
 * - A prepared transaction never survives, however disguised: odd gids under odd settings, a
 *   shadowed catalog, a role switch, a connection that died before Lessor's rollback.
 * - Erase finishes whatever a tenant that owned its database set on it.
 * - End users keep working, as themselves, through rotations under load; their login role repairs
 *   itself whole (password, settings, CONNECT).
 */
import { env, runInDurableObject } from "cloudflare:test";
import { exportJWK, generateKeyPair, SignJWT } from "jose";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { appSchemaVersionReported } from "../../src/campaigns/schema-version.ts";
import { loadConfig } from "../../src/config/index.ts";
import { unseal } from "../../src/crypto/seal.ts";
import { setLogSink } from "../../src/log/index.ts";
import { withTenantConnection } from "../../src/postgres/index.ts";
import { provisioningHooksForTests } from "../../src/provisioning/test-hooks.ts";
import { sessionLimits, tenantCredential } from "../../src/tenant-db/connect.ts";
import { takeDatabaseOwnership } from "../../src/tenant-db/host-admin.ts";
import { hostHygiene } from "../../src/tenant-db/hygiene.ts";
import { withAdminConnection } from "../../src/tenant-db/maintenance.ts";
import { tenantMigrations } from "../fixtures/tenant-schema/migrations.gen.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  mapConcurrent,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

const hostName = "local";

interface Answer {
  status: number;
  body: { rows?: unknown[][]; code?: string; message?: string; results?: unknown[] };
}

async function asTenant(tenant: CreatedTenant, query: string, params: unknown[] = []): Promise<Answer> {
  const response = await sqlRequest(tenant.connectionString, { query, params });
  return { status: response.status, body: await response.json() };
}

async function asTenantOk(
  tenant: CreatedTenant,
  query: string,
  params: unknown[] = [],
): Promise<unknown[][]> {
  const answer = await asTenant(tenant, query, params);
  expect(answer, `${query}: ${JSON.stringify(answer.body)}`).toMatchObject({ status: 200 });
  return answer.body.rows ?? [];
}

async function superuserValue(
  query: string,
  params: unknown[] = [],
  database = "postgres",
): Promise<unknown> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(query, params);
    const row = rows[0] as Record<string, unknown> | undefined;
    return row ? Object.values(row)[0] : undefined;
  }, database);
}

/** Prepared transactions left in the tenant's database, read through pg_catalog by the superuser. */
function preparedLeft(tenant: CreatedTenant): Promise<number> {
  return superuserValue("SELECT count(*)::int FROM pg_catalog.pg_prepared_xacts WHERE database = $1", [
    tenant.database,
  ]).then(Number);
}

async function openLease(tenant: CreatedTenant): Promise<string> {
  const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs: 30_000 }),
  });
  expect(response.status).toBe(201);
  return (await response.json<{ lease: string }>()).lease;
}

async function onLease(tenant: CreatedTenant, lease: string, query: string): Promise<Answer> {
  const response = await lessor(`/v1/leases/${lease}/sql`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
    body: JSON.stringify({ query, params: [] }),
  });
  return { status: response.status, body: await response.json() };
}

async function closeLease(tenant: CreatedTenant, lease: string): Promise<void> {
  await lessor(`/v1/leases/${lease}`, {
    method: "DELETE",
    headers: { Authorization: `Bearer ${tenant.key}` },
  });
}

async function passwordOf(id: string): Promise<string> {
  const sealed = await superuserValue(
    "SELECT sealed_password FROM tenant_credentials WHERE tenant_id = $1",
    [id],
    "lessor",
  );
  return unseal(env.LESSOR_SEAL_KEY, id, String(sealed));
}

/** Runs `work` on a connection as the tenant's role, opened as Lessor opens one (token and all). */
async function asTenantRoleDirectly<T>(
  tenant: CreatedTenant,
  work: (client: { query(text: string): Promise<{ rows: Record<string, unknown>[] }> }) => Promise<T>,
): Promise<T> {
  const config = loadConfig(env);
  const credential = await tenantCredential(
    config,
    { host: hostName, roleName: tenant.role, databaseName: tenant.database },
    await passwordOf(tenant.id),
  );
  return withTenantConnection(
    config,
    credential.target,
    {
      applicationName: `lessor:${tenant.role}:test`,
      limits: sessionLimits(config),
      loginToken: credential.loginToken,
    },
    work,
  );
}

/** Makes the tenant's database its own role's, as provisioning did before issue 24. */
async function makeLegacy(tenant: CreatedTenant): Promise<void> {
  await asSuperuser(async (client) => {
    await client.query(`ALTER DATABASE "${tenant.database}" OWNER TO "${tenant.role}"`);
    await client.query(`REVOKE CREATE ON DATABASE "${tenant.database}" FROM "${tenant.role}"`);
  });
}

async function crash(id: string): Promise<void> {
  await runInDurableObject(env.TENANTS.getByName(id), (_instance, state) => {
    state.abort("test: object reset");
  }).catch(() => undefined);
}

afterEach(() => {
  provisioningHooksForTests.onStep = undefined;
});

describe("the tenant's database belongs to Lessor", () => {
  let tenant: CreatedTenant;
  beforeAll(async () => {
    tenant = await createTenant(uniqueTenantId("lp-own"));
  });

  it("is owned by the admin; the tenant owns its objects and changes nothing of the database", async () => {
    expect(
      await superuserValue("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1", [
        tenant.database,
      ]),
    ).toBe("lessor_admin");
    for (const statement of [
      `ALTER DATABASE "${tenant.database}" SET search_path = public, pg_catalog`,
      `ALTER DATABASE "${tenant.database}" WITH IS_TEMPLATE true`,
      `ALTER DATABASE "${tenant.database}" WITH ALLOW_CONNECTIONS false`,
      `ALTER DATABASE "${tenant.database}" CONNECTION LIMIT 1`,
      `ALTER DATABASE "${tenant.database}" RENAME TO mine`,
      "DROP SCHEMA lessor_guard CASCADE",
      "CREATE OR REPLACE FUNCTION auth.user_id() RETURNS text LANGUAGE sql AS $$ SELECT 'me' $$",
      "CREATE TABLE auth.planted (a int)",
    ]) {
      const answer = await asTenant(tenant, statement);
      expect({ statement, status: answer.status, code: answer.body.code }).toMatchObject({
        status: 400,
        code: "42501",
      });
    }
    // What an application needs: schemas, tables, functions, grants of its own.
    await asTenantOk(tenant, "CREATE SCHEMA app");
    await asTenantOk(tenant, "CREATE TABLE app.items (id int PRIMARY KEY)");
    await asTenantOk(tenant, "CREATE TABLE public.things (id int PRIMARY KEY)");
    await asTenantOk(
      tenant,
      "CREATE FUNCTION app.double(x int) RETURNS int LANGUAGE sql AS $$ SELECT x * 2 $$",
    );
    expect(await asTenantOk(tenant, "SELECT app.double(21)")).toEqual([["42"]]);
    expect(
      await superuserValue(
        "SELECT count(*)::int FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase WHERE d.datname = $1",
        [tenant.database],
      ),
    ).toBe(0);
  });

  it("is created closed: nobody but the admin can connect until the guard is in", async () => {
    const id = uniqueTenantId("lp-closed");
    const seen: Record<string, unknown>[] = [];
    provisioningHooksForTests.onStep = async ({ tenantId, step, databaseName }) => {
      if (tenantId !== id) return;
      const facts = await asSuperuser(async (client) => {
        const { rows } = await client.query(
          `SELECT has_database_privilege('public', d.oid, 'CONNECT') AS public_connect,
                  has_database_privilege(d.datname, d.oid, 'CONNECT') AS tenant_connect,
                  pg_get_userbyid(d.datdba) AS owner
             FROM pg_database d WHERE d.datname = $1`,
          [databaseName],
        );
        return rows[0] as Record<string, unknown>;
      });
      const guard = await superuserValue(
        "SELECT count(*)::int FROM pg_event_trigger WHERE evtname = 'lessor_login_guard' AND evtenabled <> 'D'",
        [],
        databaseName,
      );
      seen.push({ step, ...facts, guard });
    };
    const created = await createTenant(id);
    expect(seen).toEqual([
      {
        step: "database_closed",
        public_connect: false,
        tenant_connect: false,
        owner: "lessor_admin",
        guard: 0,
      },
      { step: "opened", public_connect: false, tenant_connect: true, owner: "lessor_admin", guard: 1 },
    ]);
    await asTenantOk(created, "SELECT 1");
  });
});

describe("a tenant database its tenant owned", () => {
  it("is taken over by the host-hygiene pass, which finishes what a killed pass started", async () => {
    const tenant = await createTenant(uniqueTenantId("lp-legacy"));
    await makeLegacy(tenant);
    // As its owner, the tenant sets what an owner may.
    for (const statement of [
      `ALTER DATABASE "${tenant.database}" SET search_path = public, pg_catalog`,
      `ALTER DATABASE "${tenant.database}" SET default_transaction_read_only = on`,
      `ALTER DATABASE "${tenant.database}" WITH IS_TEMPLATE true CONNECTION LIMIT 50`,
    ]) {
      await asTenantOk(tenant, statement);
    }
    const config = loadConfig(env);
    const host = config.hosts.get(hostName);
    if (!host) throw new Error("no local host");
    // A pass killed after its first statement: the owner moved, the tenant not yet let back in.
    await withAdminConnection(env, config, host, { purpose: "test", knownReport: null }, (admin) =>
      takeDatabaseOwnership(admin, tenant.database, tenant.role),
    );
    const half = (await asSuperuser(async (client) => {
      const { rows } = await client.query(
        `SELECT pg_get_userbyid(d.datdba) AS owner, d.datistemplate, d.datconnlimit,
                has_database_privilege($2, d.oid, 'CREATE') AS tenant_create,
                (SELECT count(*)::int FROM pg_db_role_setting s WHERE s.setdatabase = d.oid AND s.setrole = 0) AS settings
           FROM pg_database d WHERE d.datname = $1`,
        [tenant.database, tenant.role],
      );
      return rows[0];
    })) as Record<string, unknown>;
    expect(half).toEqual({
      owner: "lessor_admin",
      datistemplate: false,
      datconnlimit: -1,
      tenant_create: false,
      settings: 0,
    });

    const pass = await hostHygiene(env, config, host);
    expect(pass.moved).toBeGreaterThanOrEqual(1);
    expect(pass.failed).toBe(0);
    expect(
      await superuserValue(
        "SELECT has_database_privilege($2, d.oid, 'CREATE') FROM pg_database d WHERE d.datname = $1",
        [tenant.database, tenant.role],
      ),
    ).toBe(true);
    // The tenant works as before: its own objects, in public and in a schema of its own.
    await asTenantOk(tenant, "CREATE TABLE public.after_move (a int)");
    await asTenantOk(tenant, "CREATE SCHEMA moved");
    await asTenantOk(tenant, "INSERT INTO public.after_move VALUES (1)");
    // And it can no longer change the database.
    const refused = await asTenant(tenant, `ALTER DATABASE "${tenant.database}" SET search_path = public`);
    expect(refused.body.code).toBe("42501");
    // A second pass finds nothing of this tenant to do.
    const again = await hostHygiene(env, config, host);
    expect(again.failed).toBe(0);
    expect(
      await superuserValue(
        "SELECT has_database_privilege($2, d.oid, 'CREATE') FROM pg_database d WHERE d.datname = $1",
        [tenant.database, tenant.role],
      ),
    ).toBe(true);
  });
});

describe("a prepared transaction never survives", () => {
  let tenant: CreatedTenant;
  beforeAll(async () => {
    tenant = await createTenant(uniqueTenantId("lp-2pc"));
    await asTenantOk(tenant, "CREATE TABLE public.marks (note text)");
  });

  it("through a /sql transaction", async () => {
    const response = await sqlRequest(tenant.connectionString, {
      queries: [
        { query: "INSERT INTO public.marks VALUES ('plain')", params: [] },
        { query: "PREPARE TRANSACTION 'plain'", params: [] },
      ],
    });
    expect(((await response.json()) as { code?: string }).code).toBe("prepared_transaction_refused");
    expect(await preparedLeft(tenant)).toBe(0);
  });

  it("with an odd gid under standard_conforming_strings = off", async () => {
    const lease = await openLease(tenant);
    try {
      expect((await onLease(tenant, lease, "SET standard_conforming_strings = off")).status).toBe(200);
      expect((await onLease(tenant, lease, "BEGIN")).status).toBe(200);
      expect((await onLease(tenant, lease, "INSERT INTO public.marks VALUES ('odd')")).status).toBe(200);
      // Under these settings '\\' is one backslash: the gid holds a quote, a backslash and a
      // dollar-quote tag, which no literal written for standard strings names.
      const prepared = await onLease(tenant, lease, "PREPARE TRANSACTION 'it''s \\\\ $lessor$ odd'");
      expect(prepared.body.code).toBe("prepared_transaction_refused");
    } finally {
      await closeLease(tenant, lease);
    }
    expect(await preparedLeft(tenant)).toBe(0);
  });

  it("behind a view that shadows pg_prepared_xacts, on a hostile search_path", async () => {
    await asTenantOk(
      tenant,
      `CREATE VIEW public.pg_prepared_xacts AS SELECT NULL::xid AS transaction, NULL::text AS gid,
         NULL::timestamptz AS prepared, NULL::name AS owner, NULL::name AS database WHERE false`,
    );
    const lease = await openLease(tenant);
    try {
      expect((await onLease(tenant, lease, "SET search_path = public, pg_catalog")).status).toBe(200);
      expect((await onLease(tenant, lease, "BEGIN")).status).toBe(200);
      expect((await onLease(tenant, lease, "INSERT INTO public.marks VALUES ('shadowed')")).status).toBe(200);
      const prepared = await onLease(tenant, lease, "PREPARE TRANSACTION 'shadowed'");
      expect(prepared.body.code).toBe("prepared_transaction_refused");
    } finally {
      await closeLease(tenant, lease);
    }
    expect(await preparedLeft(tenant)).toBe(0);
    expect(await asTenantOk(tenant, "SELECT count(*) FROM public.marks")).toEqual([["0"]]);
  });

  it("prepared under another role (an end user's statements run as the configured role)", async () => {
    const { publicKey, privateKey } = await generateKeyPair("ES256", { extractable: true });
    const jwk = { ...(await exportJWK(publicKey)), kid: "k", alg: "ES256", use: "sig" };
    const configured = await admin(`/v1/tenants/${tenant.id}/jwt`, {
      method: "PUT",
      json: { issuer: "https://idp.lp.test/", audience: "lp", jwks: { keys: [jwk] }, algorithms: ["ES256"] },
    });
    expect(configured.status).toBe(200);
    await asTenantOk(tenant, "GRANT INSERT ON public.marks TO authenticated");
    const token = await new SignJWT({})
      .setProtectedHeader({ alg: "ES256", kid: "k" })
      .setIssuer("https://idp.lp.test/")
      .setAudience("lp")
      .setSubject("end-user")
      .setExpirationTime("5m")
      .sign(privateKey);
    const response = await sqlRequest(
      tenant.connectionString,
      {
        queries: [
          { query: "INSERT INTO public.marks VALUES ('as end user')", params: [] },
          { query: "PREPARE TRANSACTION 'as-authenticated'", params: [] },
        ],
      },
      { Authorization: `Bearer ${token}` },
    );
    expect(((await response.json()) as { code?: string }).code).toBe("prepared_transaction_refused");
    expect(await preparedLeft(tenant)).toBe(0);
  });

  it("left by a connection that died before Lessor's rollback: the host-hygiene pass rolls it back", async () => {
    await asTenantRoleDirectly(tenant, async (client) => {
      await client.query("BEGIN");
      await client.query("INSERT INTO public.marks VALUES ('left')");
      await client.query("PREPARE TRANSACTION 'left-behind'");
    });
    expect(await preparedLeft(tenant)).toBe(1);
    const config = loadConfig(env);
    const host = config.hosts.get(hostName);
    if (!host) throw new Error("no local host");
    const pass = await hostHygiene(env, config, host, 0);
    expect(pass.preparedRolledBack).toBe(1);
    expect(await preparedLeft(tenant)).toBe(0);
  });
});

describe("erase", () => {
  it("finishes whatever a tenant that owned its database set on it", async () => {
    const tenant = await createTenant(uniqueTenantId("lp-erase"));
    await makeLegacy(tenant);
    await asTenantOk(tenant, "ALTER ROLE CURRENT_USER SET default_transaction_read_only = on");
    await asTenantRoleDirectly(tenant, async (client) => {
      await client.query("BEGIN");
      await client.query("CREATE TABLE public.held (a int)");
      await client.query("PREPARE TRANSACTION 'holds-the-database'");
    });
    for (const statement of [
      `ALTER DATABASE "${tenant.database}" SET search_path = public, pg_catalog`,
      `ALTER DATABASE "${tenant.database}" SET default_transaction_read_only = on`,
      `ALTER DATABASE "${tenant.database}" SET statement_timeout = 1`,
      `ALTER DATABASE "${tenant.database}" WITH IS_TEMPLATE true`,
      `ALTER DATABASE "${tenant.database}" CONNECTION LIMIT 0`,
    ]) {
      await asTenantOk(tenant, statement);
    }
    // An owner closes its database from another one (a session cannot close the one it is in).
    await asSuperuser((client) =>
      client.query(`ALTER DATABASE "${tenant.database}" WITH ALLOW_CONNECTIONS false`),
    );
    const started = await admin(`/v1/tenants/${tenant.id}?confirm=${tenant.id}`, { method: "DELETE" });
    expect(started.status).toBe(202);
    const status = await pollUntil(
      async () =>
        (await admin(`/v1/tenants/${tenant.id}/erase`)).json<{ state: string; lastError?: string }>(),
      (s) => s.state === "erased",
      { attempts: 120, intervalMs: 500 },
    );
    expect(status).toMatchObject({ state: "erased" });
    expect(
      await superuserValue("SELECT count(*)::int FROM pg_database WHERE datname = $1", [tenant.database]),
    ).toBe(0);
    expect(
      await superuserValue("SELECT count(*)::int FROM pg_roles WHERE rolname IN ($1, $2)", [
        tenant.role,
        `${tenant.role}_jwt`,
      ]),
    ).toBe(0);
  });
});

describe("end users", () => {
  const issuer = "https://idp.lp-users.test/";
  const audience = "lp-users";
  let tenant: CreatedTenant;
  let sign: (sub: string) => Promise<string>;

  beforeAll(async () => {
    tenant = await createTenant(uniqueTenantId("lp-users"));
    const { publicKey, privateKey } = await generateKeyPair("ES256", { extractable: true });
    const jwk = { ...(await exportJWK(publicKey)), kid: "u", alg: "ES256", use: "sig" };
    const configured = await admin(`/v1/tenants/${tenant.id}/jwt`, {
      method: "PUT",
      json: { issuer, audience, jwks: { keys: [jwk] }, algorithms: ["ES256"] },
    });
    expect(configured.status).toBe(200);
    sign = (sub) =>
      new SignJWT({})
        .setProtectedHeader({ alg: "ES256", kid: "u" })
        .setIssuer(issuer)
        .setAudience(audience)
        .setSubject(sub)
        .setExpirationTime("10m")
        .sign(privateKey);
  });

  async function asEndUser(token: string, query: string): Promise<Answer> {
    const response = await sqlRequest(
      tenant.connectionString,
      { query, params: [] },
      { Authorization: `Bearer ${token}` },
    );
    return { status: response.status, body: await response.json() };
  }

  it("keep working, as themselves, through two rotations under load", async () => {
    const users = Array.from({ length: 16 }, (_, i) => `user-${i}`);
    const tokens = await Promise.all(users.map(sign));
    let stop = false;
    const answers: { user: string; status: number; who: unknown; generation: string; code?: string }[] = [];
    const load = mapConcurrent(users, users.length, async (user, i) => {
      const token = tokens[i] ?? "";
      while (!stop) {
        const answer = await asEndUser(
          token,
          "SELECT auth.user_id() AS who, pg_catalog.current_setting('application_name') AS app, pg_catalog.pg_sleep(0.02)",
        );
        const row = answer.body.rows?.[0];
        answers.push({
          user,
          status: answer.status,
          who: row?.[0],
          generation:
            String(row?.[1] ?? "")
              .split(":")
              .at(-1) ?? "",
          ...(answer.body.code ? { code: answer.body.code } : {}),
        });
      }
    });
    const until = (n: number) =>
      pollUntil(
        () => Promise.resolve(answers.length),
        (seen) => seen >= n,
        { attempts: 400, intervalMs: 50 },
      );
    await until(32);
    for (let rotation = 0; rotation < 2; rotation++) {
      const rotated = await admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" });
      expect(rotated.status).toBe(202);
      await until(answers.length + 64);
    }
    stop = true;
    await load;
    const failures = answers.filter((a) => a.status !== 200);
    expect(failures).toEqual([]);
    expect(answers.filter((a) => a.who !== a.user)).toEqual([]);
    // The load spanned the switches: end users were served by three generations.
    expect(new Set(answers.map((a) => a.generation)).size).toBeGreaterThanOrEqual(3);
  });

  it("repair their login role whole: password, settings and CONNECT", async () => {
    const token = await sign("repairer");
    const login = `${tenant.role}_jwt`;
    expect((await asEndUser(token, "SELECT auth.user_id()")).status).toBe(200);
    // The login role drifts: settings and a password someone set, its CONNECT gone.
    await asSuperuser(async (client) => {
      await client.query(`ALTER ROLE "${login}" SET search_path = nowhere`);
      await client.query(`ALTER ROLE "${login}" PASSWORD 'changed-by-someone-else'`);
      await client.query(`REVOKE CONNECT ON DATABASE "${tenant.database}" FROM "${login}"`);
    });
    await crash(tenant.id);
    const answer = await asEndUser(token, "SELECT auth.user_id()");
    expect(answer, JSON.stringify(answer.body)).toMatchObject({ status: 200 });
    expect(answer.body.rows).toEqual([["repairer"]]);
    expect(
      await superuserValue(
        "SELECT count(*)::int FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole WHERE r.rolname = $1",
        [login],
      ),
    ).toBe(0);
    expect(
      await superuserValue("SELECT has_database_privilege($1, $2, 'CONNECT')", [login, tenant.database]),
    ).toBe(true);
  });
});

describe("checks fail closed", () => {
  it("a statement cut while no maintenance slot is free is terminated once one is, not forgotten", async () => {
    const tenant = await createTenant(uniqueTenantId("lp-cut"), { host: "small" });
    await asTenantOk(tenant, "SELECT 1");
    const budget = env.BUDGETS.getByName("small");
    const held: string[] = [];
    for (;;) {
      const grant = await budget.acquireMaintenance("small", {
        purpose: "test-hold",
        tenantId: null,
        holdMs: 60_000,
        waitMs: 0,
      });
      if (!grant.granted) break;
      held.push(grant.leaseId);
    }
    expect(held.length).toBeGreaterThan(0);
    const lines: string[] = [];
    const restore = setLogSink((_level, line) => lines.push(line));
    try {
      const stubborn = await asTenant(
        tenant,
        `DO $d$ BEGIN
           LOOP
             BEGIN PERFORM pg_catalog.pg_sleep(30); EXCEPTION WHEN query_canceled THEN NULL; END;
           END LOOP;
         END $d$`,
      );
      expect(stubborn.status).not.toBe(200);
      // The cut happened and its terminate found the reserve full: asked again, not given up.
      const retried = await pollUntil(
        () => Promise.resolve(lines.filter((l) => l.includes('"statement_terminate_retry"')).length),
        (n) => n >= 1,
        { attempts: 40, intervalMs: 100 },
      );
      expect(retried).toBeGreaterThanOrEqual(1);
      expect(lines.some((l) => l.includes('"statement_terminated"'))).toBe(false);
      for (const leaseId of held.splice(0)) await budget.releaseMaintenance("small", leaseId);
      const settled = await pollUntil(
        () => Promise.resolve(lines.find((l) => l.includes('"statement_terminated"'))),
        (line) => line !== undefined,
        { attempts: 60, intervalMs: 250 },
      );
      expect(JSON.parse(settled ?? "{}")).toMatchObject({ event: "statement_terminated" });
      expect(Number((JSON.parse(settled ?? "{}") as { attempts?: number }).attempts)).toBeGreaterThanOrEqual(
        2,
      );
    } finally {
      restore();
      for (const leaseId of held) await budget.releaseMaintenance("small", leaseId);
    }
  });

  it("a refusal before the key was checked records no app schema version", async () => {
    const tenant = await createTenant(uniqueTenantId("lp-appver"));
    await asTenantOk(tenant, "SELECT 1");
    const started = await admin(`/v1/tenants/${tenant.id}?confirm=${tenant.id}`, { method: "DELETE" });
    expect(started.status).toBe(202);
    const version = tenantMigrations.length;
    const refused = await sqlRequest(
      tenant.connectionString,
      { query: "SELECT 1", params: [] },
      { "Lessor-Schema-Version": String(version) },
    );
    expect([503, 410]).toContain(refused.status);
    expect(appSchemaVersionReported(tenant.id, version)).toBe(false);
  });
});
