/**
 * A host's room in tenants, read from the catalog (docs/adr/028-a-fleet-that-sleeps.md): what
 * provisioning refuses with `507 host_full`, what placement chooses by (src/core/host-room.ts), and
 * what `/v1/capacity`, `lessorctl capacity` and the status page show. Every catalog row on a host
 * holds a database and a role there (a `moved` row's database is still on its old host until the
 * move's cleanup drops it; an erased tenant's row is gone), and a tenant with a JWT configuration
 * one role more. Counting reads the control plane only: no host is woken to learn its room.
 */
import { count, eq, inArray, sql } from "drizzle-orm";
import type { LessorConfig } from "../config/index.ts";
import { type ControlPlane, tierPoolSize } from "../control-plane/index.ts";
import { tenantJwt, tenants } from "../control-plane/schema.ts";
import {
  chooseHost,
  fitsTenancy,
  type HostCandidate,
  type HostTenancy,
  type Placement,
  type TenancyLimits,
  type TenancyUse,
  tenancyUsed,
  tenantsThatFit,
} from "../core/host-room.ts";
import { LessorError } from "../errors/index.ts";

export type { HostTenancy } from "../core/host-room.ts";

interface HostCount {
  tenants: number;
  jwtTenants: number;
  /** Connections its tenants' pools would hold if all ran (their tiers' sizes). */
  committed: number;
}

/** The catalog's counts for `hosts`, in one grouped read. */
export async function countHostTenancy(
  db: ControlPlane,
  config: LessorConfig,
  hosts: readonly string[],
): Promise<Map<string, HostCount>> {
  const counts = new Map<string, HostCount>(
    hosts.map((h) => [h, { tenants: 0, jwtTenants: 0, committed: 0 }]),
  );
  if (hosts.length === 0) return counts;
  const rows = await db
    .select({
      host: tenants.host,
      tier: tenants.tier,
      tenants: count(),
      jwtTenants: sql<number>`count(${tenantJwt.tenantId})::int`,
    })
    .from(tenants)
    .leftJoin(tenantJwt, eq(tenantJwt.tenantId, tenants.id))
    .where(inArray(tenants.host, [...hosts]))
    .groupBy(tenants.host, tenants.tier);
  for (const row of rows) {
    const entry = counts.get(row.host);
    if (!entry) continue;
    entry.tenants += Number(row.tenants);
    entry.jwtTenants += Number(row.jwtTenants);
    entry.committed += Number(row.tenants) * tierPoolSize(config, row.tier);
  }
  return counts;
}

/** A host's room as shown to operators. */
export function describeTenancy(limits: TenancyLimits, counted: HostCount): HostTenancy {
  const used = tenancyUsed(counted.tenants, counted.jwtTenants);
  return {
    tenants: counted.tenants,
    jwtTenants: counted.jwtTenants,
    databases: { used: used.databases, limit: limits.databases },
    roles: { used: used.roles, limit: limits.roles },
    tenantsLeft: tenantsThatFit(limits, used, { databases: 1, roles: 1 }),
  };
}

function limitsOf(config: LessorConfig, host: string): TenancyLimits {
  return config.hosts.get(host)?.tenancy ?? { databases: null, roles: null };
}

/** The room of each of `hosts`, for `/v1/capacity` and the status page. */
export async function hostsTenancy(
  db: ControlPlane,
  config: LessorConfig,
  hosts: readonly string[],
): Promise<Map<string, HostTenancy>> {
  const counts = await countHostTenancy(db, config, hosts);
  return new Map(
    [...counts].map(([host, counted]) => [host, describeTenancy(limitsOf(config, host), counted)]),
  );
}

/** Where a new tenant of `need`'s size goes among `hosts` (a region's), by room. */
export async function placeByRoom(
  db: ControlPlane,
  config: LessorConfig,
  hosts: readonly string[],
  need: TenancyUse,
): Promise<Placement> {
  const counts = await countHostTenancy(db, config, hosts);
  const candidates: HostCandidate[] = hosts.map((name) => {
    const counted = counts.get(name) ?? { tenants: 0, jwtTenants: 0, committed: 0 };
    const host = config.hosts.get(name);
    return {
      name,
      limits: limitsOf(config, name),
      used: tenancyUsed(counted.tenants, counted.jwtTenants),
      connections: {
        budget: host ? host.budget.connections - host.budget.reserve : 0,
        committed: counted.committed,
      },
    };
  });
  return chooseHost(candidates, need);
}

/** The refusal of a host with no room for `need`. */
export function hostFull(config: LessorConfig, host: string, tenancy: HostTenancy): LessorError {
  const limits = limitsOf(config, host);
  return new LessorError("host_full", {
    publicMessage: `Host ${host} holds ${tenancy.databases.used} of ${limits.databases ?? "unlimited"} databases and ${tenancy.roles.used} of ${limits.roles ?? "unlimited"} roles (a tenant takes one of each, and one more role in JWT mode); name another host of its region, or add a host (docs/operating.md, "When a region fills").`,
  });
}

/**
 * Throws `507 host_full` unless `need` still fits on `host`. Call it under the host's room lock
 * (`withHostRoomLock`) so that two creates cannot both take the last place.
 */
export async function assertRoom(
  db: ControlPlane,
  config: LessorConfig,
  host: string,
  need: TenancyUse,
): Promise<void> {
  const counted = (await countHostTenancy(db, config, [host])).get(host) ?? {
    tenants: 0,
    jwtTenants: 0,
    committed: 0,
  };
  const limits = limitsOf(config, host);
  if (!fitsTenancy(limits, tenancyUsed(counted.tenants, counted.jwtTenants), need)) {
    throw hostFull(config, host, describeTenancy(limits, counted));
  }
}

/**
 * Runs `work` holding the host's room lock on this control-plane session (a session-level
 * advisory lock, released after `work`; withControlPlane's reset releases it too if the session
 * ends first): what counts a host's room and then takes a place in it holds it.
 */
export async function withHostRoomLock<T>(
  db: ControlPlane,
  host: string,
  work: () => Promise<T>,
): Promise<T> {
  await db.execute(sql`SELECT pg_advisory_lock(hashtext('lessor:host-room'), hashtext(${host}))`);
  try {
    return await work();
  } finally {
    await db.execute(sql`SELECT pg_advisory_unlock(hashtext('lessor:host-room'), hashtext(${host}))`);
  }
}
