/**
 * Where a tenant's database lives, as the erase's `database` stage sees it: a small interface, so
 * that a provider that owns whole databases (a Neon project or branch per tenant, deleted through
 * Neon's API) can take the place of the one that exists today, a Postgres host on which Lessor's
 * admin role created the tenant's database and role.
 *
 * Only `localPostgresProvider` is real and tested. No Neon-API provider exists yet: it needs a real
 * Neon account to be called done (docs/erase.md).
 */
import type { LessorConfig } from "../config/index.ts";
import { dropTenantDatabaseAndRole } from "../tenant-db/drop-tenant.ts";

/** Where one tenant's database is. */
export interface TenantPlacement {
  tenantId: string;
  host: string;
  databaseName: string;
  roleName: string;
}

/** What the provider removed (counts for the audit row: 1 removed, 0 already gone). */
export interface DatabaseRemoval {
  databases: number;
  roles: number;
}

export interface TenantDatabaseProvider {
  /** A short name for logs and the audit detail. */
  readonly name: string;
  /**
   * Removes the tenant's database and everything that can log in to it. Idempotent: a placement
   * that is already gone is success with zero counts.
   */
  remove(placement: TenantPlacement): Promise<DatabaseRemoval>;
}

/**
 * A Postgres host reached through its admin role, within its maintenance reserve:
 * `DROP DATABASE … WITH (FORCE)`, `DROP ROLE`.
 */
export function localPostgresProvider(env: Env, config: LessorConfig): TenantDatabaseProvider {
  return {
    name: "postgres-host",
    async remove(placement) {
      const dropped = await dropTenantDatabaseAndRole(env, config, placement.host, placement);
      return { databases: dropped.databaseDropped ? 1 : 0, roles: dropped.rolesDropped };
    },
  };
}
