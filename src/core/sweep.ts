/**
 * When fleet work looks at a host (docs/adr/028-a-fleet-that-sleeps.md), as pure decisions.
 *
 * A Neon compute suspends after five minutes without a query; a query a minute keeps it up all
 * month. So a host hears from Lessor only while it has work: a live pool (the host is awake for it
 * anyway), something to look at (a pool stopped, a start failed, its object restarted with pools in
 * its ledger), or its slow visit, once every `LESSOR_SWEEP_MINUTES` (default 6 h), jittered per
 * host so a fleet's visits do not land in the same minute. The host's BudgetObject decides this in
 * its alarm; the cron only makes sure each object has an alarm, a bounded slice of hosts per tick.
 */

/** Why a host's object will look at the host at its next alarm. */
export type LookAtReason = "pool_stopped" | "start_failed" | "restarted_with_pools" | "asked";

/** What a host's object knows about its own schedule. */
export interface HostSweepState {
  /** Allocations in its ledger (pools starting, ready or draining). */
  allocations: number;
  /** Reasons to look at the host that came since its last visit. */
  lookAt: readonly string[];
  /** When it last ran its host work (reaper, hygiene, capability probe); null: never. */
  lastHostVisitAt: number | null;
  /** This host's share of the sweep's jitter (`hostSweepJitterMs`). */
  jitterMs: number;
}

/** How often a host with live pools reconciles its ledger (its tenants' objects, no host query). */
export const ledgerReconcileEveryMs = 60_000;

/** What the alarm does now: reconcile the ledger, and (or) visit the host itself. */
export function hostWorkDue(
  state: HostSweepState,
  now: number,
  sweepMs: number,
): { ledger: boolean; host: boolean } {
  return {
    ledger: state.allocations > 0,
    host:
      state.lookAt.length > 0 ||
      state.lastHostVisitAt === null ||
      now >= state.lastHostVisitAt + sweepMs + state.jitterMs,
  };
}

/**
 * When the host's alarm fires next: in a minute while it has pools or something to look at, else
 * at its next slow visit.
 */
export function nextHostAlarmAt(state: HostSweepState, now: number, sweepMs: number): number {
  if (state.allocations > 0 || state.lookAt.length > 0) return now + ledgerReconcileEveryMs;
  if (state.lastHostVisitAt === null) return now;
  return Math.max(now, state.lastHostVisitAt + sweepMs + state.jitterMs);
}

/** A stable share of a tenth of the sweep, from the host's name (FNV-1a). */
export function hostSweepJitterMs(host: string, sweepMs: number): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < host.length; i++) {
    hash ^= host.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return Math.floor((hash / 0x1_0000_0000) * Math.floor(sweepMs / 10));
}

/**
 * The hosts (indices into a region's stable list) one cron tick visits: every host once per
 * `sweepTicks` ticks, at most `maxPerTick` a tick. Past `sweepTicks × maxPerTick` hosts, a sweep
 * takes longer than `sweepTicks` instead of a tick costing more.
 */
export function sweepSlice(
  hostCount: number,
  tickIndex: number,
  sweepTicks: number,
  maxPerTick: number,
): { start: number; end: number } {
  if (hostCount <= 0) return { start: 0, end: 0 };
  const perTick = Math.max(1, Math.min(maxPerTick, Math.ceil(hostCount / Math.max(1, sweepTicks))));
  const slices = Math.ceil(hostCount / perTick);
  const slice = ((tickIndex % slices) + slices) % slices;
  const start = slice * perTick;
  return { start, end: Math.min(hostCount, start + perTick) };
}

/** The index of a cron tick: minutes since the epoch (the same on a redelivery of the tick). */
export function tickIndexOf(scheduledTime: number): number {
  return Math.floor(scheduledTime / 60_000);
}

/** Whether a job on the slow cadence runs on this tick: once every `sweepTicks` ticks. */
export function isSweepTick(tickIndex: number, sweepTicks: number): boolean {
  return tickIndex % Math.max(1, sweepTicks) === 0;
}
