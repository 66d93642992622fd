/**
 * The one place Lessor removes a tenant's database and role from a host: one admin connection,
 * `DROP DATABASE … WITH (FORCE)` (which ends whatever backend is still connected to it), then
 * `DROP ROLE`. Both are `IF EXISTS`, so a drop that was cut off half way is finished by running it
 * again, and running it after it finished changes nothing.
 *
 * Kept in a file of its own, as one function, because it is a maintenance connection on the host:
 * it is the single call site to lease from the host's maintenance reserve (issue 16).
 */
import type { LessorConfig } from "../config/index.ts";
import { hostApplicationName, tenantObjectNamePattern } from "../core/names.ts";
import { LessorError } from "../errors/index.ts";
import { withConnection } from "../postgres/index.ts";
import { quoteIdent } from "./host-admin.ts";

/** What the drop found and removed. */
export interface DroppedTenant {
  databaseDropped: boolean;
  roleDropped: boolean;
}

/**
 * Drops the tenant's database (ending its backends) and then its role, on `hostName` through the
 * host's admin role. Refuses a name Lessor would not have given a tenant, so no mistake here can
 * drop the control plane or `postgres`.
 */
export async function dropTenantDatabaseAndRole(
  config: LessorConfig,
  hostName: string,
  names: { databaseName: string; roleName: string },
): Promise<DroppedTenant> {
  const host = config.hosts.get(hostName);
  if (!host)
    throw new LessorError("misconfigured", { internal: `tenant host ${hostName} is not configured` });
  for (const name of [names.databaseName, names.roleName]) {
    if (!tenantObjectNamePattern.test(name)) {
      throw new LessorError("internal", { internal: "refusing to drop a name Lessor did not give a tenant" });
    }
  }
  return withConnection(config, host.adminUrl, hostApplicationName("erase"), async (admin) => {
    const database = await admin.query("SELECT 1 FROM pg_database WHERE datname = $1", [names.databaseName]);
    await admin.query(`DROP DATABASE IF EXISTS ${quoteIdent(names.databaseName)} WITH (FORCE)`);
    const role = await admin.query("SELECT 1 FROM pg_roles WHERE rolname = $1", [names.roleName]);
    await admin.query(`DROP ROLE IF EXISTS ${quoteIdent(names.roleName)}`);
    return { databaseDropped: database.rows.length > 0, roleDropped: role.rows.length > 0 };
  });
}
