/**
 * What a database host gives Lessor, for a host Lessor did not get from a managed provider: the
 * local stack, the tests' stacks, and a self-hosted Postgres (docs/deploy.md). Run once as a
 * superuser; idempotent. Lessor itself never runs as a superuser (docs/adr/016-host-kinds.md).
 *
 * The roles mirror Neon's, line for line from a dump of a Neon project on Postgres 18: a NOLOGIN
 * group (Neon's `neon_superuser`, here `lessor_provider`) with CREATEROLE, CREATEDB, REPLICATION
 * and BYPASSRLS and the predefined roles Neon grants it, and a LOGIN admin role (Neon's
 * `neondb_owner`, here `lessor_admin`) with the same attributes, a member of the group. Two extras
 * stand in for what a managed provider does by other means, both documented per provider:
 *
 * - `lessor_provider.create_event_trigger(name, event, handler)` in `template1` (so every database
 *   created afterwards has it) and in `postgres`: a SECURITY DEFINER function that creates a `login`
 *   event trigger on a handler the caller owns. Vanilla Postgres lets only superusers create event
 *   triggers; Neon, RDS and Cloud SQL let their admin roles do it directly.
 * - `SET` on `temp_file_limit`, so the admin can cap each tenant role's temporary files.
 *
 * It also takes CONNECT away from PUBLIC on the databases the admin does not own (`postgres`,
 * `template1`), which a managed provider's own databases may or may not do (Lessor reports it).
 */
import { fileURLToPath } from "node:url";

/** The group that stands for the provider's privileges (Neon's `neon_superuser`). */
export const providerGroup = "lessor_provider";
/** The host admin role Lessor logs in as (Neon's `neondb_owner`). */
export const localAdminRole = "lessor_admin";

function quoteLiteral(value: string): string {
  return `'${value.replaceAll("'", "''")}'`;
}

/** Cluster-wide statements (roles, parameter privileges), run once in any database. */
export function clusterSetupStatements(adminPassword: string): string[] {
  return [
    `DO $$ BEGIN
       IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = '${providerGroup}') THEN
         CREATE ROLE ${providerGroup} NOLOGIN;
       END IF;
       IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = '${localAdminRole}') THEN
         CREATE ROLE ${localAdminRole} LOGIN;
       END IF;
     END $$`,
    `ALTER ROLE ${providerGroup} WITH NOSUPERUSER INHERIT CREATEROLE CREATEDB NOLOGIN REPLICATION BYPASSRLS`,
    `ALTER ROLE ${localAdminRole} WITH NOSUPERUSER INHERIT CREATEROLE CREATEDB LOGIN REPLICATION BYPASSRLS PASSWORD ${quoteLiteral(adminPassword)}`,
    `GRANT ${providerGroup} TO ${localAdminRole} WITH INHERIT TRUE`,
    // Neon's grants to neon_superuser (pg_maintain from Postgres 17 on).
    `DO $$ DECLARE r text; BEGIN
       FOREACH r IN ARRAY ARRAY['pg_create_subscription', 'pg_maintain', 'pg_monitor', 'pg_read_all_data',
                                'pg_signal_backend', 'pg_write_all_data'] LOOP
         IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) THEN
           EXECUTE pg_catalog.format('GRANT %I TO ${providerGroup} WITH ADMIN OPTION, INHERIT TRUE', r);
         END IF;
       END LOOP;
     END $$`,
    `GRANT SET ON PARAMETER temp_file_limit TO ${providerGroup}`,
    // The admin's own way in (its admin URL names `postgres`); PUBLIC's goes below.
    `GRANT CONNECT ON DATABASE postgres TO ${providerGroup}`,
  ];
}

/**
 * The event-trigger function, installed in a database (template1 and postgres). It creates only
 * `login` triggers, only on a handler whose owner the caller may act as, and names everything with
 * its schema; the caller gets nothing else of the superuser's.
 */
export function databaseSetupStatements(): string[] {
  return [
    "CREATE SCHEMA IF NOT EXISTS lessor_provider",
    "REVOKE ALL ON SCHEMA lessor_provider FROM PUBLIC",
    `GRANT USAGE ON SCHEMA lessor_provider TO ${providerGroup}`,
    `CREATE OR REPLACE FUNCTION lessor_provider.create_event_trigger(trigger_name name, event name, handler regprocedure)
       RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
     BEGIN
       IF event OPERATOR(pg_catalog.<>) 'login' THEN
         RAISE EXCEPTION 'lessor_provider creates login event triggers only' USING ERRCODE = '42501';
       END IF;
       IF NOT pg_catalog.pg_has_role(session_user,
            (SELECT p.proowner FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) handler), 'USAGE') THEN
         RAISE EXCEPTION 'the event trigger handler must belong to the caller' USING ERRCODE = '42501';
       END IF;
       EXECUTE pg_catalog.format('CREATE EVENT TRIGGER %I ON %I EXECUTE FUNCTION %s()', trigger_name, event,
                                 handler::pg_catalog.regproc);
     END $$`,
    "REVOKE ALL ON FUNCTION lessor_provider.create_event_trigger(name, name, regprocedure) FROM PUBLIC",
    `GRANT EXECUTE ON FUNCTION lessor_provider.create_event_trigger(name, name, regprocedure) TO ${providerGroup}`,
    // Only databases that grant CONNECT explicitly are reachable (tenants: their own only).
    "REVOKE CONNECT, TEMPORARY ON DATABASE template1 FROM PUBLIC",
    "REVOKE CONNECT, TEMPORARY ON DATABASE postgres FROM PUBLIC",
  ];
}

/** The whole setup as one SQL script for `psql` (a self-hosted host's one-time step). */
export function setupScript(adminPassword: string): string {
  const database = databaseSetupStatements().map((s) => `${s};`);
  return [
    "-- Lessor: one-time host setup, run as a superuser with psql (docs/deploy.md).",
    ...clusterSetupStatements(adminPassword).map((s) => `${s};`),
    "\\connect template1",
    ...database,
    "\\connect postgres",
    ...database,
    "",
  ].join("\n");
}

// `node local/host-setup.ts <admin password>` prints the script.
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const password = process.argv[2];
  if (!password) {
    process.stderr.write("usage: node local/host-setup.ts <admin password>\n");
    process.exit(2);
  }
  process.stdout.write(setupScript(password));
}
