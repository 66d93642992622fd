/** What crosses RPC between a TenantObject (or a route) and a host's BudgetObject. */
import type { AllocationPhase } from "../core/budget.ts";

export type AdmitResult = { granted: true } | { granted: false; retryAfterMs: number; waited: boolean };

/** What a tenant reports about its pool, for victim selection. */
export interface PoolReport {
  leases: number;
  idleSince: number | null;
  pinned: boolean;
  migrating: boolean;
}

/** What a victim answers when the budget asks it to drain. */
export interface EvictOutcome {
  evicted: boolean;
  report: PoolReport;
}

export interface CapacityStatus {
  host: string;
  budget: number;
  reserve: number;
  poolCapacity: number;
  allocated: number;
  reserved: number;
  draining: number;
  pools: Record<AllocationPhase, number>;
  waiters: number;
  evictions: number;
  saturations: number;
  candidates: {
    tenantId: string;
    generation: number;
    size: number;
    idleMs: number;
    leases: number;
    pinned: boolean;
  }[];
}
