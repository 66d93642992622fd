/**
 * The names Lessor gives what it creates on a database host. A tenant's database and role are
 * opaque (`t_` and 16 random hex digits, chosen at provisioning and kept in the catalog), so no
 * other tenant can learn a tenant id from `pg_database`, `pg_roles` or `pg_stat_activity`. Every
 * connection Lessor opens on a host has an `application_name` under `lessor:`, which is how the
 * budget's `pg_stat_activity` count finds them all (and only them).
 */

/** Prefix of every connection Lessor opens on a database host. */
export const lessorApplicationPrefix = "lessor:";

/** Database and role names Lessor may have created for a tenant (opaque, or the pre-opaque `tenant_<id>`). */
export const tenantObjectNamePattern = /^(t_[0-9a-f]{16}|tenant_[a-z0-9-]{1,40})$/;

/** A fresh opaque name for a tenant's database and role. */
export function newTenantObjectName(random: Uint8Array): string {
  return `t_${[...random.slice(0, 8)].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** A pooled connection of `generation`: `lessor:<role>:<generation>`. */
export function poolApplicationName(role: string, generation: number): string {
  return `${lessorApplicationPrefix}${role}:${generation}`;
}

/** A tenant-role maintenance connection (a migration): `lessor:<role>:<purpose>`. */
export function tenantMaintenanceApplicationName(role: string, purpose: "migrate"): string {
  return `${lessorApplicationPrefix}${role}:${purpose}`;
}

/** A host admin connection: `lessor:host:<host>:<purpose>`. */
export function hostApplicationName(host: string, purpose: string): string {
  return `${lessorApplicationPrefix}host:${host}:${purpose}`;
}

/** The generation a pooled connection's application_name names, or null for any other name. */
export function generationOfApplicationName(role: string, applicationName: string): number | null {
  const prefix = `${lessorApplicationPrefix}${role}:`;
  if (!applicationName.startsWith(prefix)) return null;
  const rest = applicationName.slice(prefix.length);
  return /^[1-9][0-9]{0,9}$/.test(rest) ? Number(rest) : null;
}
