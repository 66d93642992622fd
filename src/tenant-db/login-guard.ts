/**
 * The login guard installed in every tenant database (docs/adr/007-tenant-containment.md): a
 * `login` event trigger (Postgres 17+) that refuses a login of any role outside the guard's owner
 * (the host's admin role and its members) unless the connection carries a valid one-time token
 * (src/crypto/login-guard.ts) in `lessor.login`.
 *
 * Everything lives in the schema `lessor_guard`, owned by the admin role, with no privilege for
 * anyone else: the tenant owns its database but can neither read the key, nor drop or replace the
 * function, nor disable the trigger (`event_triggers` is superuser-only).
 */
import { toHex } from "../crypto/encoding.ts";
import type { Queryable } from "../postgres/queryable.ts";

/** HMAC-SHA256 in PL/pgSQL over the built-in `sha256()`, so no extension is needed. */
const hmacFunction = `
CREATE OR REPLACE FUNCTION lessor_guard.hmac_sha256(key bytea, message bytea) RETURNS bytea
  LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog AS $$
DECLARE
  k bytea := key;
  inner_pad bytea;
  outer_pad bytea;
BEGIN
  IF length(k) > 64 THEN k := sha256(k); END IF;
  k := k || decode(repeat('00', 64 - length(k)), 'hex');
  inner_pad := k;
  outer_pad := k;
  FOR i IN 0..63 LOOP
    inner_pad := set_byte(inner_pad, i, get_byte(k, i) # 54);
    outer_pad := set_byte(outer_pad, i, get_byte(k, i) # 92);
  END LOOP;
  RETURN sha256(outer_pad || sha256(inner_pad || message));
END $$`;

const loginFunction = `
CREATE OR REPLACE FUNCTION lessor_guard.on_login() RETURNS event_trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
  token text := coalesce(current_setting('lessor.login', true), '');
  parts text[];
  expires bigint;
  accepted boolean;
BEGIN
  -- The guard's owner (the admin role) and its members log in as usual.
  IF pg_has_role(session_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'lessor_guard'), 'MEMBER') THEN
    RETURN;
  END IF;
  IF token !~ '^[0-9a-f]{32}\\.[0-9]{1,12}\\.[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'direct login refused' USING ERRCODE = '28000',
      HINT = 'Connect through Lessor.';
  END IF;
  parts := string_to_array(token, '.');
  expires := parts[2]::bigint;
  IF expires < extract(epoch FROM now()) THEN
    RAISE EXCEPTION 'direct login refused' USING ERRCODE = '28000', DETAIL = 'The login token expired.';
  END IF;
  SELECT bool_or(encode(lessor_guard.hmac_sha256(g.key, convert_to(session_user || '.' || parts[1] || '.' || parts[2], 'UTF8')), 'hex') = parts[3])
    INTO accepted FROM lessor_guard.keys g;
  IF accepted IS NOT TRUE THEN
    RAISE EXCEPTION 'direct login refused' USING ERRCODE = '28000';
  END IF;
  DELETE FROM lessor_guard.spent WHERE expires_at < now();
  INSERT INTO lessor_guard.spent (nonce, expires_at) VALUES (parts[1], to_timestamp(expires))
    ON CONFLICT (nonce) DO NOTHING;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'direct login refused' USING ERRCODE = '28000', DETAIL = 'The login token was already used.';
  END IF;
END $$`;

/** Statements that install (or bring up to date) the guard; idempotent. Run as the admin role. */
export const loginGuardStatements: readonly string[] = [
  "CREATE SCHEMA IF NOT EXISTS lessor_guard",
  "REVOKE ALL ON SCHEMA lessor_guard FROM PUBLIC",
  "CREATE TABLE IF NOT EXISTS lessor_guard.keys (key_id text PRIMARY KEY, key bytea NOT NULL, added_at timestamptz NOT NULL DEFAULT now())",
  "CREATE TABLE IF NOT EXISTS lessor_guard.spent (nonce text PRIMARY KEY, expires_at timestamptz NOT NULL)",
  "REVOKE ALL ON ALL TABLES IN SCHEMA lessor_guard FROM PUBLIC",
  hmacFunction,
  loginFunction,
  "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA lessor_guard FROM PUBLIC",
  `DO $$ BEGIN
     IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'lessor_login_guard') THEN
       CREATE EVENT TRIGGER lessor_login_guard ON login EXECUTE FUNCTION lessor_guard.on_login();
     END IF;
   END $$`,
];

/** Installs the guard in the database `admin` is connected to, with `guardKey` as key `keyId`. */
export async function installLoginGuard(
  admin: Queryable,
  keyId: string,
  guardKey: Uint8Array<ArrayBuffer>,
): Promise<void> {
  for (const statement of loginGuardStatements) await admin.query(statement);
  await admin.query(
    "INSERT INTO lessor_guard.keys (key_id, key) VALUES ($1, $2) ON CONFLICT (key_id) DO UPDATE SET key = EXCLUDED.key",
    [keyId, `\\x${toHex(guardKey)}`],
  );
}
