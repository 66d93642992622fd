/**
 * Adaptive pool size (docs/adr/022-adaptive-admission.md): the room that records how the pool is
 * used and applies what the size policy (src/core/adaptive.ts) decides. It decides nothing itself.
 *
 * - Observed use lives in memory: a bounded record of leases in use, checkout waits and refusals,
 *   updated on the request path without a storage write. The heartbeat keeps a summary in storage
 *   (at most one write per beat, and only when it changed) so status survives a restart.
 * - A checkout that finds every connection in use asks to grow, one step at a time: each step is
 *   admitted by the host's BudgetObject first, and only then does the driver pool open more.
 * - The heartbeat's review gives back connections no lease used for a whole window; the BudgetObject
 *   may ask for idle ones sooner when starts wait (`shrinkIdle`). A connection is closed (and its
 *   backend gone) before the ledger gives it to anyone else, and a lease in use is never touched.
 *
 * On a host without adaptive admission every method is inert: the pool holds its tier's size.
 */

import {
  type HostPressure,
  lowestSize,
  newUsageRecord,
  type ObservedUse,
  observe,
  recordInUse,
  recordRefusal,
  recordWait,
  restartObservation,
  type SizeDecision,
  targetSize,
  type UsageRecord,
  usageBuckets,
} from "../../core/adaptive.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent, logEventSampled } from "../../log/index.ts";
import type { PoolReport, ShrinkOutcome } from "../../rpc/budget.ts";
import type { PoolSizeStatus, TenantRecord } from "../../rpc/tenant.ts";
import { heartbeatMs, type TenantRuntime } from "../runtime.ts";
import type { StoredValues } from "../storage-schema.ts";
import { type GrowStep, tenantHooksForTests } from "../test-hooks.ts";

/** What the room needs of the pool: its allowance, and the two ways to change it. */
export interface SizedPool {
  readonly isOpen: boolean;
  /** The generation whose pool is open (meaningful while `isOpen`). */
  readonly openGeneration: number;
  /** Connections the pool may hold now (the ledger holds as many for it). */
  readonly allowance: number;
  /** Checkouts waiting now because every connection is in use. */
  waitingCheckouts(): number;
  /** Lets the pool hold `by` more connections (the host admitted them). */
  raiseAllowance(by: number): void;
  /** Closes up to `want` idle connections, never below `lowest`; resolves with how many it gave back. */
  giveBackIdle(want: number, lowest: number): Promise<number>;
  report(): PoolReport;
}

/** The bounds a tenant's pool moves within on its host. */
export interface SizeBounds {
  /** What a start reserves. */
  start: number;
  floor: number;
  /** The tier's maximum (a fixed pool's start, floor and max are its size). */
  max: number;
  adaptive: boolean;
}

/** A failed or refused growth is not asked again sooner than this. */
const growRetryMs = 1_000;
/** Where the heartbeat keeps the last observation (kv). */

/** The heartbeat's last observation, as the object keeps it. */
type KeptObservation = StoredValues["observedUse"];

export class PoolSizing {
  private usage: UsageRecord | null = null;
  private growing: Promise<void> | null = null;
  private growRetryAt = 0;
  /** Starts and growths waiting on the host, as its BudgetObject last said. */
  private pressure: HostPressure = { waiting: 0 };
  private lastDecision: (SizeDecision & { at: number }) | null = null;
  private kept: KeptObservation | null = null;

  constructor(
    private readonly rt: TenantRuntime,
    private readonly pool: SizedPool,
  ) {}

  /** The size bounds of `record`'s pool: its tier's size and maximum, and its host's floor. */
  bounds(record: TenantRecord): SizeBounds {
    const max = record.poolSize;
    const size = Math.min(max, this.rt.config.poolStartSizes.get(record.tier) ?? max);
    const policy = this.rt.config.hosts.get(record.host)?.adaptive ?? null;
    if (!policy) return { start: size, floor: size, max: size, adaptive: false };
    const floor = Math.min(policy.floor, max);
    return { start: Math.max(floor, size), floor, max, adaptive: true };
  }

  private policy() {
    const record = this.rt.record;
    return record ? (this.rt.config.hosts.get(record.host)?.adaptive ?? null) : null;
  }

  /** A generation's pool opened: observation starts afresh (on an adaptive host). */
  onStart(): void {
    const policy = this.policy();
    this.usage = policy ? newUsageRecord(policy.windowMs, Date.now(), 0) : null;
    this.lastDecision = null;
  }

  /** The generation's pool stopped. */
  onStop(): void {
    this.usage = null;
  }

  /** Leases held changed (taken, released, reclaimed). */
  onLeases(held: number): void {
    if (this.usage) recordInUse(this.usage, Date.now(), held);
  }

  /** A checkout waited `ms` for a connection because every one was in use. */
  onWait(ms: number): void {
    if (this.usage) recordWait(this.usage, Date.now(), ms);
  }

