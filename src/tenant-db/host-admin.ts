/**
 * What Lessor does on a database host through its admin role (docs/adr/007-tenant-containment.md):
 * create a tenant's login role and its database, closed until the guard is in, owned by the admin
 * (the tenant owns its objects, never the database); set a role's password the way the host takes
 * it; move a database a tenant owned to the admin; end backends; roll back prepared transactions.
 *
 * Every statement runs on a pinned admin connection (src/postgres `withPrivilegedConnection`) and
 * still names its catalogs, functions, operators and types with their schema, so it means the same
 * whatever the session's settings. Every statement is idempotent, so a half-done step is finished
 * by running it again. Identifiers are Lessor's own opaque names, quoted anyway.
 */
import type { PasswordMode } from "../core/host-capabilities.ts";
import { isScramVerifier, scramVerifier } from "../crypto/scram.ts";
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

/**
 * A string literal whose meaning no session setting can change: dollar-quoted, with a tag the value
 * does not contain (`standard_conforming_strings` and backslashes play no part in it).
 */
export function dollarQuote(value: string): string {
  let tag = "lessor";
  // The first `$tag$` after the opening one must be the closing one, whatever the value holds.
  while (`${value}$${tag}$`.indexOf(`$${tag}$`) !== value.length) tag += "x";
  return `$${tag}$${value}$${tag}$`;
}

/** The limits a tenant role gets, set where the tenant cannot lift them. */
export interface RoleLimits {
  /** Connections the role may hold at once: its pool plus its migration connection. */
  connectionLimit: number;
  /** `temp_file_limit` (superuser-only unless granted), e.g. "1GB"; null leaves the host's default. */
  tempFileLimit: string | null;
}

/** A role's password and how the host takes it. */
export interface RolePassword {
  password: string;
  mode: PasswordMode;
}

/** Passwords Lessor makes: base64url of 32 random bytes (src/crypto/keys.ts, jwt-claims.ts). */
const lessorPassword = /^[A-Za-z0-9_-]{32,128}$/;

/**
 * Sets a role's password. On a host that takes verifiers the plaintext never travels: a SCRAM
 * verifier does. On Neon, which refuses verifiers, the plaintext goes over TLS only (config checks
 * the link) and is never logged or echoed: it is one of Lessor's own base64url passwords, so the
 * statement cannot fail to parse around it.
 */
export async function setRolePassword(admin: Queryable, role: string, secret: RolePassword): Promise<void> {
  if (!lessorPassword.test(secret.password))
    throw new Error("refusing to set a password Lessor did not make");
  const value = secret.mode === "scram-verifier" ? await scramVerifier(secret.password) : secret.password;
  if (secret.mode === "scram-verifier" && !isScramVerifier(value)) throw new Error("not a SCRAM verifier");
  await admin.query(`ALTER ROLE ${quoteIdent(role)} PASSWORD ${quoteLiteral(value)}`);
}

/** Whether a role exists (cluster-wide). */
export async function roleExists(admin: Queryable, role: string): Promise<boolean> {
  const { rows } = await admin.query(
    "SELECT 1 FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) $1::pg_catalog.text",
    [role],
  );
  return rows.length > 0;
}

/**
 * Takes PUBLIC's CONNECT privilege away on every database of the host that allows connections and
 * that the admin owns, so a tenant role can connect to its own database only. A database the admin
 * does not own (the provider's) is reported by the host probe instead (src/core/host-capabilities.ts).
 */
export async function revokePublicConnect(admin: Queryable): Promise<void> {
  const { rows } = await admin.query(
    `SELECT d.datname FROM pg_catalog.pg_database d
      WHERE d.datallowconn AND NOT d.datistemplate
        AND pg_catalog.pg_has_role(d.datdba, 'USAGE')
        AND pg_catalog.has_database_privilege('public', d.oid, 'CONNECT')`,
  );
  for (const row of rows) {
    await admin.query(`REVOKE CONNECT ON DATABASE ${quoteIdent(String(row.datname))} FROM PUBLIC`);
  }
}

/**
 * Creates a role with `attributes`, or brings an existing one back to them. A role without
 * SUPERUSER may not even name that attribute in `ALTER ROLE` (nor REPLICATION or BYPASSRLS unless it
 * has them), so those are named only to take away one that someone stronger gave: then the statement
 * fails loudly rather than leave the role as it is.
 */
