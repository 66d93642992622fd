/**
 * End-user JWT mode in a tenant database (docs/adr/012-end-user-jwts.md), installed through the
 * host's admin role, idempotently:
 *
 * - `auth.session()`, `auth.jwt()`, `auth.user_id()` and `auth.uid()`, as Neon's pg_session_jwt
 *   defines them, reading the claims Lessor set for the transaction. `auth.session()` returns them
 *   only if their MAC (src/crypto/jwt-claims.ts) checks out against a key in
 *   `lessor_guard.claim_keys`, which no tenant role can read: claims a statement sets for itself
 *   read as none (`'null'`, so `auth.user_id()` is NULL).
 * - The end-user login role `<tenant role>_jwt`: LOGIN, no attribute, no privilege but CONNECT on
 *   its database, a member of the configured role with SET but not INHERIT. End-user statements
 *   run on its connections, so `RESET ROLE` or `SET ROLE <tenant role>` lead nowhere: the session
 *   user itself holds nothing, and it is no member of the tenant role.
 * - The configured role (e.g. `authenticated`): NOLOGIN, no attribute, marked as Lessor's with a
 *   comment only a role administrator can write. The tenant role is never made a member of it; it
 *   grants privileges and writes policies `TO authenticated` as it would for any role.
 */
import type { Queryable } from "../postgres/queryable.ts";
import { quoteIdent, quoteLiteral } from "./host-admin.ts";

/** The comment that marks a role as Lessor's end-user role (and so safe to grant to login roles). */
export const jwtRoleMarker = "lessor:jwt-role";

/** The schema, the key table and the functions; every statement idempotent. */
export const authFunctionStatements: readonly string[] = [
  "CREATE SCHEMA IF NOT EXISTS lessor_guard",
  "REVOKE ALL ON SCHEMA lessor_guard FROM PUBLIC",
  `CREATE TABLE IF NOT EXISTS lessor_guard.claim_keys (
     key_id text PRIMARY KEY, inner_pad bytea NOT NULL, outer_pad bytea NOT NULL,
     added_at timestamptz NOT NULL DEFAULT now())`,
  "REVOKE ALL ON lessor_guard.claim_keys FROM PUBLIC",
  "CREATE SCHEMA IF NOT EXISTS auth",
  "GRANT USAGE ON SCHEMA auth TO PUBLIC",
  // Claims, if Lessor signed them for this backend; else JSON null (pg_session_jwt's answer).
  // PARALLEL RESTRICTED: a parallel worker has another backend pid.
  `CREATE OR REPLACE FUNCTION auth.session() RETURNS jsonb
     LANGUAGE plpgsql STABLE PARALLEL RESTRICTED SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
   DECLARE
     claims text := current_setting('request.jwt.claims', true);
     mac text := current_setting('lessor.jwt_claims_mac', true);
     verified boolean;
     session jsonb;
   BEGIN
     IF claims IS NULL OR claims = '' OR mac IS NULL OR mac !~ '^[0-9a-f]{64}$' THEN
       RETURN 'null'::jsonb;
     END IF;
     SELECT bool_or(encode(sha256(k.outer_pad || sha256(k.inner_pad
              || convert_to(pg_backend_pid()::text || '.' || claims, 'UTF8'))), 'hex') = mac)
       INTO verified FROM lessor_guard.claim_keys k;
     IF verified IS NOT TRUE THEN
       RETURN 'null'::jsonb;
     END IF;
     session := claims::jsonb;
     -- Signed claims replayed long after their token expired are worth nothing either.
     IF jsonb_typeof(session -> 'exp') = 'number'
        AND (session ->> 'exp')::numeric + 300 < extract(epoch FROM now()) THEN
       RETURN 'null'::jsonb;
     END IF;
     RETURN session;
   END $$`,
  `CREATE OR REPLACE FUNCTION auth.jwt() RETURNS jsonb
     LANGUAGE sql STABLE PARALLEL RESTRICTED SET search_path = pg_catalog, pg_temp AS $$ SELECT auth.session() $$`,
  `CREATE OR REPLACE FUNCTION auth.user_id() RETURNS text
     LANGUAGE sql STABLE PARALLEL RESTRICTED SET search_path = pg_catalog, pg_temp AS $$
     SELECT CASE WHEN jsonb_typeof(s -> 'sub') = 'string' THEN s ->> 'sub' END FROM (SELECT auth.session() AS s) c $$`,
  `CREATE OR REPLACE FUNCTION auth.uid() RETURNS uuid
     LANGUAGE sql STABLE PARALLEL RESTRICTED SET search_path = pg_catalog, pg_temp AS $$
     SELECT CASE WHEN pg_input_is_valid(u, 'uuid') THEN u::uuid END FROM (SELECT auth.user_id() AS u) c $$`,
  "REVOKE ALL ON FUNCTION auth.session(), auth.jwt(), auth.user_id(), auth.uid() FROM PUBLIC",
  "GRANT EXECUTE ON FUNCTION auth.session(), auth.jwt(), auth.user_id(), auth.uid() TO PUBLIC",
];

