/**
 * Reads what a host's admin role can do (src/core/host-capabilities.ts decides what that means), on
 * a pinned admin connection. One query for the catalog facts; event triggers are probed by creating
 * one inside a transaction that is always rolled back, so the probe leaves nothing behind.
 */
import {
  type EventTriggerPath,
  type HostFacts,
  loginTriggerServerVersion,
} from "../core/host-capabilities.ts";
import type { Queryable } from "../postgres/queryable.ts";

const factsSql = `
SELECT pg_catalog.current_setting('server_version_num')::pg_catalog.int4 AS version,
       r.rolname AS role, r.rolsuper AS superuser, r.rolcreaterole AS create_role, r.rolcreatedb AS create_db,
       pg_catalog.pg_has_role(r.oid, 'pg_signal_backend', 'USAGE') AS signal_backend,
       pg_catalog.pg_has_role(r.oid, 'pg_read_all_stats', 'USAGE') AS read_all_stats,
       pg_catalog.has_parameter_privilege('temp_file_limit', 'SET') AS temp_file_limit,
       pg_catalog.current_setting('max_prepared_transactions')::pg_catalog.int4 AS max_prepared,
       pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE') AS create_here,
       EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                 JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
                WHERE n.nspname OPERATOR(pg_catalog.=) 'lessor_provider'
                  AND p.proname OPERATOR(pg_catalog.=) 'create_event_trigger'
                  AND pg_catalog.has_schema_privilege(n.oid, 'USAGE')
                  AND pg_catalog.has_function_privilege(p.oid, 'EXECUTE')) AS provider_function,
       (SELECT COALESCE(pg_catalog.array_agg(d.datname::pg_catalog.text ORDER BY d.datname), '{}')
          FROM pg_catalog.pg_database d
         WHERE d.datallowconn AND NOT d.datistemplate
           AND d.datdba OPERATOR(pg_catalog.<>) r.oid
           AND pg_catalog.has_database_privilege('public', d.oid, 'CONNECT')) AS public_connect
  FROM pg_catalog.pg_roles r
 WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER`;

interface FactsRow {
  version: number;
  role: string;
  superuser: boolean;
  create_role: boolean;
  create_db: boolean;
  signal_backend: boolean;
  read_all_stats: boolean;
  temp_file_limit: boolean;
  max_prepared: number;
  create_here: boolean;
  provider_function: boolean;
  public_connect: string[];
}

/**
 * Whether the admin may create an event trigger itself: one is created on a handler of its own, in
 * a schema of its own, and all of it rolled back. 42501 (insufficient privilege) means no.
 */
async function canCreateEventTriggers(
  admin: Queryable,
  event: "login" | "ddl_command_end",
): Promise<boolean> {
  await admin.query("BEGIN");
  try {
    await admin.query("CREATE SCHEMA lessor_probe");
    await admin.query(
      "CREATE FUNCTION lessor_probe.noop() RETURNS event_trigger LANGUAGE plpgsql AS $$ BEGIN END $$",
    );
    await admin.query(`CREATE EVENT TRIGGER lessor_probe ON ${event} EXECUTE FUNCTION lessor_probe.noop()`);
    return true;
  } catch (error) {
    if ((error as { code?: unknown }).code === "42501") return false;
    throw error;
  } finally {
    await admin.query("ROLLBACK");
  }
}

/** Reads the host's facts through `admin` (a pinned admin connection). */
export async function probeHostFacts(admin: Queryable): Promise<HostFacts> {
  const { rows } = await admin.query(factsSql);
  const row = rows[0] as FactsRow | undefined;
  if (!row) throw new Error("the admin role is not in pg_roles");
  let eventTriggers: EventTriggerPath = "none";
  // The guard is a `login` trigger (Postgres 17+); before 17 any event answers the question.
  const event = Number(row.version) >= loginTriggerServerVersion ? "login" : "ddl_command_end";
  // The probe runs only where its answer is not known already and it can ask: it creates a schema,
  // so in a database where the admin may not (locally `postgres`, which the admin only connects
  // to) it would fail on that, not on the trigger, and leave `permission denied for database` in
  // the server's log at every probe. The provider function exists only on hosts whose admin
  // cannot create event triggers itself (local/host-setup.ts); it works wherever it is installed.
  if (row.superuser) eventTriggers = "direct";
  else if (row.provider_function) eventTriggers = "provider_function";
  else if (row.create_here && (await canCreateEventTriggers(admin, event))) eventTriggers = "direct";
  return {
    serverVersionNum: Number(row.version),
    role: row.role,
    superuser: row.superuser,
    createRole: row.create_role,
    createDb: row.create_db,
    signalBackend: row.signal_backend,
    readAllStats: row.read_all_stats,
    eventTriggers,
    tempFileLimit: row.temp_file_limit,
    maxPreparedTransactions: Number(row.max_prepared),
    publicConnectDatabases: row.public_connect,
  };
}
