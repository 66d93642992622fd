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
import {
  ensureRole,
  quoteIdent,
  quoteLiteral,
  type RolePassword,
  roleExists,
  setRolePassword,
} from "./host-admin.ts";
import { ensureOwnSchema } from "./login-guard.ts";

/** The comment that marks a role as Lessor's end-user role (and so safe to grant to login roles). */
export const jwtRoleMarker = "lessor:jwt-role";

/**
 * The key table and the functions, in schemas `ensureOwnSchema` made sure are the admin's; every
 * statement idempotent. The functions run in end users' sessions: each pins the settings its body
 * depends on.
 */
export const authFunctionStatements: readonly string[] = [
  `CREATE TABLE IF NOT EXISTS lessor_guard.claim_keys (
     key_id pg_catalog.text PRIMARY KEY, inner_pad pg_catalog.bytea NOT NULL, outer_pad pg_catalog.bytea NOT NULL,
     added_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now())`,
  "REVOKE ALL ON lessor_guard.claim_keys FROM PUBLIC",
  // Claims, if Lessor signed them for this backend; else JSON null (pg_session_jwt's answer).
  // PARALLEL RESTRICTED: a parallel worker has another backend pid.
  `CREATE OR REPLACE FUNCTION auth.session() RETURNS jsonb
     LANGUAGE plpgsql STABLE PARALLEL RESTRICTED SECURITY DEFINER
     SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on AS $$
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
     LANGUAGE sql STABLE PARALLEL RESTRICTED SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on AS $$ SELECT auth.session() $$`,
  `CREATE OR REPLACE FUNCTION auth.user_id() RETURNS text
     LANGUAGE sql STABLE PARALLEL RESTRICTED SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on AS $$
     SELECT CASE WHEN jsonb_typeof(s -> 'sub') = 'string' THEN s ->> 'sub' END FROM (SELECT auth.session() AS s) c $$`,
  `CREATE OR REPLACE FUNCTION auth.uid() RETURNS uuid
     LANGUAGE sql STABLE PARALLEL RESTRICTED SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on AS $$
     SELECT CASE WHEN pg_input_is_valid(u, 'uuid') THEN u::uuid END FROM (SELECT auth.user_id() AS u) c $$`,
  // Only the admin owns them, so only the admin could grant more: there is nothing to revoke first
  // (a revoke and grant would leave a moment in which end users' statements are refused).
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
  await ensureOwnSchema(admin, "lessor_guard", false);
  await ensureOwnSchema(admin, "auth", true);
  for (const statement of authFunctionStatements) await admin.query(statement);
  await admin.query(
    `INSERT INTO lessor_guard.claim_keys (key_id, inner_pad, outer_pad)
       VALUES ($1::pg_catalog.text, $2::pg_catalog.bytea, $3::pg_catalog.bytea)
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
            pg_catalog.shobj_description(r.oid, 'pg_authid') AS comment,
            EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members m WHERE m.member OPERATOR(pg_catalog.=) r.oid)
              AS member_of_something
       FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) $1::pg_catalog.text`,
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
  /** The login role's password (derived from the tenant role's), and how the host takes it. */
  secret: RolePassword;
  connectionLimit: number;
  /** The configured role statements run as. */
  role: string;
}

/**
 * Creates (or brings back to what it must be) the end-user role and the tenant's end-user login
 * role, on the host's admin connection: its attributes, its password, no role-level settings, CONNECT
 * on its database and exactly one membership. The same call is the repair after an end-user login
 * failed (someone changed the role): whatever drifted is set back. The caller checked
 * `jwtRoleConflict` first.
 */
export async function ensureJwtRoles(admin: Queryable, roles: JwtRoles): Promise<void> {
  const role = quoteIdent(roles.role);
  const login = quoteIdent(roles.loginRole);
  if (!(await roleExists(admin, roles.role))) {
    await admin.query(
      `CREATE ROLE ${role} WITH NOLOGIN NOINHERIT NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS`,
    );
  }
  await admin.query(`COMMENT ON ROLE ${role} IS ${quoteLiteral(jwtRoleMarker)}`);
  await ensureRole(admin, roles.loginRole, {
    login: true,
    inherit: false,
    connectionLimit: roles.connectionLimit,
  });
  await admin.query(`ALTER ROLE ${login} RESET ALL`);
  await setRolePassword(admin, roles.loginRole, roles.secret);
  await admin.query(`GRANT CONNECT ON DATABASE ${quoteIdent(roles.database)} TO ${login}`);
  // Exactly one membership: the configured role (a changed configuration drops the old one).
  const { rows } = await admin.query(
    `SELECT g.rolname FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_roles g ON g.oid OPERATOR(pg_catalog.=) m.roleid
      WHERE m.member OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r
                                             WHERE r.rolname OPERATOR(pg_catalog.=) $1::pg_catalog.text)
        AND g.rolname OPERATOR(pg_catalog.<>) $2::pg_catalog.text`,
    [roles.loginRole, roles.role],
  );
  for (const row of rows as { rolname: string }[]) {
    await admin.query(`REVOKE ${quoteIdent(row.rolname)} FROM ${login}`);
  }
  await admin.query(`GRANT ${role} TO ${login} WITH INHERIT FALSE, SET TRUE`);
}

/** Takes the end-user login role's way in away (JWT mode switched off); the role stays, inert. */
export async function disableJwtLogin(admin: Queryable, database: string, loginRole: string): Promise<void> {
  if (!(await roleExists(admin, loginRole))) return;
  await admin.query(`ALTER ROLE ${quoteIdent(loginRole)} NOLOGIN`);
  await admin.query(`REVOKE CONNECT ON DATABASE ${quoteIdent(database)} FROM ${quoteIdent(loginRole)}`);
}

/** Removes every claims key but `keepKeyId` (the current password's), in the tenant's database. */
export async function retireClaimKeys(admin: Queryable, keepKeyId: string): Promise<number> {
  const { rows } = await admin.query(
    "DELETE FROM lessor_guard.claim_keys WHERE key_id OPERATOR(pg_catalog.<>) $1::pg_catalog.text RETURNING key_id",
    [keepKeyId],
  );
  return rows.length;
}