/**
 * Installs the functions in the database `admin` is connected to, with the claims key's pads under
 * `keyId` (the same fingerprint the login guard's key has).
 */
export async function installAuthFunctions(
  admin: Queryable,
  keyId: string,
  pads: { inner: Uint8Array; outer: Uint8Array },
): Promise<void> {
  for (const statement of authFunctionStatements) await admin.query(statement);
  await admin.query(
    `INSERT INTO lessor_guard.claim_keys (key_id, inner_pad, outer_pad) VALUES ($1, $2, $3)
       ON CONFLICT (key_id) DO UPDATE SET inner_pad = EXCLUDED.inner_pad, outer_pad = EXCLUDED.outer_pad`,
    [keyId, `\\x${hex(pads.inner)}`, `\\x${hex(pads.outer)}`],
  );
}

function hex(bytes: Uint8Array): string {
  return [...bytes].map((byte) => byte.toString(16).padStart(2, "0")).join("");
}

/** Why an existing role cannot serve as the end-user role, or null if it can (or does not exist). */
export async function jwtRoleConflict(admin: Queryable, role: string): Promise<string | null> {
  const { rows } = await admin.query(
    `SELECT r.rolcanlogin OR r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls AS powerful,
            shobj_description(r.oid, 'pg_authid') AS comment,
            EXISTS (SELECT 1 FROM pg_auth_members m WHERE m.member = r.oid) AS member_of_something
       FROM pg_roles r WHERE r.rolname = $1`,
    [role],
  );
  const row = rows[0] as
    | { powerful: boolean; comment: string | null; member_of_something: boolean }
    | undefined;
  if (!row) return null;
  if (row.comment !== jwtRoleMarker || row.powerful || row.member_of_something) {
    return `A role named ${role} already exists on this host and is not one Lessor created for end users; choose another role name.`;
  }
  return null;
}

export interface JwtRoles {
  database: string;
  loginRole: string;
  /** SCRAM verifier of the login role's password. */
  verifier: string;
  connectionLimit: number;
  /** The configured role statements run as. */
  role: string;
}

/**
 * Creates (or brings up to date) the end-user role and the tenant's end-user login role, on the
 * host's admin connection. The caller checked `jwtRoleConflict` first.
 */
export async function ensureJwtRoles(admin: Queryable, roles: JwtRoles): Promise<void> {
  const role = quoteIdent(roles.role);
  const login = quoteIdent(roles.loginRole);
  const exists = async (name: string) =>
    (await admin.query("SELECT 1 FROM pg_roles WHERE rolname = $1", [name])).rows.length > 0;
  if (!(await exists(roles.role))) {
    await admin.query(
      `CREATE ROLE ${role} WITH NOLOGIN NOINHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS`,
    );
  }
  await admin.query(`COMMENT ON ROLE ${role} IS ${quoteLiteral(jwtRoleMarker)}`);
  const attributes = `LOGIN NOINHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS CONNECTION LIMIT ${roles.connectionLimit}`;
  await admin.query(
    `${(await exists(roles.loginRole)) ? "ALTER" : "CREATE"} ROLE ${login} WITH ${attributes}`,
  );
  await admin.query(`ALTER ROLE ${login} PASSWORD ${quoteLiteral(roles.verifier)}`);
  await admin.query(`GRANT CONNECT ON DATABASE ${quoteIdent(roles.database)} TO ${login}`);
  // Exactly one membership: the configured role (a changed configuration drops the old one).
  const { rows } = await admin.query(
    `SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
      WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = $1) AND g.rolname <> $2`,
    [roles.loginRole, roles.role],
  );
  for (const row of rows as { rolname: string }[]) {
    await admin.query(`REVOKE ${quoteIdent(row.rolname)} FROM ${login}`);
  }
  await admin.query(`GRANT ${role} TO ${login} WITH INHERIT FALSE, SET TRUE`);
}

/** Takes the end-user login role's way in away (JWT mode switched off); the role stays, inert. */
export async function disableJwtLogin(admin: Queryable, database: string, loginRole: string): Promise<void> {
  const exists = await admin.query("SELECT 1 FROM pg_roles WHERE rolname = $1", [loginRole]);
  if (exists.rows.length === 0) return;
  await admin.query(`ALTER ROLE ${quoteIdent(loginRole)} NOLOGIN`);
  await admin.query(`REVOKE CONNECT ON DATABASE ${quoteIdent(database)} FROM ${quoteIdent(loginRole)}`);
}