  /** A request was refused for lack of a connection (a checkout that timed out). */
  onRefusal(): void {
    if (this.usage) recordRefusal(this.usage, Date.now());
  }

  /** A checkout found every connection in use: ask the host for one more step (once at a time). */
  onQueued(): void {
    if (!this.usage || this.growing || Date.now() < this.growRetryAt) return;
    this.growing = this.grow().finally(() => {
      this.growing = null;
    });
    this.rt.ctx.waitUntil(this.growing);
  }

  /** What the budget learns with each report: the recent peak it plans shrinks by, and the allowance. */
  reportFields(): Pick<PoolReport, "recentPeak" | "size"> {
    if (!this.usage) return {};
    return { recentPeak: observe(this.usage, Date.now()).recentPeak, size: this.pool.allowance };
  }

  /** The host's pressure, learned from a report's answer. */
  notePressure(pressure: HostPressure): void {
    this.pressure = pressure;
  }

  /**
   * Grows while checkouts wait, one step per admission, up to the tier's maximum. The host decides:
   * a refusal (starts wait, or there is no room and nothing idle to take back) ends the round.
   */
  private async grow(): Promise<void> {
    const record = this.rt.record;
    const policy = this.policy();
    if (!record || !policy) return;
    const bounds = this.bounds(record);
    // Bounded: each pass grows the allowance by at least one, up to the maximum, or returns.
    for (let pass = 0; pass < bounds.max; pass++) {
      const usage = this.usage;
      if (!usage || !this.pool.isOpen) return;
      const generation = this.pool.openGeneration;
      const decision = this.decide(usage, { waiting: 0 });
      if (decision.reason !== "grow") return;
      const by = decision.target - this.pool.allowance;
      let result: Awaited<ReturnType<ReturnType<TenantRuntime["budget"]>["grow"]>>;
      try {
        result = await this.rt
          .budget(record.host)
          .grow(record.host, record.tenantId, generation, by, bounds.max);
      } catch (error) {
        logEvent("warn", "pool_grow_failed", { tenant: record.tenantId, failure: describeFailure(error) });
        this.growRetryAt = Date.now() + growRetryMs;
        return;
      }
      if (!result.granted) {
        this.pressure = { waiting: result.waiting };
        this.growRetryAt = Date.now() + growRetryMs;
        logEventSampled("info", "pool_grow_refused", record.tenantId, {
          tenant: record.tenantId,
          generation,
          reason: result.reason,
        });
        return;
      }
      await this.step(record.tenantId, "granted");
      // The generation ended meanwhile: its allocation (grown with it) is released as it stops.
      if (!this.pool.isOpen || this.pool.openGeneration !== generation) return;
      this.pool.raiseAllowance(result.by);
      restartObservation(usage, Date.now());
      await this.step(record.tenantId, "applied");
      // The grown size is reviewed once a window at it has passed (the heartbeat alone is 30 s).
      const review = this.nextReviewAt();
      if (review !== null) await this.rt.alarms.wakeBy(review);
      logEventSampled("info", "pool_grown", record.tenantId, {
        tenant: record.tenantId,
        generation,
        size: this.pool.allowance,
      });
      if (this.pool.waitingCheckouts() === 0) return;
    }
  }

  private async step(tenantId: string, step: GrowStep): Promise<void> {
    const hook = tenantHooksForTests.onGrowStep;
    if (hook) await hook({ tenantId, step, abortObject: (why) => this.rt.ctx.abort(why) });
  }

  /** When the pool's size should next be reviewed: once a window at its size has passed, if above its floor. */
  nextReviewAt(): number | null {
    const record = this.rt.record;
    const usage = this.usage;
    if (!record || !usage || !this.pool.isOpen) return null;
    if (this.pool.allowance <= this.bounds(record).floor) return null;
    // When the window at this size completes; once it has, every half window (the heartbeat's 30 s
    // at the default window), so a pool busy at its size is not woken more often than that.
    const windowMs = usage.bucketMs * usageBuckets;
    return Math.max(usage.since + windowMs + 100, Date.now() + windowMs / 2);
  }

  private decide(usage: UsageRecord, pressure: HostPressure): SizeDecision {
    const record = this.rt.record;
    const policy = this.policy();
    if (!record || !policy) return { target: this.pool.allowance, reason: "hold" };
    const bounds = this.bounds(record);
    const decision = targetSize({
      size: this.pool.allowance,
      waiting: this.pool.waitingCheckouts(),
      observed: observe(usage, Date.now()),
      floor: bounds.floor,
      max: bounds.max,
      growthStep: policy.growthStep,
      pressure,
    });
    this.lastDecision = { ...decision, at: Date.now() };
    return decision;
  }

