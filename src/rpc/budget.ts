/** What crosses RPC between a TenantObject (or a route) and a host's BudgetObject. */
import type { AdaptivePolicy } from "../core/adaptive.ts";
import type { AllocationPhase, EvictionDryRun, NotEvictableReason } from "../core/budget.ts";
import type { HostReport } from "../core/host-capabilities.ts";
import type { TunnelFault } from "../core/tunnel.ts";

export type AdmitResult =
  | { granted: true }
  | {
      granted: false;
      retryAfterMs: number;
      waited: boolean;
      /** The tenant is being erased: no pool of it is admitted (not a capacity problem). */
      closed?: true;
      /** The host cannot run Lessor (its admin lacks a capability): what is missing. */
      unfit?: string;
      /** A customer's tunnel refused: no room in it, or its breaker is open after it was slow or down. */
      tunnel?: TunnelFault;
    };

/** A request for one maintenance connection from the host's reserve. */
export interface MaintenanceRequest {
  /** What the connection is for: `provision`, `migrate`, `repair`, `terminate`, `reconcile`, … */
  purpose: string;
  tenantId: string | null;
  /** How long the holder may keep the slot: its own deadline plus a margin (a dead holder's slot comes back then). */
  holdMs: number;
  /** How long to wait for a slot; 0 answers at once. */
  waitMs: number;
}

export type MaintenanceGrant =
  | { granted: true; leaseId: string; expiresAt: number; hostReport?: HostReport | null }
  | { granted: false; retryAfterMs: number };

/**
 * A repair of the accounting counted on the host (each also logged): a ledger allocation's lease
 * count the reconcile corrected from its pool's own; an allocation left `draining` by an eviction
 * whose answer a reset lost, put back by the reconcile; a lease a pool reclaimed as overdue; a
 * generation whose close was forced past its bound.
 */
export const repairKinds = [
  "lease_count_corrected",
  "phase_corrected",
  "lease_reclaimed",
  "close_forced",
] as const;
export type RepairKind = (typeof repairKinds)[number];

/** What a tenant's object says about one generation, asked by the reconcile. */
export interface GenerationCheck {
  /** Whether the object still holds connections (or budget) of it. */
  holds: boolean;
  /** The pool's own facts, when it is the current ready generation. */
  report: PoolReport | null;
}

/** What a tenant reports about its pool, for victim selection. */
export interface PoolReport {
  leases: number;
  idleSince: number | null;
  pinned: boolean;
  migrating: boolean;
  /** Adaptive pools: most leases in use at once in the last bucket of observation (src/core/adaptive.ts). */
  recentPeak?: number | null;
  /** Adaptive pools: the allowance the pool holds now (the ledger's size should match it). */
  size?: number;
}

/** The answer to a growth: granted (the ledger holds `by` more), or refused and why. */
export type GrowResult =
  | { granted: true; by: number }
  | {
      granted: false;
      /** `saturated`: no room and nothing to shrink; `starts_waiting`: a start is ahead in line. */
      reason: "saturated" | "starts_waiting" | "not_allocated";
      /** Starts and growths waiting on the host now (the pool's view of host pressure). */
      waiting: number;
    };

/** What a pool answers when the budget asks for idle connections back. */
export interface ShrinkOutcome {
  /** Connections the pool gave back (closed, and its allowance lowered by as many). */
  released: number;
  report: PoolReport;
}

/** What a victim answers when the budget asks it to drain. */
export interface EvictOutcome {
  evicted: boolean;
  report: PoolReport;
}