export async function ensureRole(
  admin: Queryable,
  role: string,
  attributes: { login: boolean; inherit: boolean; connectionLimit: number },
): Promise<void> {
  const name = quoteIdent(role);
  const base = `${attributes.login ? "LOGIN" : "NOLOGIN"} ${attributes.inherit ? "INHERIT" : "NOINHERIT"} NOCREATEDB NOCREATEROLE CONNECTION LIMIT ${Math.floor(attributes.connectionLimit)}`;
  const { rows } = await admin.query(
    `SELECT r.rolsuper, r.rolreplication, r.rolbypassrls FROM pg_catalog.pg_roles r
      WHERE r.rolname OPERATOR(pg_catalog.=) $1::pg_catalog.text`,
    [role],
  );
  const existing = rows[0] as
    | { rolsuper: boolean; rolreplication: boolean; rolbypassrls: boolean }
    | undefined;
  if (!existing) {
    await admin.query(`CREATE ROLE ${name} WITH ${base} NOSUPERUSER NOREPLICATION NOBYPASSRLS`);
    return;
  }
  const taken = [
    existing.rolsuper ? "NOSUPERUSER" : "",
    existing.rolreplication ? "NOREPLICATION" : "",
    existing.rolbypassrls ? "NOBYPASSRLS" : "",
  ].join(" ");
  await admin.query(`ALTER ROLE ${name} WITH ${base} ${taken}`.trimEnd());
}

/** Creates (or brings up to date) a tenant's login role: no privilege beyond its own database. */
export async function ensureTenantRole(
  admin: Queryable,
  role: string,
  secret: RolePassword,
  limits: RoleLimits,
  tempFileLimitAllowed: boolean,
): Promise<void> {
  const name = quoteIdent(role);
  await ensureRole(admin, role, { login: true, inherit: true, connectionLimit: limits.connectionLimit });
  await setRolePassword(admin, role, secret);
  if (limits.tempFileLimit !== null) {
    if (tempFileLimitAllowed) {
      await admin.query(`ALTER ROLE ${name} SET temp_file_limit = ${quoteLiteral(limits.tempFileLimit)}`);
    } else {
      logEvent("warn", "temp_file_limit_not_set", { role, reason: "the admin role may not set it" });
    }
  }
}

/**
 * Creates the tenant's database closed: owned by the admin, with connections disallowed until
 * PUBLIC's rights are gone, then allowed for its owner only. The tenant gets nothing yet: it is let
 * in by `openTenantDatabase` once the login guard is installed.
 */
export async function createClosedDatabase(admin: Queryable, database: string): Promise<void> {
  const { rows } = await admin.query(
    "SELECT 1 FROM pg_catalog.pg_database WHERE datname OPERATOR(pg_catalog.=) $1::pg_catalog.text",
    [database],
  );
  const name = quoteIdent(database);
  if (rows.length === 0) await admin.query(`CREATE DATABASE ${name} WITH ALLOW_CONNECTIONS false`);
  await admin.query(`REVOKE ALL ON DATABASE ${name} FROM PUBLIC`);
  await admin.query(`ALTER DATABASE ${name} WITH ALLOW_CONNECTIONS true`);
}

/**
 * What a tenant role may do in its database, granted on a connection to it once the guard is in:
 * create schemas and own what it creates (an application needs nothing more), use and create in
 * `public` (owned by the database's owner, the admin), and connect. It gets nothing that changes the
 * database itself: no `ALTER DATABASE`, no database-level setting, no template or connection flag.
 */
export async function openTenantDatabase(admin: Queryable, database: string, role: string): Promise<void> {
  // `public` is the database owner's; a schema of that name the tenant made itself is its own.
  const { rows } = await admin.query(
    `SELECT pg_catalog.pg_has_role(n.nspowner, 'USAGE') AS ours FROM pg_catalog.pg_namespace n
      WHERE n.nspname OPERATOR(pg_catalog.=) 'public'`,
  );
  if (rows[0]?.ours === true) {
    await admin.query(`GRANT USAGE, CREATE ON SCHEMA public TO ${quoteIdent(role)}`);
  }
  await admin.query(
    `GRANT CONNECT, TEMPORARY, CREATE ON DATABASE ${quoteIdent(database)} TO ${quoteIdent(role)}`,
  );
}

/** Who owns a database, and the flags a tenant that owned it could have set. */
export interface DatabaseOwnership {
  exists: boolean;
  /** The admin (or a role it has the privileges of) owns it. */
  ours: boolean;
  owner: string | null;
  isTemplate: boolean;
  allowsConnections: boolean;
  connectionLimit: number;
  /** Database-wide settings (`ALTER DATABASE … SET`, for every role). */
  settings: number;
}

export async function databaseOwnership(admin: Queryable, database: string): Promise<DatabaseOwnership> {
  const { rows } = await admin.query(
    `SELECT pg_catalog.pg_get_userbyid(d.datdba) AS owner, pg_catalog.pg_has_role(d.datdba, 'USAGE') AS ours,
            d.datistemplate, d.datallowconn, d.datconnlimit,
            (SELECT pg_catalog.count(*) FROM pg_catalog.pg_db_role_setting s
              WHERE s.setdatabase OPERATOR(pg_catalog.=) d.oid
                AND s.setrole OPERATOR(pg_catalog.=) 0::pg_catalog.oid)::pg_catalog.int4 AS settings
       FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) $1::pg_catalog.text`,
    [database],
  );
  const row = rows[0] as
    | {
        owner: string;
        ours: boolean;
        datistemplate: boolean;
        datallowconn: boolean;
        datconnlimit: number;
        settings: number;
      }
    | undefined;
  if (!row) {
    return {
      exists: false,
      ours: false,
      owner: null,
      isTemplate: false,
      allowsConnections: false,
      connectionLimit: -1,
      settings: 0,
    };
  }
  return {
    exists: true,
    ours: row.ours,
    owner: row.owner,
    isTemplate: row.datistemplate,
    allowsConnections: row.datallowconn,
    connectionLimit: Number(row.datconnlimit),
    settings: Number(row.settings),
  };
}

