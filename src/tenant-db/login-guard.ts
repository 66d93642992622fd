/**
 * The login guard installed in every tenant database (docs/adr/007-tenant-containment.md): a
 * `login` event trigger (Postgres 17+) that refuses a login of any role outside the guard's owner
 * (the host's admin role and its members) unless the connection carries a valid one-time token
 * (src/crypto/login-guard.ts) in `lessor.login`.
 *
 * Everything lives in the schema `lessor_guard`, owned by the admin role, with no privilege for
 * anyone else: the tenant can neither read the key, nor drop or replace the function, nor disable
 * the trigger (`event_triggers` is superuser-only). The functions run in sessions whose settings
 * the caller chose (a direct login attempt picks its own startup options), so each pins what its
 * body depends on: `search_path` (pg_catalog, pg_temp last) and `standard_conforming_strings`.
 *
 * The trigger is created the way the host allows (src/core/host-capabilities.ts): directly (Neon,
 * RDS, Cloud SQL), or through the provider function a self-hosted host's setup installs.
 */
import type { EventTriggerPath } from "../core/host-capabilities.ts";
import { toHex } from "../crypto/encoding.ts";
import { LessorError } from "../errors/index.ts";
import type { Queryable } from "../postgres/queryable.ts";
import { quoteLiteral } from "./host-admin.ts";

/** HMAC-SHA256 in PL/pgSQL over the built-in `sha256()`, so no extension is needed. */
const hmacFunction = `
CREATE OR REPLACE FUNCTION lessor_guard.hmac_sha256(key bytea, message bytea) RETURNS bytea
  LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on AS $$
DECLARE
  k bytea := key;
  inner_pad bytea;
  outer_pad bytea;
BEGIN
  IF pg_catalog.length(k) OPERATOR(pg_catalog.>) 64 THEN k := pg_catalog.sha256(k); END IF;
  k := k OPERATOR(pg_catalog.||) pg_catalog.decode(pg_catalog.repeat('00', 64 OPERATOR(pg_catalog.-) pg_catalog.length(k)), 'hex');
  inner_pad := k;
  outer_pad := k;
  FOR i IN 0..63 LOOP
    inner_pad := pg_catalog.set_byte(inner_pad, i, pg_catalog.get_byte(k, i) OPERATOR(pg_catalog.#) 54);
    outer_pad := pg_catalog.set_byte(outer_pad, i, pg_catalog.get_byte(k, i) OPERATOR(pg_catalog.#) 92);
  END LOOP;
  RETURN pg_catalog.sha256(outer_pad OPERATOR(pg_catalog.||) pg_catalog.sha256(inner_pad OPERATOR(pg_catalog.||) message));
END $$`;

const loginFunction = `
CREATE OR REPLACE FUNCTION lessor_guard.on_login() RETURNS event_trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on AS $$
DECLARE
  token text := COALESCE(pg_catalog.current_setting('lessor.login', true), '');
  parts text[];
  expires bigint;
  accepted boolean;
BEGIN
  -- The guard's owner (the admin role) and its members log in as usual.
  IF pg_catalog.pg_has_role(session_user, (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                                           WHERE n.nspname OPERATOR(pg_catalog.=) 'lessor_guard'), 'MEMBER') THEN
    RETURN;
  END IF;
  IF token OPERATOR(pg_catalog.!~) '^[0-9a-f]{32}\\.[0-9]{1,12}\\.[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'direct login refused' USING ERRCODE = '28000',
      HINT = 'Connect through Lessor.';
  END IF;
  parts := pg_catalog.string_to_array(token, '.');
  expires := parts[2]::pg_catalog.int8;
  IF expires OPERATOR(pg_catalog.<) EXTRACT(epoch FROM pg_catalog.now()) THEN
    RAISE EXCEPTION 'direct login refused' USING ERRCODE = '28000', DETAIL = 'The login token expired.';
  END IF;
  SELECT pg_catalog.bool_or(pg_catalog.encode(lessor_guard.hmac_sha256(g.key, pg_catalog.convert_to(
           pg_catalog.concat_ws('.', session_user, parts[1], parts[2]), 'UTF8')), 'hex') OPERATOR(pg_catalog.=) parts[3])
    INTO accepted FROM lessor_guard.keys g;
  IF accepted IS NOT TRUE THEN
    RAISE EXCEPTION 'direct login refused' USING ERRCODE = '28000';
  END IF;
  DELETE FROM lessor_guard.spent WHERE expires_at OPERATOR(pg_catalog.<) pg_catalog.now();
  INSERT INTO lessor_guard.spent (nonce, expires_at) VALUES (parts[1], pg_catalog.to_timestamp(expires))
    ON CONFLICT (nonce) DO NOTHING;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'direct login refused' USING ERRCODE = '28000', DETAIL = 'The login token was already used.';
  END IF;
END $$`;

