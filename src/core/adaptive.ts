/**
 * Adaptive admission (docs/adr/022-adaptive-admission.md), as plain data and functions: a pool's
 * observed use over a bounded window, and the size policy that turns it into a target size between
 * the pool's floor and its tier's maximum. The TenantObject only records and applies; the
 * BudgetObject admits every growth and asks for every shrink that host pressure needs.
 *
 * The record is a handful of numbers in a fixed number of buckets: its memory does not grow with
 * the traffic, and nothing in it is written to storage on the request path.
 */

import { maxPoolSize } from "./pool-size.ts";

/** What an operator may set per host (`LESSOR_BUDGETS.<host>.adaptive`); validated in src/config. */
export interface AdaptivePolicy {
  /** The fewest connections an admitted pool keeps (never more than its tier's maximum). */
  floor: number;
  /** Connections one growth asks the host for. */
  growthStep: number;
  /** How long connections must sit idle before a pool gives them back on its own. */
  windowMs: number;
}

export const defaultAdaptivePolicy: AdaptivePolicy = { floor: 1, growthStep: 1, windowMs: 60_000 };

/** The bounds of each setting, with the reason shown when one is out of them. */
export const adaptiveBounds = {
  floor: { min: 1, max: maxPoolSize },
  growthStep: { min: 1, max: maxPoolSize },
  windowMs: { min: 1_000, max: 3_600_000 },
} as const;

/** Buckets in a window: the recent peak is one bucket's, the idle peak the whole window's. */
export const usageBuckets = 6;

export interface UsageBucket {
  /** Epoch ms the bucket starts at (a multiple of the bucket length). */
  start: number;
  /** Most leases in use at once during the bucket. */
  peak: number;
  /** Leases in use integrated over the bucket's time (lease·ms), for the mean. */
  area: number;
  /** Checkouts that found every connection of the pool in use and had to wait. */
  waits: number;
  waitMsTotal: number;
  waitMsMax: number;
  /** Requests refused for lack of a connection (a checkout that timed out, a start refused). */
  refusals: number;
}

/** A pool's observed use: at most `usageBuckets + 1` buckets, oldest first, whatever the traffic. */
export interface UsageRecord {
  bucketMs: number;
  buckets: UsageBucket[];
  /** Leases in use now, and since when (the level integrated into the current bucket). */
  inUse: number;
  levelSince: number;
  /** When observation started: a window is complete only once it is this old. */
  since: number;
}

/** What the record says about the last window, at `now`. */
export interface ObservedUse {
  windowMs: number;
  /** How much of the window the record covers (less than the window right after a start or resize). */
  coveredMs: number;
  /** Most leases in use at once over the window, and over its last bucket. */
  peak: number;
  recentPeak: number;
  /** Mean leases in use over the covered part of the window. */
  mean: number;
  waits: number;
  meanWaitMs: number;
  maxWaitMs: number;
  refusals: number;
  inUse: number;
}

export function newUsageRecord(windowMs: number, now: number, inUse = 0): UsageRecord {
  const bucketMs = Math.max(1, Math.floor(windowMs / usageBuckets));
  return { bucketMs, buckets: [], inUse, levelSince: now, since: now };
}

function emptyBucket(start: number, level: number): UsageBucket {
  return { start, peak: level, area: 0, waits: 0, waitMsTotal: 0, waitMsMax: 0, refusals: 0 };
}

/**
 * Brings the record up to `now`: the level held since the last change is integrated into every
 * bucket it spanned, buckets older than the window are dropped, and the current bucket is returned.
 * Bounded: at most `usageBuckets + 1` buckets are created or kept, however long the gap.
 */
function advance(record: UsageRecord, now: number): UsageBucket {
  const { bucketMs } = record;
  const windowStart = now - bucketMs * usageBuckets;
  let from = Math.max(record.levelSince, windowStart - bucketMs);
  let last = record.buckets.at(-1);
  if (last === undefined || last.start + bucketMs <= from) {
    last = emptyBucket(Math.floor(from / bucketMs) * bucketMs, record.inUse);
    record.buckets.push(last);
  }
  for (;;) {
    const end = Math.min(now, last.start + bucketMs);
    if (end > from) last.area += record.inUse * (end - from);
    last.peak = Math.max(last.peak, record.inUse);
    if (now < last.start + bucketMs) break;
    from = last.start + bucketMs;
    last = emptyBucket(from, record.inUse);
    record.buckets.push(last);
  }
  record.levelSince = Math.max(now, record.levelSince);
  while (record.buckets.length > 0 && (record.buckets[0]?.start ?? now) + bucketMs <= windowStart) {
    record.buckets.shift();
  }
  return last;
}

/** The number of leases in use changed (a lease taken or released). */
export function recordInUse(record: UsageRecord, now: number, inUse: number): void {
  const bucket = advance(record, now);
  record.inUse = Math.max(0, inUse);
  bucket.peak = Math.max(bucket.peak, record.inUse);
}