/**
 * Makes the admin the owner of a tenant's database that its tenant role owned (tenants provisioned
 * before issue 24), and clears what the owner could have set: database-wide settings, the template
 * flag, a closed door or a connection limit. The admin created the tenant's role,
 * so it holds ADMIN on it and may take its membership for the one statement that needs it (the
 * old owner's privileges), and give it back at once. Nothing of the tenant's runs meanwhile: these
 * are catalog statements on the admin's own database. Idempotent; says whether anything changed.
 */
export async function takeDatabaseOwnership(
  admin: Queryable,
  database: string,
  tenantRole: string,
): Promise<boolean> {
  const before = await databaseOwnership(admin, database);
  if (!before.exists) return false;
  const name = quoteIdent(database);
  if (!before.ours) {
    if (before.owner !== tenantRole) {
      throw new Error("the tenant database belongs to a role that is neither the admin nor the tenant");
    }
    const role = quoteIdent(tenantRole);
    await admin.query(`GRANT ${role} TO CURRENT_USER WITH INHERIT TRUE, SET FALSE`);
    try {
      await admin.query(`ALTER DATABASE ${name} OWNER TO CURRENT_USER`);
    } finally {
      await admin.query(`REVOKE ${role} FROM CURRENT_USER`);
    }
  }
  if (before.settings > 0) await admin.query(`ALTER DATABASE ${name} RESET ALL`);
  if (before.isTemplate || !before.allowsConnections || before.connectionLimit !== -1) {
    await admin.query(
      `ALTER DATABASE ${name} WITH IS_TEMPLATE false ALLOW_CONNECTIONS true CONNECTION LIMIT -1`,
    );
  }
  await admin.query(`REVOKE ALL ON DATABASE ${name} FROM PUBLIC`);
  return (
    !before.ours ||
    before.settings > 0 ||
    before.isTemplate ||
    !before.allowsConnections ||
    before.connectionLimit !== -1
  );
}

/**
 * Ends every backend of `role` (but those named in `keepApplicationNames`), waiting up to `waitMs`
 * for each to be gone, and says how many it ended. Used when none of the role's connections may
 * still be live: before a restarted object serves a new generation (a write of the dead one must
 * not commit after it), and on erase.
 */
export async function terminateRoleBackends(
  admin: Queryable,
  role: string,
  options: { keepApplicationNames?: readonly string[]; waitMs?: number } = {},
): Promise<number> {
  const { rows } = await admin.query(
    `SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(a.pid, $3::pg_catalog.int8)) AS ended
       FROM pg_catalog.pg_stat_activity a
      WHERE a.usename OPERATOR(pg_catalog.=) $1::pg_catalog.text
        AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
        AND NOT (COALESCE(a.application_name, '') OPERATOR(pg_catalog.=) ANY($2::pg_catalog.text[]))`,
    [role, options.keepApplicationNames ?? [], options.waitMs ?? 5_000],
  );
  return Number(rows[0]?.ended ?? 0);
}

/**
 * Rolls back every prepared transaction in the database `admin` is connected to, whatever role
 * prepared it and whatever its gid: found through `pg_catalog`, named by a dollar-quoted literal.
 * Only its preparer (or a superuser) may finish one, so the admin takes the preparer's role for the
 * one statement (it created every role that can log in there, so it may grant that to itself) and
 * gives it back. `ROLLBACK PREPARED` runs no code of the tenant's. Returns how many it rolled back.
 */
export async function rollBackAllPreparedTransactions(admin: Queryable): Promise<number> {
  const { rows } = await admin.query(
    `SELECT x.gid, x.owner::pg_catalog.text AS owner,
            pg_catalog.pg_has_role(x.owner, 'SET') AS can_set
       FROM pg_catalog.pg_prepared_xacts x
      WHERE x.database OPERATOR(pg_catalog.=) pg_catalog.current_database()`,
  );
  let rolledBack = 0;
  for (const row of rows as { gid: string; owner: string; can_set: boolean }[]) {
    const owner = quoteIdent(row.owner);
    const granted = !row.can_set;
    if (granted) await admin.query(`GRANT ${owner} TO CURRENT_USER WITH INHERIT FALSE, SET TRUE`);
    try {
      await admin.query(`SET ROLE ${owner}`);
      try {
        await admin.query(`ROLLBACK PREPARED ${dollarQuote(row.gid)}`);
        rolledBack++;
      } finally {
        await admin.query("RESET ROLE");
      }
    } finally {
      if (granted) await admin.query(`REVOKE ${owner} FROM CURRENT_USER`);
    }
  }
  return rolledBack;
}
