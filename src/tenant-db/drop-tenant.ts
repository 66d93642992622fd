/**
 * The one place Lessor removes a tenant's database and roles from a host, within a slot of the
 * host's maintenance reserve (ADR 010), on pinned admin connections: nothing the tenant set or
 * planted can keep it from finishing. The admin takes the database over if the tenant owned it and
 * clears its flags, rolls back any prepared transaction in it, and then, under the host catalog lock
 * that provisioning and JWT setup take too (ADR 014), runs `DROP DATABASE … WITH (FORCE)` (which ends
 * whatever backend is still connected to it) and `DROP ROLE` for the tenant's login role and its
 * end-user login role (JWT mode; the shared end-user role stays, it is not the tenant's). Every step
 * is idempotent, so a drop that was cut off half way is finished by running it again, and running it
 * after it finished changes nothing.
 */

import type { Client } from "@neondatabase/serverless";
import type { LessorConfig } from "../config/index.ts";
import { jwtLoginRoleName } from "../core/jwt-config.ts";
import { tenantObjectNamePattern } from "../core/names.ts";
import { LessorError } from "../errors/index.ts";
import { quoteIdent, rollBackAllPreparedTransactions, takeDatabaseOwnership } from "./host-admin.ts";
import { adminDeadlineMs, withAdminConnection, withMaintenanceSlot } from "./maintenance.ts";

/** What the drop found and removed. */
export interface DroppedTenant {
  databaseDropped: boolean;
  /** Roles dropped: the tenant's login role, and its end-user login role if JWT mode made one. */
  rolesDropped: number;
}

/**
 * Drops the tenant's database (ending its backends) and then its roles, on `hostName` through the
 * host's admin role. Refuses a name Lessor would not have given a tenant, so no mistake here can
 * drop the control plane, `postgres` or a shared role.
 */
export async function dropTenantDatabaseAndRole(
  env: Env,
  config: LessorConfig,
  hostName: string,
  tenant: { tenantId: string; databaseName: string; roleName: string },
): Promise<DroppedTenant> {
  const host = config.hosts.get(hostName);
  if (!host)
    throw new LessorError("misconfigured", { internal: `tenant host ${hostName} is not configured` });
  for (const name of [tenant.databaseName, tenant.roleName]) {
    if (!tenantObjectNamePattern.test(name)) {
      throw new LessorError("internal", { internal: "refusing to drop a name Lessor did not give a tenant" });
    }
  }
  const roles = [tenant.roleName, jwtLoginRoleName(tenant.roleName)];
  const slot = { purpose: "erase", tenantId: tenant.tenantId, deadlineMs: 3 * adminDeadlineMs };
  return withMaintenanceSlot(env, config, host.name, slot, async (knownReport) => {
    const connect = <T>(database: string | undefined, work: (admin: Client) => Promise<T>) =>
      withAdminConnection(
        env,
        config,
        host,
        { purpose: "erase", knownReport, ...(database ? { database } : {}) },
        (admin) => work(admin),
      );
    // Whatever its owner could have set (a tenant that owned its database before issue 24: the
    // template flag, a closed door), the admin owns the database and clears it first.
    const preparedLeft = await connect(undefined, async (admin) => {
      await admin.query(hostLockSql);
      await takeDatabaseOwnership(admin, tenant.databaseName, tenant.roleName);
      const { rows } = await admin.query(
        `SELECT pg_catalog.count(*)::pg_catalog.int4 AS n FROM pg_catalog.pg_prepared_xacts x
          WHERE x.database OPERATOR(pg_catalog.=) $1::pg_catalog.text`,
        [tenant.databaseName],
      );
      return Number(rows[0]?.n ?? 0);
    });
    // A prepared transaction keeps a database from being dropped: roll each back, in the database.
    if (preparedLeft > 0) await connect(tenant.databaseName, rollBackAllPreparedTransactions);
    return connect(undefined, async (admin) => {
      // Host catalog edits are serialised with provisioning's and JWT setup's (released at close).
      await admin.query(hostLockSql);
      const database = await admin.query(
        "SELECT 1 FROM pg_catalog.pg_database WHERE datname OPERATOR(pg_catalog.=) $1::pg_catalog.text",
        [tenant.databaseName],
      );
      await admin.query(`DROP DATABASE IF EXISTS ${quoteIdent(tenant.databaseName)} WITH (FORCE)`);
      const present = await admin.query(
        "SELECT rolname FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) ANY($1::pg_catalog.text[])",
        [roles],
      );
      for (const role of roles) await admin.query(`DROP ROLE IF EXISTS ${quoteIdent(role)}`);
      return { databaseDropped: database.rows.length > 0, rolesDropped: present.rows.length };
    });
  });
}

/** The host catalog lock provisioning, JWT setup and erase take (docs/adr/014-lock-order.md). */
export const hostLockSql = "SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtext('lessor:host-admin'))";
