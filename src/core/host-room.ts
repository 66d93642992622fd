/**
 * A host's room in tenants, and where a new tenant goes (docs/adr/028-a-fleet-that-sleeps.md).
 *
 * A host holds tenants up to its databases and its roles: Neon allows 500 of each per branch
 * (neon.com/docs/manage/databases, neon.com/docs/manage/roles), a plain Postgres server has no such
 * limit, and configuration may lower either. A tenant takes one database and one role, and one
 * more role (`<role>_jwt`) once it has end-user JWT mode. Placement picks, among a region's hosts
 * that still fit the tenant, the one with the most room in tenants, then in connection budget,
 * ties broken by name: a pure decision over counts the caller read.
 */
import type { HostKind } from "./host-capabilities.ts";

/** What a host may hold; `null` is no limit. */
export interface TenancyLimits {
  databases: number | null;
  roles: number | null;
}

/** What a host holds, as `/v1/capacity`, `lessorctl capacity` and the status page show it. */
export interface HostTenancy {
  tenants: number;
  jwtTenants: number;
  databases: { used: number; limit: number | null };
  roles: { used: number; limit: number | null };
  /** Plain tenants that still fit (null: no limit). */
  tenantsLeft: number | null;
}

/** What a host holds, or what one tenant takes. */
export interface TenancyUse {
  databases: number;
  roles: number;
}

/**
 * Neon's documented limits per branch, less what a host holds that is not a tenant's: its default
 * database and owner role, and the end-user roles JWT mode shares among a host's tenants (e.g.
 * `authenticated`). Five of each are kept for those.
 */
export const neonBranchLimits = { databases: 500, roles: 500 } as const;
export const hostOwnHeadroom = 5;

/** The limits a host kind declares (docs/adr/016-host-kinds.md). */
export function kindTenancyLimits(kind: HostKind): TenancyLimits {
  return kind === "neon"
    ? {
        databases: neonBranchLimits.databases - hostOwnHeadroom,
        roles: neonBranchLimits.roles - hostOwnHeadroom,
      }
    : { databases: null, roles: null };
}

/**
 * A host's limits: its kind's, lowered (never raised) by what configuration says. A configured
 * value above the kind's is refused by configuration, not silently ignored (config/index.ts).
 */
export function hostTenancyLimits(kind: HostKind, configured: Partial<TenancyLimits>): TenancyLimits {
  const declared = kindTenancyLimits(kind);
  const lower = (a: number | null, b: number | null | undefined): number | null =>
    b === undefined || b === null ? a : a === null ? b : Math.min(a, b);
  return {
    databases: lower(declared.databases, configured.databases),
    roles: lower(declared.roles, configured.roles),
  };
}

/** What one tenant takes: a database and its role, and its end-user login role in JWT mode. */
export function tenantFootprint(jwt: boolean): TenancyUse {
  return { databases: 1, roles: jwt ? 2 : 1 };
}

/** What `tenants` tenants take, `jwtTenants` of them in JWT mode. */
export function tenancyUsed(tenants: number, jwtTenants: number): TenancyUse {
  return { databases: tenants, roles: tenants + jwtTenants };
}

/** Whether `need` still fits on a host that holds `used` under `limits`. */
export function fitsTenancy(limits: TenancyLimits, used: TenancyUse, need: TenancyUse): boolean {
  const fits = (limit: number | null, have: number, more: number) => limit === null || have + more <= limit;
  return fits(limits.databases, used.databases, need.databases) && fits(limits.roles, used.roles, need.roles);
}

/** How many more tenants of `need`'s size fit (`null`: no limit). */
export function tenantsThatFit(limits: TenancyLimits, used: TenancyUse, need: TenancyUse): number | null {
  const left = (limit: number | null, have: number, per: number) =>
    limit === null || per === 0 ? null : Math.max(0, Math.floor((limit - have) / per));
  const databases = left(limits.databases, used.databases, need.databases);
  const roles = left(limits.roles, used.roles, need.roles);
  if (databases === null) return roles;
  if (roles === null) return databases;
  return Math.min(databases, roles);
}

/** One host placement may choose, with what the caller counted on it. */
export interface HostCandidate {
  name: string;
  limits: TenancyLimits;
  used: TenancyUse;
  /** Connections the host's pools may hold, and how many its tenants' pools would hold if all ran. */
  connections: { budget: number; committed: number };
}

export type Placement =
  | { kind: "chosen"; host: string; tenantsLeft: number | null; connectionsLeft: number }
  | { kind: "full"; hosts: number };

/**
 * The host a new tenant of `need`'s size goes to: among `candidates` that still fit it, the one
 * with the most room in tenants (no limit counts as the most), then the most connection budget
 * not committed to its tenants' pools, then the first by name. `full` when none fits.
 */
export function chooseHost(candidates: readonly HostCandidate[], need: TenancyUse): Placement {
  let best: { candidate: HostCandidate; tenants: number; connections: number } | null = null;
  for (const candidate of candidates) {
    if (!fitsTenancy(candidate.limits, candidate.used, need)) continue;
    const tenants = tenantsThatFit(candidate.limits, candidate.used, need) ?? Number.POSITIVE_INFINITY;
    const connections = candidate.connections.budget - candidate.connections.committed;
    const better =
      best === null ||
      tenants > best.tenants ||
      (tenants === best.tenants && connections > best.connections) ||
      (tenants === best.tenants && connections === best.connections && candidate.name < best.candidate.name);
    if (better) best = { candidate, tenants, connections };
  }
  if (best === null) return { kind: "full", hosts: candidates.length };
  return {
    kind: "chosen",
    host: best.candidate.name,
    tenantsLeft: Number.isFinite(best.tenants) ? best.tenants - 1 : null,
    connectionsLeft: best.connections,
  };
}
