/**
 * Issue 24: Lessor's privileged connections never run what a tenant planted.
 *
 * A hostile tenant, with only `/sql`, plants a shadow in `public` for every catalog relation,
 * function, aggregate, type and operator that Lessor's own SQL names (the list is read from src/ at
 * test time: lessor-sql-names.ts), each of which logs `current_user` to the server log when it runs;
 * then it sets hostile role-level settings, and the database gets hostile database-level ones
 * (`search_path = public, pg_catalog`, `standard_conforming_strings = off`,
 * `default_transaction_read_only = on`). Every privileged operation then runs: start, the fence of
 * a restarted object, repair after a self-set password, rotation, JWT setup and end-user requests,
 * migration, the admin fence at the role's connection limit, reconcile, the watchdog's cut, a
 * second tenant's provisioning, the host-hygiene pass taking over a database the tenant owned, erase.
 *
 * Each must still succeed, and no trap may fire at all but the test's own positive control: not as
 * the admin role (a privilege escalation), and not as the tenant's roles either (Lessor's own
 * statements on tenant connections name everything with its schema, so a tenant cannot make them
 * lie about prepared transactions or fences).
 */
import { env, runInDurableObject } from "cloudflare:test";
import { exportJWK, generateKeyPair, SignJWT } from "jose";
import { beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import { unseal } from "../../src/crypto/seal.ts";
import { withTenantConnection } from "../../src/postgres/index.ts";
import { sessionLimits, tenantCredential } from "../../src/tenant-db/connect.ts";
import { hostHygiene } from "../../src/tenant-db/hygiene.ts";
import { reapOrphanBackends } from "../../src/tenant-db/orphans.ts";
import { tenantMigrations } from "../fixtures/tenant-schema/migrations.gen.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";
import { lessorSqlNames } from "./lessor-sql-names.ts";
import { serverLogLinesSoFar } from "./server-log.ts";

/** This run's mark in every trap's log line, so other files' lines never mix in. */
const run = crypto.randomUUID().slice(0, 8);
const positiveControl = "positive control";

/** The trap: a log line with who ran it. Created first, named with its schema everywhere. */
const trapFunction = `
CREATE FUNCTION public.lessor_trap_fired(label pg_catalog.text) RETURNS pg_catalog.bool
  LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
BEGIN
  RAISE LOG 'lessor_trap run=${run} fired=[%] current_user=% session_user=%', label, current_user, session_user;
  RETURN true;
END $f$`;

/**
 * Plants shadows of the pg_catalog functions and aggregates named in `names`, with the same
 * argument types: what the tenant cannot create (internal types, "any") it cannot plant either.
 */
const plantFunctions = `
CREATE FUNCTION public.lessor_plant_functions(names pg_catalog.text[])
  RETURNS TABLE(planted pg_catalog.int4, refused pg_catalog.int4)
  LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
DECLARE p record; n int4 := 0; r int4 := 0; args text; stype text;
BEGIN
  FOR p IN SELECT pr.oid, pr.proname, pr.prokind, pr.proretset, pr.prorettype,
                  pg_get_function_identity_arguments(pr.oid) AS identity,
                  pg_get_function_result(pr.oid) AS result
             FROM pg_proc pr
            WHERE pr.pronamespace = 'pg_catalog'::regnamespace AND pr.proname = ANY(names)
              AND pr.prokind IN ('f', 'a')
  LOOP
    BEGIN
      IF p.prokind = 'f' THEN
        EXECUTE format('CREATE FUNCTION public.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
          p.proname, p.identity, p.result,
          format('BEGIN PERFORM public.lessor_trap_fired(%L); %s END', 'function ' || p.proname,
                 CASE WHEN p.proretset OR p.prorettype = 'void'::regtype THEN 'RETURN;' ELSE 'RETURN NULL;' END));
      ELSE
        stype := format_type(p.prorettype, NULL);
        args := CASE WHEN p.identity = '' THEN '' ELSE ', ' || p.identity END;
        EXECUTE format('CREATE FUNCTION public.lessor_trap_sfunc_%s(state %s%s) RETURNS %s LANGUAGE plpgsql AS %L',
          p.oid, stype, args, stype, 'BEGIN RETURN state; END');
        EXECUTE format('CREATE FUNCTION public.lessor_trap_final_%s(state %s) RETURNS %s LANGUAGE plpgsql AS %L',
          p.oid, stype, stype,
          format('BEGIN PERFORM public.lessor_trap_fired(%L); RETURN NULL; END', 'aggregate ' || p.proname));
        EXECUTE format('CREATE AGGREGATE public.%I(%s) (SFUNC = public.lessor_trap_sfunc_%s, STYPE = %s, FINALFUNC = public.lessor_trap_final_%s)',
          p.proname, CASE WHEN p.identity = '' THEN '*' ELSE p.identity END, p.oid, stype, p.oid);
      END IF;
      n := n + 1;
    EXCEPTION WHEN OTHERS THEN
      r := r + 1;
    END;
  END LOOP;
  RETURN QUERY SELECT n, r;
END $f$`;

/** Plants a view for every pg_catalog relation named in `names`: same columns, a trap when read. */
const plantRelations = `
CREATE FUNCTION public.lessor_plant_relations(names pg_catalog.text[])
  RETURNS TABLE(planted pg_catalog.int4, refused pg_catalog.int4)
  LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
DECLARE c record; n int4 := 0; r int4 := 0; cols text;
BEGIN
  FOR c IN SELECT cl.oid, cl.relname FROM pg_class cl
            WHERE cl.relnamespace = 'pg_catalog'::regnamespace AND cl.relname = ANY(names)
              AND cl.relkind IN ('r', 'v', 'm', 'p', 'f')
  LOOP
    BEGIN
      SELECT string_agg(format('NULL::%s AS %I', format_type(a.atttypid, a.atttypmod), a.attname), ', ' ORDER BY a.attnum)
        INTO cols FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped;
      EXECUTE format('CREATE VIEW public.%I AS SELECT %s WHERE (SELECT public.lessor_trap_fired(%L))',
        c.relname, cols, 'relation ' || c.relname);
      n := n + 1;
    EXCEPTION WHEN OTHERS THEN
      r := r + 1;
    END;
  END LOOP;
  RETURN QUERY SELECT n, r;
END $f$`;

/** Plants a domain for every pg_catalog base type named in `names`, whose check is a trap. */
const plantTypes = `
CREATE FUNCTION public.lessor_plant_types(names pg_catalog.text[])
  RETURNS TABLE(planted pg_catalog.int4, refused pg_catalog.int4)
  LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
DECLARE t record; n int4 := 0; r int4 := 0;
BEGIN
  FOR t IN SELECT ty.typname FROM pg_type ty
            WHERE ty.typnamespace = 'pg_catalog'::regnamespace AND ty.typname = ANY(names) AND ty.typtype = 'b'
  LOOP
    BEGIN
      EXECUTE format('CREATE DOMAIN public.%I AS pg_catalog.%I CHECK (public.lessor_trap_fired(%L) OR VALUE IS NULL)',
        t.typname, t.typname, 'type ' || t.typname);
      n := n + 1;
    EXCEPTION WHEN OTHERS THEN
      r := r + 1;
    END;
  END LOOP;
  RETURN QUERY SELECT n, r;
END $f$`;

/** Plants an operator for every pg_catalog operator whose name is in `ops`, same argument types. */
const plantOperators = `
CREATE FUNCTION public.lessor_plant_operators(ops pg_catalog.text[])
  RETURNS TABLE(planted pg_catalog.int4, refused pg_catalog.int4)
  LANGUAGE plpgsql SET search_path = pg_catalog AS $f$
DECLARE o record; n int4 := 0; r int4 := 0; fn text;
BEGIN
  FOR o IN SELECT op.oid, op.oprname, op.oprleft, op.oprright, op.oprresult FROM pg_operator op
            WHERE op.oprnamespace = 'pg_catalog'::regnamespace AND op.oprname = ANY(ops)
  LOOP
    BEGIN
      fn := 'lessor_trap_op_' || o.oid;
      IF o.oprleft = 0 THEN
        EXECUTE format('CREATE FUNCTION public.%I(r %s) RETURNS %s LANGUAGE plpgsql AS %L', fn,
          format_type(o.oprright, NULL), format_type(o.oprresult, NULL),
          format('BEGIN PERFORM public.lessor_trap_fired(%L); RETURN NULL; END', 'operator ' || o.oprname));
        EXECUTE format('CREATE OPERATOR public.%s (RIGHTARG = %s, FUNCTION = public.%I)', o.oprname,
          format_type(o.oprright, NULL), fn);
      ELSE
        EXECUTE format('CREATE FUNCTION public.%I(l %s, r %s) RETURNS %s LANGUAGE plpgsql AS %L', fn,
          format_type(o.oprleft, NULL), format_type(o.oprright, NULL), format_type(o.oprresult, NULL),
          format('BEGIN PERFORM public.lessor_trap_fired(%L); RETURN NULL; END', 'operator ' || o.oprname));
        EXECUTE format('CREATE OPERATOR public.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = public.%I)', o.oprname,
          format_type(o.oprleft, NULL), format_type(o.oprright, NULL), fn);
      END IF;
      n := n + 1;
    EXCEPTION WHEN OTHERS THEN
      r := r + 1;
    END;
  END LOOP;
  RETURN QUERY SELECT n, r;
END $f$`;

interface SqlAnswer {
  status: number;
  body: { rows?: unknown[][]; code?: string; message?: string };
}

/** One statement on `/sql` as the tenant (raw text, array mode). */
async function asTenant(tenant: CreatedTenant, query: string, params: unknown[] = []): Promise<SqlAnswer> {
  const response = await sqlRequest(tenant.connectionString, { query, params });
  return { status: response.status, body: await response.json() };
}

async function asTenantOk(
  tenant: CreatedTenant,
  query: string,
  params: unknown[] = [],
): Promise<unknown[][]> {
  const answer = await asTenant(tenant, query, params);
  expect(answer, `${query.slice(0, 80)}: ${JSON.stringify(answer.body)}`).toMatchObject({ status: 200 });
  return answer.body.rows ?? [];
}

interface TrapFiring {
  label: string;
  currentUser: string;
  sessionUser: string;
}

/** Every trap of this run that fired, from the server's own log. */
async function trapFirings(): Promise<TrapFiring[]> {
  const lines = await serverLogLinesSoFar(`lessor_trap run=${run}`);
  return lines.flatMap((line) => {
    const match = /fired=\[(.*?)\] current_user=(\S+) session_user=(\S+)/.exec(line);
    return match ? [{ label: match[1] ?? "", currentUser: match[2] ?? "", sessionUser: match[3] ?? "" }] : [];
  });
}

/** No trap fired but the positive control (which fired exactly `controls` times, as the tenant). */
async function expectNoTrapFired(after: string, tenant: CreatedTenant, controls = 1): Promise<void> {
  const firings = await trapFirings();
  const others = firings.filter((f) => f.label !== positiveControl);
  expect(others, `traps fired during: ${after}`).toEqual([]);
  const control = firings.filter((f) => f.label === positiveControl);
  expect(control.length).toBe(controls);
  for (const f of control) expect(f.currentUser).toBe(tenant.role);
}

const hostileSettings = [
  "search_path = public, pg_catalog",
  "standard_conforming_strings = off",
  "default_transaction_read_only = on",
];

/** The hostile settings, database-wide (as a database owner would set them). */
async function plantDatabaseSettings(tenant: CreatedTenant): Promise<void> {
  await asSuperuser(async (client) => {
    for (const setting of hostileSettings)
      await client.query(`ALTER DATABASE "${tenant.database}" SET ${setting}`);
  });
}

/** Resets the tenant's object at once, as a crash or a deploy does. */
async function crash(id: string): Promise<void> {
  const outcome = await runInDurableObject(env.TENANTS.getByName(id), (_instance, state) => {
    state.abort("test: object reset");
  }).then(
    () => "not reset",
    (error: unknown) => String(error),
  );
  expect(outcome).toMatch(/object reset/);
}

async function sealedPassword(id: string): Promise<string> {
  const sealed = await asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT sealed_password FROM tenant_credentials WHERE tenant_id = $1",
      [id],
    );
    return String(rows[0]?.sealed_password);
  }, "lessor");
  return unseal(env.LESSOR_SEAL_KEY, id, sealed);
}