  /**
   * The heartbeat's review: gives back connections the policy finds idle (a whole window unused, or
   * the last bucket's while starts wait), tells the budget, and keeps a summary in storage when it
   * changed. Returns when the next review is due, or null when none is (fixed pool, or at its floor).
   */
  async review(now: number): Promise<number | null> {
    const record = this.rt.record;
    const usage = this.usage;
    if (!record || !usage || !this.pool.isOpen) return null;
    this.keep(observe(usage, now));
    const generation = this.pool.openGeneration;
    const decision = this.decide(usage, this.pressure);
    if (decision.target < this.pool.allowance && !tenantHooksForTests.holdReview?.(record.tenantId)) {
      const bounds = this.bounds(record);
      const lowest = lowestSize(this.pool.allowance, usage.inUse, bounds.floor, bounds.max);
      const released = await this.pool.giveBackIdle(this.pool.allowance - decision.target, lowest);
      if (released > 0) {
        restartObservation(usage, Date.now());
        logEvent("info", "pool_shrunk", {
          tenant: record.tenantId,
          generation,
          released,
          size: this.pool.allowance,
          reason: decision.reason,
        });
        await this.rt
          .budget(record.host)
          .shrunk(record.host, record.tenantId, generation, released)
          .catch((error: unknown) =>
            // The ledger then counts more than the pool holds until the generation stops: safe.
            logEvent("warn", "pool_shrink_unreported", {
              tenant: record.tenantId,
              failure: describeFailure(error),
            }),
          );
      }
    }
    return this.nextReviewAt();
  }

  /**
   * Asked by the host's BudgetObject while a start or a growth waits: gives back up to `want` idle
   * connections now (under pressure, those the last bucket did not use), never a lease in use, never
   * below the floor. Answers how many it gave back; the budget lowers the ledger by as many.
   */
  async shrinkIdle(generation: number, want: number): Promise<ShrinkOutcome> {
    const record = this.rt.record;
    const usage = this.usage;
    const lc = this.rt.lifecycle;
    const none = { released: 0, report: this.pool.report() };
    if (
      !record ||
      !usage ||
      !this.pool.isOpen ||
      this.pool.openGeneration !== generation ||
      lc.state !== "ready" ||
      lc.migrating ||
      this.rt.pinned ||
      this.rt.erasing
    ) {
      return none;
    }
    const decision = this.decide(usage, { waiting: Math.max(1, this.pressure.waiting) });
    const give = Math.min(want, this.pool.allowance - decision.target);
    if (give <= 0) return none;
    const bounds = this.bounds(record);
    const lowest = lowestSize(this.pool.allowance, usage.inUse, bounds.floor, bounds.max);
    const released = await this.pool.giveBackIdle(give, lowest);
    if (released > 0) {
      restartObservation(usage, Date.now());
      logEvent("info", "pool_shrunk", {
        tenant: record.tenantId,
        generation,
        released,
        size: this.pool.allowance,
        reason: "host_pressure",
      });
    }
    return { released, report: this.pool.report() };
  }

  /** Keeps the observation's summary in storage when it changed (called by the heartbeat only). */
  private keep(observed: ObservedUse): void {
    const summary: KeptObservation = {
      at: Date.now(),
      size: this.pool.allowance,
      peak: observed.peak,
      mean: Math.round(observed.mean * 100) / 100,
      waits: observed.waits,
      refusals: observed.refusals,
    };
    const same =
      this.kept !== null &&
      this.kept.size === summary.size &&
      this.kept.peak === summary.peak &&
      this.kept.mean === summary.mean &&
      this.kept.waits === summary.waits &&
      this.kept.refusals === summary.refusals;
    // One write per heartbeat interval at most, whatever the review cadence.
    const recent = this.kept !== null && summary.at - this.kept.at < heartbeatMs;
    if (same || recent || !this.rt.storage.isOpen) return;
    this.rt.storage.write("observedUse", summary);
    this.kept = summary;
  }

  /** The pool's size, bounds and observed use, for `lessorctl status`. */
  status(): PoolSizeStatus | null {
    const record = this.rt.record;
    if (!record) return null;
    const bounds = this.bounds(record);
    const kept = this.kept ?? (this.rt.storage.isOpen ? this.rt.storage.read("observedUse") : null);
    const observed = this.usage ? observe(this.usage, Date.now()) : null;
    return {
      adaptive: bounds.adaptive,
      size: this.pool.isOpen ? this.pool.allowance : null,
      start: bounds.start,
      floor: bounds.floor,
      max: bounds.max,
      observed: observed
        ? {
            windowMs: observed.windowMs,
            coveredMs: observed.coveredMs,
            peak: observed.peak,
            recentPeak: observed.recentPeak,
            mean: Math.round(observed.mean * 100) / 100,
            waits: observed.waits,
            meanWaitMs: Math.round(observed.meanWaitMs),
            maxWaitMs: Math.round(observed.maxWaitMs),
            refusals: observed.refusals,
          }
        : null,
      lastObserved: kept
        ? { at: new Date(kept.at).toISOString(), size: kept.size, peak: kept.peak, mean: kept.mean }
        : null,
      lastDecision: this.lastDecision
        ? {
            at: new Date(this.lastDecision.at).toISOString(),
            target: this.lastDecision.target,
            reason: this.lastDecision.reason,
          }
        : null,
    };
  }
}
