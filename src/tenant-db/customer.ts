/**
 * What Lessor does on a customer's server (docs/adr/018-customer-databases-behind-tunnels.md),
 * always as the role the customer issued, always through the customer's tunnel, and always within a
 * slot of that tunnel's maintenance reserve: read what the role may do (the attach probe), prove a
 * credential, change its own password (a Lessor-managed rotation), end one of its own backends (a
 * statement that would not stop). Nothing else: no role, database, schema, function or trigger is
 * created there, and no DDL runs, not even a rolled-back trial (a customer's event trigger would see
 * it).
 *
 * A customer's database is hostile territory like a tenant's: every connection here is pinned at
 * startup (`withCustomerConnection`: only `pg_catalog` resolves names, whatever the database or the
 * role says), and every statement names its catalogs, functions, operators and types with their
 * schema, so nothing a customer-owned object plants can run in Lessor's session.
 */
import type { Client } from "@neondatabase/serverless";
import type { LessorConfig, Tunnel } from "../config/index.ts";
import type { AdoptedFacts } from "../core/adoption.ts";
import { lessorApplicationPrefix } from "../core/names.ts";
import type { TunnelFault } from "../core/tunnel.ts";
import { isScramVerifier, scramVerifier } from "../crypto/scram.ts";
import { LessorError } from "../errors/index.ts";
import { type ConnectionTarget, type TunnelRoute, withCustomerConnection } from "../postgres/index.ts";
import type { Queryable } from "../postgres/queryable.ts";
import type { AdoptedPlacement } from "../rpc/tenant.ts";
import { quoteLiteral } from "./host-admin.ts";
import { withMaintenanceSlot } from "./maintenance.ts";

/** `tunnel_unavailable`, naming why (full, slow, down): retryable, seen only by tenants behind that tunnel. */
export function tunnelUnavailable(fault: TunnelFault, retryAfterSeconds: number): LessorError {
  return new LessorError("tunnel_unavailable", {
    internal: `the tenant's tunnel is ${fault}`,
    retryAfterSeconds,
    details: { reason: fault },
  });
}

/** How long work on a customer's server outside a pool may run before it is cancelled. */
export const customerDeadlineMs = 30_000;

/** The way to a tunnel's far end. */
export function tunnelRoute(tunnel: Tunnel): TunnelRoute {
  return { proxy: tunnel.proxy, secure: tunnel.secure, connectTimeoutMs: tunnel.connectTimeoutMs };
}

/** The tunnel an adopted database is reached through; a tunnel no longer configured is `misconfigured`. */
export function tunnelOf(config: LessorConfig, adopted: Pick<AdoptedPlacement, "tunnel">): Tunnel {
  const tunnel = config.tunnels.get(adopted.tunnel);
  if (!tunnel) {
    throw new LessorError("misconfigured", {
      internal: `tunnel ${adopted.tunnel} is not configured (LESSOR_TUNNELS)`,
    });
  }
  return tunnel;
}

/** Where to connect to an adopted database as `user` with `password`, through its tunnel. */
export function customerTarget(
  config: LessorConfig,
  adopted: AdoptedPlacement,
  database: string,
  user: string,
  password: string,
): ConnectionTarget {
  return {
    host: adopted.hostname,
    port: adopted.port,
    user,
    password,
    database,
    route: tunnelRoute(tunnelOf(config, adopted)),
  };
}

/** The purposes of Lessor's connections to a customer's server outside a pool. */
export type CustomerPurpose = "attach" | "prove" | "rotate" | "terminate";

/** `lessor:<role>:<purpose>`, as every connection Lessor makes is named. */
export function customerApplicationName(role: string, purpose: CustomerPurpose): string {
  return `${lessorApplicationPrefix}${role}:${purpose}`;
}

/**
 * Runs `work` on one pinned connection to a customer's database, within a slot of its tunnel's
 * maintenance reserve (`503 maintenance_busy` if none comes in time), cancelled at
 * `customerDeadlineMs`.
 */
export function withCustomerSession<T>(
  env: Env,
  config: LessorConfig,
  tunnel: Tunnel,
  target: ConnectionTarget,
  options: { purpose: CustomerPurpose; tenantId: string; waitMs?: number },
  work: (client: Client) => Promise<T>,
): Promise<T> {
  return withMaintenanceSlot(
    env,
    config,
    tunnel.budgetName,
    {
      purpose: options.purpose,
      tenantId: options.tenantId,
      deadlineMs: customerDeadlineMs,
      ...(options.waitMs === undefined ? {} : { waitMs: options.waitMs }),
    },
    () =>
      withCustomerConnection(
        config,
        target,
        customerApplicationName(target.user, options.purpose),
        customerDeadlineMs,
        work,
      ),
  );
}

/** Provider groups whose members may create event triggers (so a login guard could exist there). */
const eventTriggerGroups = ["rds_superuser", "cloudsqlsuperuser", "neon_superuser", "azure_pg_admin"];