/** A checkout waited `waitedMs` because every connection of the pool was in use. */
export function recordWait(record: UsageRecord, now: number, waitedMs: number): void {
  const bucket = advance(record, now);
  bucket.waits++;
  bucket.waitMsTotal += Math.max(0, waitedMs);
  bucket.waitMsMax = Math.max(bucket.waitMsMax, waitedMs);
}

/** A request was refused for lack of a connection. */
export function recordRefusal(record: UsageRecord, now: number): void {
  advance(record, now).refusals++;
}

/**
 * Starts a new observation at the current level: after a resize, the window that justifies the
 * next shrink must be one the pool spent at its new size.
 */
export function restartObservation(record: UsageRecord, now: number): void {
  advance(record, now);
  record.buckets = [emptyBucket(Math.floor(now / record.bucketMs) * record.bucketMs, record.inUse)];
  record.since = now;
}

/** What the record says at `now`, without changing it. */
export function observe(record: UsageRecord, now: number): ObservedUse {
  const copy: UsageRecord = { ...record, buckets: record.buckets.map((b) => ({ ...b })) };
  const current = advance(copy, now);
  const windowMs = copy.bucketMs * usageBuckets;
  const windowStart = now - windowMs;
  let peak = 0;
  let area = 0;
  let waits = 0;
  let waitMsTotal = 0;
  let maxWaitMs = 0;
  let refusals = 0;
  for (const b of copy.buckets) {
    if (b.start + copy.bucketMs <= windowStart) continue;
    peak = Math.max(peak, b.peak);
    // The part of the oldest bucket before the window counts in proportion.
    const inside = Math.min(copy.bucketMs, b.start + copy.bucketMs - windowStart);
    area += inside >= copy.bucketMs ? b.area : (b.area * inside) / copy.bucketMs;
    waits += b.waits;
    waitMsTotal += b.waitMsTotal;
    maxWaitMs = Math.max(maxWaitMs, b.waitMsMax);
    refusals += b.refusals;
  }
  const coveredMs = Math.max(0, Math.min(windowMs, now - copy.since));
  return {
    windowMs,
    coveredMs,
    peak,
    recentPeak: current.peak,
    mean: coveredMs > 0 ? Math.min(peak, area / coveredMs) : copy.inUse,
    waits,
    meanWaitMs: waits > 0 ? waitMsTotal / waits : 0,
    maxWaitMs,
    refusals,
    inUse: copy.inUse,
  };
}

// ── The size policy ──────────────────────────────────────────────────────────────────────────────

/** How full the host is, as the pool last learned it from its BudgetObject. */
export interface HostPressure {
  /** Starts (and growths) waiting in the host's line. */
  waiting: number;
}

export interface SizeInput {
  /** The pool's allowance now (what the host's ledger holds for it). */
  size: number;
  /** Checkouts waiting now because every connection is in use. */
  waiting: number;
  observed: ObservedUse;
  floor: number;
  /** The tier's maximum: a hard cap. */
  max: number;
  growthStep: number;
  pressure: HostPressure;
}

export type SizeReason = "grow" | "shrink_idle" | "shrink_pressure" | "clamp" | "hold";

export interface SizeDecision {
  target: number;
  reason: SizeReason;
}

/** The lowest size that touches no lease in use and keeps the floor (which the maximum caps). */
export function lowestSize(size: number, inUse: number, floor: number, max: number): number {
  return Math.max(Math.min(floor, max), Math.min(inUse, size));
}

/**
 * The size a pool should move to. Pure: observed use, tier bounds and host pressure in, a target out.
 *
 * - Never above the tier's maximum, never below the floor, never below the leases in use (a
 *   shrink only gives back idle connections).
 * - A pool whose checkouts wait grows by one step — unless starts wait on the host: growth never
 *   jumps ahead of a waiting cold start (the BudgetObject enforces the same line).
 * - A pool gives back connections no lease used for a whole window (target: the window's peak);
 *   while starts wait on the host, those no lease used in the last bucket (target: its peak).
 */
export function targetSize(input: SizeInput): SizeDecision {
  const { size, waiting, observed, floor, max, growthStep, pressure } = input;
  const low = lowestSize(size, observed.inUse, floor, max);
  // A maximum lowered by configuration: the applier gives back only idle connections anyway.
  if (size > max) return { target: max, reason: "clamp" };
  if (size < Math.min(floor, max)) return { target: Math.min(floor, max), reason: "clamp" };
  if (waiting > 0) {
    if (size < max && pressure.waiting === 0)
      return { target: Math.min(max, size + growthStep), reason: "grow" };
    return { target: size, reason: "hold" };
  }
  if (pressure.waiting > 0) {
    const target = Math.max(low, Math.min(size, observed.recentPeak));
    if (target < size) return { target, reason: "shrink_pressure" };
  }
  if (observed.coveredMs >= observed.windowMs && observed.waits === 0) {
    const target = Math.max(low, Math.min(size, observed.peak));
    if (target < size) return { target, reason: "shrink_idle" };
  }
  return { target: size, reason: "hold" };
}
