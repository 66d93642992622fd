/**
 * Admission and eviction math for one database host's connection budget, as plain functions.
 *
 * Capacity model: a host has `connections` in all. `reserve` of them is kept back for maintenance
 * connections (migrations, provisioning, credential rotation) that must work even when every pool
 * is full. Pools share the rest. Every pool is counted at its full size from the moment its start
 * reserves capacity until its connections are closed: starting, ready and draining pools all count.
 */

export interface BudgetLimits {
  /** Hard cap on connections Lessor opens on the host. */
  connections: number;
  /** Part of `connections` kept for maintenance connections; pools never use it. */
  reserve: number;
}

export type AllocationPhase = "reserved" | "allocated" | "draining";

export interface Allocation {
  tenantId: string;
  generation: number;
  size: number;
  phase: AllocationPhase;
  /** Last activity the tenant reported (epoch ms); drives least-recently-used victim choice. */
  idleSince: number | null;
  leases: number;
  pinned: boolean;
  migrating: boolean;
}

/** Connections pools may hold in total. */
export function poolCapacity(limits: BudgetLimits): number {
  return limits.connections - limits.reserve;
}

export function usedConnections(allocations: readonly Allocation[]): number {
  return allocations.reduce((sum, a) => sum + a.size, 0);
}

export function fits(allocations: readonly Allocation[], limits: BudgetLimits, size: number): boolean {
  return usedConnections(allocations) + size <= poolCapacity(limits);
}

/**
 * Pools that may be asked to drain: allocated, with no lease, not pinned, not migrating, as last
 * reported. The tenant re-checks atomically when asked, so a stale report can only cause a refusal,
 * never the eviction of a leased pool. Least recently used first.
 */
export function evictionCandidates(allocations: readonly Allocation[], excludeTenant?: string): Allocation[] {
  return allocations
    .filter(
      (a) =>
        a.phase === "allocated" &&
        a.leases === 0 &&
        a.idleSince !== null &&
        !a.pinned &&
        !a.migrating &&
        a.tenantId !== excludeTenant,
    )
    .toSorted((a, b) => (a.idleSince ?? 0) - (b.idleSince ?? 0));
}

/**
 * The fewest least-recently-used victims whose release makes room for `size`, or null if even
 * evicting every candidate would not. Draining pools are already on their way out and count as
 * capacity that will come back.
 */
export function planEviction(
  allocations: readonly Allocation[],
  limits: BudgetLimits,
  size: number,
  excludeTenant?: string,
): Allocation[] | null {
  const draining = allocations.filter((a) => a.phase === "draining").reduce((sum, a) => sum + a.size, 0);
  let shortfall = usedConnections(allocations) + size - poolCapacity(limits) - draining;
  if (shortfall <= 0) return [];
  const victims: Allocation[] = [];
  for (const candidate of evictionCandidates(allocations, excludeTenant)) {
    victims.push(candidate);
    shortfall -= candidate.size;
    if (shortfall <= 0) return victims;
  }
  return null;
}

/** A budget that cannot hold the largest pool is a configuration error, refused up front. */
export function validateLimits(limits: BudgetLimits, largestPool: number): string | null {
  if (!Number.isInteger(limits.connections) || limits.connections < 1)
    return "connections must be a positive integer";
  if (!Number.isInteger(limits.reserve) || limits.reserve < 0)
    return "reserve must be a non-negative integer";
  if (poolCapacity(limits) < largestPool) {
    return `connections minus reserve (${poolCapacity(limits)}) is smaller than the largest pool (${largestPool})`;
  }
  return null;
}
