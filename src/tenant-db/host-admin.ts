/**
 * What Lessor does on a database host through its admin role: create a tenant's role and database
 * contained (docs/adr/007-tenant-containment.md), set a role's password from a SCRAM verifier,
 * and end backends. Every statement here is idempotent, so a half-done provisioning or repair is
 * finished by running it again. Identifiers are Lessor's own opaque names, quoted anyway.
 */
import { isScramVerifier } from "../crypto/scram.ts";
import { logEvent } from "../log/index.ts";
import type { Queryable } from "../postgres/queryable.ts";

/** Postgres identifier quoting (double the quote character). */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/** Postgres string literal quoting, for the few statements that cannot take parameters. */
export function quoteLiteral(value: string): string {
  return `'${value.replaceAll("'", "''")}'`;
}

/** The limits a tenant role gets, set where the tenant cannot lift them. */
export interface RoleLimits {
  /** Connections the role may hold at once: its pool plus its migration connection. */
  connectionLimit: number;
  /** `temp_file_limit` (a superuser-only setting), e.g. "1GB"; null leaves the host's default. */
  tempFileLimit: string | null;
}

/**
 * Takes PUBLIC's CONNECT privilege away on every database of the host that allows connections
 * (`postgres`, `template1`, the control plane if it lives there, every tenant's), so a tenant role
 * can connect to its own database only. Lessor's hosts are dedicated to it.
 */
export async function revokePublicConnect(admin: Queryable): Promise<void> {
  const { rows } = await admin.query(
    "SELECT datname FROM pg_database WHERE datallowconn AND has_database_privilege('public', oid, 'CONNECT')",
  );
  for (const row of rows) {
    await admin.query(`REVOKE CONNECT ON DATABASE ${quoteIdent(String(row.datname))} FROM PUBLIC`);
  }
}

/** Sets a role's password from a verifier: the plaintext never travels in SQL. */
export async function setRolePassword(admin: Queryable, role: string, verifier: string): Promise<void> {
  if (!isScramVerifier(verifier)) throw new Error("refusing to send something that is not a SCRAM verifier");
  await admin.query(`ALTER ROLE ${quoteIdent(role)} PASSWORD ${quoteLiteral(verifier)}`);
}

/** Creates (or brings up to date) a tenant's login role: no privilege beyond its own database. */
export async function ensureTenantRole(
  admin: Queryable,
  role: string,
  verifier: string,
  limits: RoleLimits,
): Promise<void> {
  const exists = await admin.query("SELECT 1 FROM pg_roles WHERE rolname = $1", [role]);
  const name = quoteIdent(role);
  const attributes = `LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS CONNECTION LIMIT ${limits.connectionLimit}`;
  await admin.query(`${exists.rows.length > 0 ? "ALTER" : "CREATE"} ROLE ${name} WITH ${attributes}`);
  await setRolePassword(admin, role, verifier);
  if (limits.tempFileLimit !== null) {
    try {
      await admin.query(`ALTER ROLE ${name} SET temp_file_limit = ${quoteLiteral(limits.tempFileLimit)}`);
    } catch (error) {
      // Only a superuser may set it (Neon's admin role may not): then the host's default stands.
      if ((error as { code?: unknown }).code !== "42501") throw error;
      logEvent("warn", "temp_file_limit_not_set", { role, reason: "the admin role may not set it" });
    }
  }
}

/** Creates the tenant's database, owned by its role, which alone may connect to it. */
export async function ensureTenantDatabase(admin: Queryable, database: string, role: string): Promise<void> {
  const exists = await admin.query("SELECT 1 FROM pg_database WHERE datname = $1", [database]);
  if (exists.rows.length === 0) {
    await admin.query(`CREATE DATABASE ${quoteIdent(database)} OWNER ${quoteIdent(role)}`);
  }
  await admin.query(`REVOKE ALL ON DATABASE ${quoteIdent(database)} FROM PUBLIC`);
  await admin.query(`GRANT CONNECT, TEMPORARY ON DATABASE ${quoteIdent(database)} TO ${quoteIdent(role)}`);
}

/**
 * Ends every backend of `role` (but those named in `keepApplicationNames`), waiting up to `waitMs`
 * for each to be gone, and says how many it ended. Used when none of the role's connections may still be live: before a restarted object
 * serves a new generation (a write of the dead one must not commit after it), and on erase.
 */
export async function terminateRoleBackends(
  admin: Queryable,
  role: string,
  options: { keepApplicationNames?: readonly string[]; waitMs?: number } = {},
): Promise<number> {
  const { rows } = await admin.query(
    `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, $3::bigint)) AS ended
       FROM pg_stat_activity
      WHERE usename = $1 AND pid <> pg_backend_pid() AND NOT (coalesce(application_name, '') = ANY($2::text[]))`,
    [role, options.keepApplicationNames ?? [], options.waitMs ?? 5_000],
  );
  return Number(rows[0]?.ended ?? 0);
}