/** The role's stored password (a SCRAM verifier), as the superuser sees it. */
function rolePassword(role: string): Promise<string> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT rolpassword FROM pg_authid WHERE rolname = $1", [role]);
    return String(rows[0]?.rolpassword);
  });
}

const issuer = "https://idp.traps.test/";
const audience = "lessor-traps";

describe("a tenant that booby-trapped its database", () => {
  let tenant: CreatedTenant;
  let controls = 0;

  /** The positive control: the trap mechanism works and is read back, as the tenant. */
  async function control(): Promise<void> {
    await asTenantOk(tenant, "SELECT public.lessor_trap_fired($1)", [positiveControl]);
    controls++;
  }

  beforeAll(async () => {
    tenant = await createTenant(uniqueTenantId("trap"));
    const names = lessorSqlNames();
    // The scan found Lessor's SQL: the names every privileged path is known to use are in it.
    expect(names.statements).toBeGreaterThan(50);
    expect(names.identifiers).toEqual(
      expect.arrayContaining([
        "pg_prepared_xacts",
        "pg_stat_activity",
        "pg_terminate_backend",
        "pg_event_trigger",
        "pg_roles",
        "pg_database",
        "set_config",
        "pg_advisory_unlock_all",
        "pg_advisory_lock",
        "current_setting",
      ]),
    );
    expect(names.operators).toEqual(expect.arrayContaining(["=", "<>"]));
    expect(names.types).toEqual(expect.arrayContaining(["text"]));

    for (const statement of [trapFunction, plantFunctions, plantRelations, plantTypes, plantOperators]) {
      await asTenantOk(tenant, statement);
    }
    const planted: Record<string, unknown[][]> = {};
    planted.functions = await asTenantOk(tenant, "SELECT * FROM public.lessor_plant_functions($1)", [
      names.identifiers,
    ]);
    planted.relations = await asTenantOk(tenant, "SELECT * FROM public.lessor_plant_relations($1)", [
      names.identifiers,
    ]);
    planted.operators = await asTenantOk(tenant, "SELECT * FROM public.lessor_plant_operators($1)", [
      names.operators,
    ]);
    // Types last: a domain named `text` in public changes what the tenant's own later statements mean.
    planted.types = await asTenantOk(tenant, "SELECT * FROM public.lessor_plant_types($1)", [names.types]);
    // Each kind planted something (so the traps are really there to be tripped).
    for (const [kind, rows] of Object.entries(planted)) {
      expect(Number(rows[0]?.[0]), `${kind} planted`).toBeGreaterThan(0);
    }
    // Hostile settings: the role's own (the tenant may set them), and the database's (set here as
    // a database owner would; a tenant that owned its database could).
    for (const setting of hostileSettings) await asTenantOk(tenant, `ALTER ROLE CURRENT_USER SET ${setting}`);
    await plantDatabaseSettings(tenant);
    await control();
    await expectNoTrapFired("planting", tenant, controls);
  }, 120_000);

  it("starts, and fences the dead generation after a restart", async () => {
    try {
      await crash(tenant.id);
      await asTenantOk(tenant, "SELECT 1");
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("a start after a restart (with its fence)", tenant, controls);
    }
  });

  it("repairs a password the tenant set for itself", async () => {
    try {
      await asTenantOk(tenant, "ALTER ROLE CURRENT_USER PASSWORD 'chosen-by-the-tenant'");
      const chosen = await rolePassword(tenant.role);
      await crash(tenant.id);
      await asTenantOk(tenant, "SELECT 1");
      // The start met 28P01 and set the role's password back through the admin role.
      expect(await rolePassword(tenant.role)).not.toBe(chosen);
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("a repair", tenant, controls);
    }
  });

  it("rotates its credential", async () => {
    try {
      const rotated = await admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" });
      expect({ status: rotated.status, body: await rotated.text() }).toMatchObject({ status: 202 });
      await asTenantOk(tenant, "SELECT 1");
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("a rotation", tenant, controls);
    }
  });

  it("sets up JWT mode and serves an end user", async () => {
    try {
      const { publicKey, privateKey } = await generateKeyPair("ES256", { extractable: true });
      const jwk = { ...(await exportJWK(publicKey)), kid: "k1", alg: "ES256", use: "sig" };
      const configured = await admin(`/v1/tenants/${tenant.id}/jwt`, {
        method: "PUT",
        json: { issuer, audience, jwks: { keys: [jwk] }, algorithms: ["ES256"] },
      });
      expect(configured.status).toBe(200);
      const token = await new SignJWT({})
        .setProtectedHeader({ alg: "ES256", kid: "k1" })
        .setIssuer(issuer)
        .setAudience(audience)
        .setSubject("user-1")
        .setExpirationTime("5m")
        .sign(privateKey);
      const response = await sqlRequest(
        tenant.connectionString,
        { query: "SELECT auth.user_id()", params: [] },
        { Authorization: `Bearer ${token}` },
      );
      expect(response.status).toBe(200);
      expect((await response.json<{ rows: unknown[][] }>()).rows).toEqual([["user-1"]]);
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("JWT setup and an end-user request", tenant, controls);
    }
  });

  it("migrates its database", async () => {
    try {
      // Undo the last bundled step as the tenant, so the migration has a step to apply.
      const last = tenantMigrations.length;
      await asTenantOk(tenant, 'ALTER TABLE public."notes" DROP CONSTRAINT "notes_slug_unique"');
      await asTenantOk(
        tenant,
        "DELETE FROM lessor.schema_migrations WHERE version OPERATOR(pg_catalog.=) $1::pg_catalog.int4",
        [last],
      );
      const outcome = await env.TENANTS.getByName(tenant.id).migrate(tenant.id, last, 5_000);
      expect(outcome).toMatchObject({ outcome: "migrated", toVersion: last, applied: [last] });
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("a migration", tenant, controls);
    }
  });

  it("fences the role's backends through the admin role at its connection limit", async () => {
    try {
      // Backends the object does not know hold every connection the role may have (what a killed
      // object's generation leaves when the host never saw its sockets close).
      const config = loadConfig(env);
      const credential = await tenantCredential(
        config,
        { host: "local", roleName: tenant.role, databaseName: tenant.database },
        await sealedPassword(tenant.id),
      );
      const limit = await asSuperuser(async (client) => {
        const { rows } = await client.query("SELECT rolconnlimit FROM pg_roles WHERE rolname = $1", [
          tenant.role,
        ]);
        return Number(rows[0]?.rolconnlimit);
      });
      await crash(tenant.id);
      await pollUntil(
        () =>
          asSuperuser(async (client) => {
            const { rows } = await client.query(
              "SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1",
              [tenant.role],
            );
            return Number(rows[0]?.n);
          }),
        (n) => n === 0,
      );
      const release: (() => void)[] = [];
      const held = Array.from({ length: limit }, (_, i) =>
        withTenantConnection(
          config,
          credential.target,
          {
            applicationName: `lessor:${tenant.role}:9${i}`,
            limits: sessionLimits(config),
            loginToken: credential.loginToken,
          },
          async (client) => {
            await client.query("SELECT 1");
            await new Promise<void>((resolve) => release.push(resolve));
          },
        ).catch(() => undefined),
      );
      try {
        await pollUntil(
          () => Promise.resolve(release.length),
          (n) => n === limit,
        );
        await asTenantOk(tenant, "SELECT 1");
        // The start met the limit and ended them through the admin role.
        const left = await asSuperuser(async (client) => {
          const { rows } = await client.query(
            "SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND application_name LIKE $2",
            [tenant.role, `lessor:${tenant.role}:9_`],
          );
          return Number(rows[0]?.n);
        });
        expect(left).toBe(0);
      } finally {
        for (const go of release) go();
        await Promise.all(held);
      }
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("the admin fence", tenant, controls);
    }
  });

  it("reconciles the host (orphan backends)", async () => {
    try {
      const config = loadConfig(env);
      const host = config.hosts.get("local");
      if (!host) throw new Error("no local host");
      await reapOrphanBackends(env, config, host, 0);
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("a reconcile", tenant, controls);
    }
  });

  it("cuts a statement that will not stop, and terminates its backend", async () => {
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
      await asTenantOk(tenant, "SELECT 1");
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("the watchdog's cut", tenant, controls);
    }
  });

  it("provisions another tenant on the same host", async () => {
    try {
      const other = await createTenant(uniqueTenantId("trap-next"));
      await asTenantOk(other, "SELECT 1");
      await control();
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("another tenant's provisioning", tenant, controls);
    }
  });

  it("takes its database over from it (a tenant that owned it, before issue 24)", async () => {
    try {
      await asSuperuser(async (client) => {
        await client.query(`ALTER DATABASE "${tenant.database}" OWNER TO "${tenant.role}"`);
        await client.query(`REVOKE CREATE ON DATABASE "${tenant.database}" FROM "${tenant.role}"`);
      });
      const config = loadConfig(env);
      const host = config.hosts.get("local");
      if (!host) throw new Error("no local host");
      const pass = await hostHygiene(env, config, host);
      expect(pass.moved).toBeGreaterThanOrEqual(1);
      expect(pass.failed).toBe(0);
      await asTenantOk(tenant, "SELECT 1");
    } finally {
      await expectNoTrapFired("the host-hygiene pass", tenant, controls);
      // The database-wide traps again, for the erase (the pass cleared them).
      await plantDatabaseSettings(tenant);
    }
  });

  it("erases it", async () => {
    try {
      const started = await admin(`/v1/tenants/${tenant.id}?confirm=${tenant.id}`, { method: "DELETE" });
      expect(started.status).toBe(202);
      const state = await pollUntil(
        async () => (await (await admin(`/v1/tenants/${tenant.id}/erase`)).json<{ state: string }>()).state,
        (s) => s === "erased",
        { attempts: 120, intervalMs: 500 },
      );
      expect(state).toBe("erased");
      const left = await asSuperuser(async (client) => {
        const { rows } = await client.query("SELECT count(*)::int AS n FROM pg_database WHERE datname = $1", [
          tenant.database,
        ]);
        return Number(rows[0]?.n);
      });
      expect(left).toBe(0);
    } finally {
      // The traps first: on failure, what fired is the headline, not what broke after it.
      await expectNoTrapFired("the erase", tenant, controls);
    }
  });
});
