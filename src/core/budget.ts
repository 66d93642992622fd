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
  /**
   * Connections a credential rotation may hold beyond `connections` while an old and a new
   * generation of one tenant overlap (docs/adr/013). 0 disables overlapping rotations on the host.
   */
  rotationReserve?: number;
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
  /**
   * Adaptive admission (src/core/adaptive.ts): the fewest connections the pool keeps, or null for a
   * pool of fixed size (never shrunk). Absent on ledgers written before adaptive admission: fixed.
   */
  floor?: number | null;
  /** The size the pool started at (grown and shrunk are counted against it). */
  startSize?: number;
  /** Most leases in use at once in the pool's last bucket of observation, as last reported. */
  recentPeak?: number | null;
}

/** Connections pools may hold in total. */
export function poolCapacity(limits: BudgetLimits): number {
  return limits.connections - limits.reserve;
}

/**
 * Whether one more maintenance connection fits the reserve. Pools never use the reserve and
 * maintenance never uses the pools' share, so pools plus maintenance never exceed `connections`.
 */
export function maintenanceFits(held: number, limits: BudgetLimits): boolean {
  return held + 1 <= limits.reserve;
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
 * Whether a rotation's new generation of `size` fits: pools may then use their share plus the
 * rotation reserve, so the ledger stays within `connections + rotationReserve` (pools + maintenance
 * ≤ connections, plus the overlap). Ordinary starts still use `fits`, so an overlap in progress
 * only ever delays them; it never lets them past `poolCapacity`.
 */
export function rotationFits(
  allocations: readonly Allocation[],
  limits: BudgetLimits,
  size: number,
): boolean {
  return usedConnections(allocations) + size <= poolCapacity(limits) + (limits.rotationReserve ?? 0);
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

/**
 * Idle connections an adaptive pool could give back now, as last reported: down to its floor, the
 * leases it holds and its recent peak (the same bound the pool applies: core/adaptive.ts
 * `targetSize` under pressure). A fixed pool, or one starting, draining, pinned or migrating, gives
 * back none. The pool re-checks when asked, so a stale report can only make it give back less.
 */
export function shrinkableConnections(a: Allocation): number {
  if (a.floor === null || a.floor === undefined) return 0;
  if (a.phase !== "allocated" || a.pinned || a.migrating) return 0;
  return Math.max(0, a.size - Math.max(a.floor, a.leases, a.recentPeak ?? 0));
}

/** One step of a reclaim: take idle connections back from a pool, or evict it whole. */
export type ReclaimStep =
  | { kind: "shrink"; allocation: Allocation; take: number }
  | { kind: "evict"; allocation: Allocation };

/**
 * How to make room for `size` connections: first idle connections taken back from under-used
 * adaptive pools (the most idle first), then, only if `allowEviction` and shrinking is not enough,
 * whole idle pools evicted (least recently used first, as `planEviction`). Returns [] when it fits
 * already, null when even all of that would not make room. A growth never evicts: its caller
 * passes `allowEviction: false`.
 */
export function planReclaim(
  allocations: readonly Allocation[],
  limits: BudgetLimits,
  size: number,
  options: { excludeTenant?: string; allowEviction: boolean },
): ReclaimStep[] | null {
  const draining = allocations.filter((a) => a.phase === "draining").reduce((sum, a) => sum + a.size, 0);
  let shortfall = usedConnections(allocations) + size - poolCapacity(limits) - draining;
  if (shortfall <= 0) return [];
  const steps: ReclaimStep[] = [];
  const shrinkers = allocations
    .filter((a) => a.tenantId !== options.excludeTenant && shrinkableConnections(a) > 0)
    .toSorted(
      (a, b) =>
        shrinkableConnections(b) - shrinkableConnections(a) || (a.idleSince ?? 0) - (b.idleSince ?? 0),
    );
  for (const allocation of shrinkers) {
    const take = Math.min(shortfall, shrinkableConnections(allocation));
    steps.push({ kind: "shrink", allocation, take });
    shortfall -= take;
    if (shortfall <= 0) return steps;
  }
  if (!options.allowEviction) return null;
  for (const candidate of evictionCandidates(allocations, options.excludeTenant)) {
    // A pool planned to shrink frees only the rest of it when evicted instead.
    const planned = steps.findIndex((s) => s.allocation === candidate);
    const already = planned >= 0 ? (steps[planned] as { take: number }).take : 0;
    if (planned >= 0) steps.splice(planned, 1);
    steps.push({ kind: "evict", allocation: candidate });
    shortfall -= candidate.size - already;
    if (shortfall <= 0) return steps;
  }
  return null;
}

/** A budget that cannot hold the largest pool is a configuration error, refused up front. */
export function validateLimits(limits: BudgetLimits, largestPool: number): string | null {
  if (!Number.isInteger(limits.connections) || limits.connections < 1)
    return "connections must be a positive integer";
  if (!Number.isInteger(limits.reserve) || limits.reserve < 1)
    return "reserve must be a positive integer (maintenance connections draw on it: migrations, provisioning, admin)";
  if (
    limits.rotationReserve !== undefined &&
    (!Number.isInteger(limits.rotationReserve) || limits.rotationReserve < 0)
  ) {
    return "rotationReserve must be a whole number ≥ 0 (connections a credential rotation may overlap with)";
  }
  if (poolCapacity(limits) < largestPool) {
    return `connections minus reserve (${poolCapacity(limits)}) is smaller than the largest pool (${largestPool})`;
  }
  return null;
}

/** Why a pool holding capacity may not be evicted right now. */
export type NotEvictableReason = "starting" | "draining" | "pinned" | "migrating" | "leased" | "not_idle";

/** One pool in an eviction dry run. */
export type EvictionVerdict =
  | { allocation: Allocation; verdict: "evict"; order: number }
  | { allocation: Allocation; verdict: "shrink"; order: number; take: number }
  | { allocation: Allocation; verdict: "eligible_not_needed" }
  | { allocation: Allocation; verdict: "not_eligible"; reason: NotEvictableReason };

/** What an admission of `size` connections would do to the host right now, without doing it. */
export interface EvictionDryRun {
  size: number;
  /** Connections pools may use (`connections − reserve`) and what they hold now. */
  poolCapacity: number;
  used: number;
  /** Connections of draining pools: on their way back, so the admission does not evict for them. */
  draining: number;
  /** `fits`: no eviction needed; `shrinks`: idle connections taken back from adaptive pools (verdict
   * `shrink`) make room; `evicts`: with the victims in `pools` with verdict `evict`, they do;
   * `saturated`: even evicting every eligible pool would not, so the start would wait, then be refused. */
  outcome: "fits" | "shrinks" | "evicts" | "saturated";
  /** Every pool holding capacity: the reclaim's steps first (shrinks, then victims, in order), then
   * eligible pools not needed, then the rest with the reason each one may not be evicted. */
  pools: EvictionVerdict[];
}

/**
 * Why `a` may not be evicted now, or null if it is an eviction candidate. The order matters: a
 * starting or draining pool is reported as such whatever else holds it, and a pinned pool as
 * pinned even if it is also leased, because that is the fact an operator can change.
 */
export function notEvictableReason(a: Allocation): NotEvictableReason | null {
  if (a.phase === "reserved") return "starting";
  if (a.phase === "draining") return "draining";
  if (a.pinned) return "pinned";
  if (a.migrating) return "migrating";
  if (a.leases > 0) return "leased";
  if (a.idleSince === null) return "not_idle";
  return null;
}

/**
 * The eviction dry run behind `lessorctl evict --dry-run`: the steps `planReclaim` would take for
 * an admission of `size` (by a tenant holding nothing on the host), in order — idle connections
 * taken back from adaptive pools, then victims evicted — and for every other pool why it is spared.
 * It uses the same functions as a real admission, so the report cannot drift from what the
 * BudgetObject does. On a host of fixed pools the steps are `planEviction`'s victims.
 */
export function evictionDryRun(
  allocations: readonly Allocation[],
  limits: BudgetLimits,
  size: number,
): EvictionDryRun {
  const plan = planReclaim(allocations, limits, size, { allowEviction: true });
  const steps = plan ?? [];
  const key = (a: Allocation) => `${a.tenantId}:${a.generation}`;
  const planned = new Set(steps.map((s) => key(s.allocation)));
  const candidates = evictionCandidates(allocations);
  const pools: EvictionVerdict[] = [
    ...steps.map(
      (step, index): EvictionVerdict =>
        step.kind === "evict"
          ? { allocation: step.allocation, verdict: "evict", order: index + 1 }
          : { allocation: step.allocation, verdict: "shrink", order: index + 1, take: step.take },
    ),
    ...candidates
      .filter((a) => !planned.has(key(a)))
      .map((allocation) => ({ allocation, verdict: "eligible_not_needed" as const })),
  ];
  for (const allocation of allocations) {
    const reason = notEvictableReason(allocation);
    if (reason && !planned.has(key(allocation))) pools.push({ allocation, verdict: "not_eligible", reason });
  }
  const evicts = steps.some((s) => s.kind === "evict");
  return {
    size,
    poolCapacity: poolCapacity(limits),
    used: usedConnections(allocations),
    draining: allocations.filter((a) => a.phase === "draining").reduce((sum, a) => sum + a.size, 0),
    outcome: plan === null ? "saturated" : evicts ? "evicts" : steps.length > 0 ? "shrinks" : "fits",
    pools,
  };
}