/**
 * The schema Lessor keeps its own objects in, in a tenant database: created by the admin, or, if it
 * exists, owned by the admin. A schema of that name that the tenant made is refused, never used.
 */
export async function ensureOwnSchema(
  admin: Queryable,
  schema: string,
  grantUsageToPublic: boolean,
): Promise<void> {
  await admin.query(`CREATE SCHEMA IF NOT EXISTS ${schema}`);
  const { rows } = await admin.query(
    `SELECT pg_catalog.pg_has_role(n.nspowner, 'USAGE') AS ours FROM pg_catalog.pg_namespace n
      WHERE n.nspname OPERATOR(pg_catalog.=) $1::pg_catalog.text`,
    [schema],
  );
  if (rows[0]?.ours !== true) {
    throw new LessorError("tenant_database_conflict", {
      publicMessage: `The tenant's database has a schema named ${schema} that Lessor did not create; Lessor keeps its own objects there. The tenant must rename or drop it (ALTER SCHEMA ${schema} RENAME TO …), then send the request again.`,
    });
  }
  await admin.query(`REVOKE ALL ON SCHEMA ${schema} FROM PUBLIC`);
  if (grantUsageToPublic) await admin.query(`GRANT USAGE ON SCHEMA ${schema} TO PUBLIC`);
}

/** Statements that install (or bring up to date) the guard's tables and functions; idempotent. */
export const loginGuardStatements: readonly string[] = [
  "CREATE TABLE IF NOT EXISTS lessor_guard.keys (key_id pg_catalog.text PRIMARY KEY, key pg_catalog.bytea NOT NULL, added_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now())",
  "CREATE TABLE IF NOT EXISTS lessor_guard.spent (nonce pg_catalog.text PRIMARY KEY, expires_at pg_catalog.timestamptz NOT NULL)",
  "REVOKE ALL ON ALL TABLES IN SCHEMA lessor_guard FROM PUBLIC",
  hmacFunction,
  loginFunction,
  "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA lessor_guard FROM PUBLIC",
];

const guardTrigger = "lessor_login_guard";

/**
 * Whether the guard's trigger is there, enabled, and calls the guard's function. A trigger of that
 * name that is none of these (only a superuser could have made one) is not the guard.
 */
async function guardTriggerState(admin: Queryable): Promise<"ok" | "absent" | "wrong"> {
  const { rows } = await admin.query(
    `SELECT (t.evtfoid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure('lessor_guard.on_login()')
             AND t.evtevent OPERATOR(pg_catalog.=) 'login'
             AND t.evtenabled OPERATOR(pg_catalog.<>) 'D') AS ok
       FROM pg_catalog.pg_event_trigger t WHERE t.evtname OPERATOR(pg_catalog.=) $1::pg_catalog.text`,
    [guardTrigger],
  );
  if (rows.length === 0) return "absent";
  return rows[0]?.ok === true ? "ok" : "wrong";
}

/**
 * Installs the guard in the database `admin` is connected to, with `guardKey` as key `keyId`, and
 * creates its trigger by `path`. `path` "none" installs the key and functions but no trigger (a
 * host configured for reduced containment); the caller decided that was allowed.
 */
export async function installLoginGuard(
  admin: Queryable,
  keyId: string,
  guardKey: Uint8Array<ArrayBuffer>,
  path: EventTriggerPath,
): Promise<void> {
  await ensureOwnSchema(admin, "lessor_guard", false);
  for (const statement of loginGuardStatements) await admin.query(statement);
  await admin.query(
    `INSERT INTO lessor_guard.keys (key_id, key) VALUES ($1::pg_catalog.text, $2::pg_catalog.bytea)
       ON CONFLICT (key_id) DO UPDATE SET key = EXCLUDED.key`,
    [keyId, `\\x${toHex(guardKey)}`],
  );
  const state = await guardTriggerState(admin);
  if (state === "ok" || path === "none") return;
  if (state === "wrong") {
    throw new LessorError("host_unfit", {
      internal: `an event trigger named ${guardTrigger} exists but is not Lessor's enabled login guard`,
      retryAfterSeconds: 30,
    });
  }
  if (path === "direct") {
    await admin.query(
      `CREATE EVENT TRIGGER ${guardTrigger} ON login EXECUTE FUNCTION lessor_guard.on_login()`,
    );
  } else {
    await admin.query(
      `SELECT lessor_provider.create_event_trigger(${quoteLiteral(guardTrigger)}, 'login', 'lessor_guard.on_login()'::pg_catalog.regprocedure)`,
    );
  }
}
