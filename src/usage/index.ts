/**
 * Usage accounting: what a TenantObject counts per tenant, and how it reaches the control plane
 * (append-only delta rows; see docs for the folds that roll them up).
 */
import type { ControlPlane } from "../control-plane/index.ts";
import { usageDeltas } from "../control-plane/schema.ts";

/** Counters a TenantObject accumulates between flushes. */
export interface UsageCounters {
  queries: number;
  rowsReturned: number;
  errors: number;
  leaseMs: number;
  poolStarts: number;
}

export const zeroUsage: UsageCounters = { queries: 0, rowsReturned: 0, errors: 0, leaseMs: 0, poolStarts: 0 };

export function isZeroUsage(counters: UsageCounters): boolean {
  return (
    counters.queries === 0 &&
    counters.rowsReturned === 0 &&
    counters.errors === 0 &&
    counters.leaseMs === 0 &&
    counters.poolStarts === 0
  );
}

/** One flushed batch, numbered by the TenantObject so a replay is recognised. */
export interface UsageDeltaRow extends UsageCounters {
  seq: number;
  at: number;
}

/** Appends deltas; a replay of the same (tenant, seq) is ignored, so a flush can run twice. */
export async function appendUsageDeltas(
  db: ControlPlane,
  tenantId: string,
  rows: readonly UsageDeltaRow[],
): Promise<void> {
  if (rows.length === 0) return;
  await db
    .insert(usageDeltas)
    .values(rows.map((row) => ({ ...row, tenantId, at: new Date(row.at) })))
    .onConflictDoNothing();
}