/** One catalog query, as the customer's role: what it may do there. */
const factsSql = `
SELECT pg_catalog.current_setting('server_version_num')::pg_catalog.int4 AS version,
       pg_catalog.current_setting('server_version') AS version_text,
       r.rolname AS role, r.rolsuper AS superuser, r.rolcreaterole AS create_role,
       r.rolcreatedb AS create_db, r.rolconnlimit AS connection_limit,
       CASE WHEN pg_catalog.isfinite(r.rolvaliduntil)
            THEN pg_catalog.to_char(pg_catalog.timezone('UTC', r.rolvaliduntil), 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
       END AS valid_until,
       (d.datdba OPERATOR(pg_catalog.=) r.oid) AS owns_database,
       pg_catalog.current_setting('max_prepared_transactions')::pg_catalog.int4 AS max_prepared,
       (SELECT COALESCE(pg_catalog.array_agg(o.datname::pg_catalog.text ORDER BY o.datname), '{}')
          FROM pg_catalog.pg_database o
         WHERE o.datallowconn AND NOT o.datistemplate
           AND o.oid OPERATOR(pg_catalog.<>) d.oid
           AND pg_catalog.has_database_privilege(r.oid, o.oid, 'CONNECT')) AS other_databases,
       EXISTS (SELECT 1 FROM pg_catalog.pg_roles g
                WHERE g.rolname OPERATOR(pg_catalog.=) ANY($1::pg_catalog.text[])
                  AND pg_catalog.pg_has_role(r.oid, g.oid, 'USAGE')) AS provider_group,
       EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                 JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
                WHERE n.nspname OPERATOR(pg_catalog.=) 'lessor_provider'
                  AND p.proname OPERATOR(pg_catalog.=) 'create_event_trigger'
                  AND pg_catalog.has_function_privilege(p.oid, 'EXECUTE')) AS provider_function
  FROM pg_catalog.pg_roles r, pg_catalog.pg_database d
 WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER
   AND d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()`;

interface FactsRow {
  version: number;
  version_text: string;
  role: string;
  superuser: boolean;
  create_role: boolean;
  create_db: boolean;
  connection_limit: number;
  valid_until: string | null;
  owns_database: boolean;
  max_prepared: number;
  other_databases: string[];
  provider_group: boolean;
  provider_function: boolean;
}

/** The login guard's `login` event trigger needs Postgres 17. */
const loginTriggerVersion = 170000;

/** Reads what the customer's role may do on its server (read-only: catalogs and settings). */
export async function probeAdoptedFacts(client: Queryable): Promise<AdoptedFacts> {
  const { rows } = await client.query(factsSql, [eventTriggerGroups]);
  const row = rows[0] as FactsRow | undefined;
  if (!row) throw new Error("the customer's role is not in pg_roles, or its database not in pg_database");
  const version = Number(row.version);
  return {
    serverVersionNum: version,
    serverVersion: String(row.version_text),
    role: row.role,
    superuser: row.superuser,
    createRole: row.create_role,
    createDb: row.create_db,
    connectionLimit: Number(row.connection_limit),
    validUntil: row.valid_until,
    ownsDatabase: row.owns_database,
    otherDatabases: row.other_databases,
    maxPreparedTransactions: Number(row.max_prepared),
    loginGuardPossible:
      version >= loginTriggerVersion && (row.superuser || row.provider_group || row.provider_function),
  };
}

/** Passwords Lessor makes: base64url of 32 random bytes (src/crypto/keys.ts). */
const lessorPassword = /^[A-Za-z0-9_-]{32,128}$/;

/**
 * Sets the connected role's own password (a Lessor-managed rotation): any role may change its own,
 * so nothing more is asked of the customer. Sent as a SCRAM verifier, never the plaintext.
 */
export async function setOwnPassword(client: Queryable, password: string): Promise<void> {
  if (!lessorPassword.test(password)) throw new Error("refusing to set a password Lessor did not make");
  const verifier = await scramVerifier(password);
  if (!isScramVerifier(verifier)) throw new Error("not a SCRAM verifier");
  await client.query(`ALTER ROLE CURRENT_USER PASSWORD ${quoteLiteral(verifier)}`);
}

/**
 * Ends one backend of the connected role (a role may end its own): a statement the watchdog cut.
 * "gone" when no such backend of the role is left, "ended" when it was ended now.
 */
export async function terminateOwnBackend(
  client: Queryable,
  pid: number,
): Promise<"ended" | "gone" | "still_running"> {
  const { rows } = await client.query(
    `SELECT pg_catalog.pg_terminate_backend(a.pid, 5000) AS ended FROM pg_catalog.pg_stat_activity a
      WHERE a.pid OPERATOR(pg_catalog.=) $1::pg_catalog.int4
        AND a.usename OPERATOR(pg_catalog.=) CURRENT_USER`,
    [pid],
  );
  if (rows.length === 0) return "gone";
  return rows[0]?.ended === true ? "ended" : "still_running";
}

/**
 * Ends every other backend of Lessor's under the connected role (`lessor:<role>:…`) but those named
 * in `keep` (a role may end its own), waiting for each: an erase whose leases would not end. The
 * customer's own sessions under the role are left alone. Says how many it ended.
 */
export async function terminateOwnBackends(client: Queryable, keep: readonly string[]): Promise<number> {
  const { rows } = await client.query(
    `SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(a.pid, 5000))::pg_catalog.int4 AS ended
       FROM pg_catalog.pg_stat_activity a
      WHERE a.usename OPERATOR(pg_catalog.=) CURRENT_USER
        AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
        AND pg_catalog.starts_with(COALESCE(a.application_name, ''), $2::pg_catalog.text)
        AND NOT (COALESCE(a.application_name, '') OPERATOR(pg_catalog.=) ANY($1::pg_catalog.text[]))`,
    [keep, `${lessorApplicationPrefix}${await currentUser(client)}:`],
  );
  return Number(rows[0]?.ended ?? 0);
}

async function currentUser(client: Queryable): Promise<string> {
  const { rows } = await client.query("SELECT CURRENT_USER::pg_catalog.text AS name");
  return String(rows[0]?.name ?? "");
}
