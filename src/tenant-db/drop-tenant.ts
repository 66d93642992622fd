/**
 * The one place Lessor removes a tenant's database and roles from a host: one admin connection
 * within a slot of the host's maintenance reserve (`withHostAdmin`, ADR 010), under the host
 * catalog lock that provisioning and JWT setup take too (ADR 014), then `DROP DATABASE … WITH
 * (FORCE)` (which ends whatever backend is still connected to it), then `DROP ROLE` for the tenant's
 * login role and its end-user login role (JWT mode; the shared end-user role stays, it is not the
 * tenant's). Everything is `IF EXISTS`, so a drop that was cut off half way is finished by running
 * it again, and running it after it finished changes nothing.
 */
import type { LessorConfig } from "../config/index.ts";
import { jwtLoginRoleName } from "../core/jwt-config.ts";
import { tenantObjectNamePattern } from "../core/names.ts";
import { LessorError } from "../errors/index.ts";
import { quoteIdent } from "./host-admin.ts";
import { withHostAdmin } from "./maintenance.ts";

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
  return withHostAdmin(env, config, host, { purpose: "erase", tenantId: tenant.tenantId }, async (admin) => {
    // Host catalog edits are serialised with provisioning's and JWT setup's (released at close).
    await admin.query("SELECT pg_advisory_lock(hashtext('lessor:host-admin'))");
    const database = await admin.query("SELECT 1 FROM pg_database WHERE datname = $1", [tenant.databaseName]);
    await admin.query(`DROP DATABASE IF EXISTS ${quoteIdent(tenant.databaseName)} WITH (FORCE)`);
    const present = await admin.query("SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[])", [
      roles,
    ]);
    for (const role of roles) await admin.query(`DROP ROLE IF EXISTS ${quoteIdent(role)}`);
    return { databaseDropped: database.rows.length > 0, rolesDropped: present.rows.length };
  });
}