export interface CapacityStatus {
  host: string;
  /**
   * Databases and roles the host's tenants take against its limits (docs/adr/028), from the
   * catalog: added by `/v1/capacity` and the fleet overview, absent from the BudgetObject's own
   * answer (it does not read the catalog) and when the control plane did not answer.
   */
  tenancy?: import("../core/host-room.ts").HostTenancy;
  budget: number;
  reserve: number;
  /** Connections a credential rotation may overlap with beyond `budget` (docs/adr/013). */
  rotationReserve: number;
  poolCapacity: number;
  /** Rotations admitted and refused since the ledger was created, and waiting now. */
  rotations: { admitted: number; refused: number; waiting: number };
  allocated: number;
  reserved: number;
  draining: number;
  pools: Record<AllocationPhase, number>;
  waiters: number;
  evictions: number;
  saturations: number;
  /** Starts granted capacity since the ledger was created (a monotonic counter). */
  admissions: number;
  /** Leases held, as the pools last reported them (each heartbeat, at most 30 s old). */
  leases: number;
  /**
   * Pooled connections by use (leases as last reported: each heartbeat, at most 30 s old): in use
   * against idle in allocated pools; connections grown past and shrunk below pools' start sizes;
   * pools of adaptive size.
   */
  pooled: { inUse: number; idle: number; grown: number; shrunk: number; adaptivePools: number };
  /**
   * Adaptive admission on the host (docs/adr/022-adaptive-admission.md), and its counters since the
   * ledger was created: connections added by growths, growths refused, connections pools gave back on
   * their own, and connections taken back from under-used pools for a waiting start or growth.
   */
  adaptive: {
    enabled: boolean;
    policy: AdaptivePolicy | null;
    growths: number;
    growthsRefused: number;
    shrinks: number;
    reclaimShrinks: number;
  };
  /** Maintenance connections (migrations, provisioning, admin) holding or waiting for the reserve. */
  maintenance: { inUse: number; waiting: number; byPurpose: Record<string, number> };
  /** The host's kind and what its admin role can do, as last probed (null before the first probe, and for a tunnel). */
  capabilities: HostReport | null;
  /** For a customer's tunnel (`host` is then `tunnel:<name>`): its health and breaker; null for a host. */
  tunnel?: TunnelStatus | null;
  /** What reconcile and the pools have repaired since the ledger was created (monotonic counters). */
  reconciled: Record<RepairKind, number> & {
    allocationsReleased: number;
    orphansTerminated: number;
    maintenanceExpired: number;
  };
  candidates: {
    tenantId: string;
    generation: number;
    size: number;
    idleMs: number;
    leases: number;
    pinned: boolean;
  }[];
}

/** A customer's tunnel as its BudgetObject sees it (docs/customer-databases.md). */
export interface TunnelStatus {
  name: string;
  /** `up`, or the kind of the last failed connect (`slow`: timed out; `down`: refused or cut). */
  health: "up" | "slow" | "down";
  /** `open`: starts behind the tunnel are refused at once (`tunnel_unavailable`) until `openUntil`. */
  breaker: "open" | "closed";
  consecutiveFailures: number;
  openUntil: string | null;
  lastOkAt: string | null;
  lastFailureAt: string | null;
  /** Failed connects since the ledger was created, by kind. */
  failures: { slow: number; down: number };
  /** Starts the open breaker refused since the ledger was created. */
  refusedByBreaker: number;
}

/** One pool of an eviction dry run, as it crosses RPC (idle time relative to the object's clock). */
export interface DryRunPool {
  tenantId: string;
  generation: number;
  size: number;
  phase: AllocationPhase;
  idleMs: number | null;
  leases: number;
  pinned: boolean;
  migrating: boolean;
  verdict: "shrink" | "evict" | "eligible_not_needed" | "not_eligible";
  /** For `shrink` and `evict`: 1 for the first step of the reclaim. */
  order: number | null;
  /** For `shrink`: idle connections taken back from the pool (absent from an older BudgetObject). */
  take?: number | null;
  /** For `not_eligible`. */
  reason: NotEvictableReason | null;
}

/** `GET /v1/capacity/evictions`: what an admission of `size` would evict on a host right now. */
export interface EvictionReport extends Omit<EvictionDryRun, "pools"> {
  host: string;
  budget: number;
  reserve: number;
  waiters: number;
  pools: DryRunPool[];
}
