/**
 * Draining and eviction. A draining generation takes no new lease and stops when its leases reach
 * zero; an operator drain reports leases held past the maximum drain time and kills them only when
 * forced. An eviction (asked by the host's BudgetObject) stops the pool only if, at that instant,
 * it is ready, unleased, unpinned and not migrating (docs/adr/003-drain-victims-not-kill.md).
 */
import { beginDrain } from "../core/lifecycle.ts";
import { logEvent } from "../log/index.ts";
import type { EvictOutcome, GenerationCheck } from "../rpc/budget.ts";
import type { TenantPool } from "./pool/index.ts";
import type { TenantRuntime } from "./runtime.ts";

/** An operator drain in progress. */
export interface DrainState {
  startedAt: number;
  overdueReported: boolean;
}

export class TenantDrain {
  private state: DrainState | null = null;

  constructor(
    private readonly rt: TenantRuntime,
    private readonly pool: TenantPool,
  ) {}

  /** The operator drain in progress, if the pool is draining because of one. */
  get current(): DrainState | null {
    return this.rt.lifecycle.state === "draining" ? this.state : null;
  }

  /**
   * Operator drain: the generation takes no new lease and stops when its leases reach zero. A lease
   * held past the maximum drain time is reported, never killed, unless `force` is set: then every
   * session lease's connection is closed (its transaction rolls back) so the drain can finish.
   */
  async drain(force: boolean): Promise<void> {
    const rt = this.rt;
    if (rt.lifecycle.state === "ready") {
      this.state = { startedAt: Date.now(), overdueReported: false };
      rt.apply(beginDrain(rt.lifecycle), force ? "operator_drain_forced" : "operator_drain");
      if (rt.record) await rt.budget(rt.record.host).draining(rt.record.tenantId, rt.lifecycle.generation);
      await rt.alarms.wakeBy(Date.now() + rt.config.maxDrainMs);
    }
    if (force && rt.lifecycle.state === "draining") {
      // Every holder of a connection lets go (kernel/holders.ts): session leases' and wire
      // connections' transactions roll back, their clients are told; flights finish.
      const { ended } = rt.holders.apply("drain_forced");
      if (ended > 0) logEvent("warn", "holders_ended_by_forced_drain", { tenant: rt.tenantId, ended });
    } else {
      rt.holders.apply("drain");
    }
    await this.finishIfIdle();
  }

  /** Finishes an operator drain once no lease is held. */
  async finishIfIdle(): Promise<void> {
    if (this.rt.lifecycle.state !== "draining" || this.pool.leases > 0) return;
    this.state = null;
    await this.pool.stop("operator_drain");
  }

  /** Reports (once) a drain that has waited past the maximum drain time for its leases. */
  reportOverdue(now: number): void {
    const drain = this.current;
    if (!drain || drain.overdueReported) return;
    const { maxDrainMs } = this.rt.config;
    if (now - drain.startedAt >= maxDrainMs && this.pool.leases > 0) {
      drain.overdueReported = true;
      this.rt.note(`drain_overdue: ${this.pool.leases} lease(s) held past ${maxDrainMs} ms`);
      logEvent("warn", "drain_overdue", { tenant: this.rt.tenantId, leases: this.pool.leases });
    }
  }

  /**
   * Asked by the BudgetObject: drain and stop this generation if, right now, it is ready, holds no
   * lease, is not pinned and is not migrating. The check and the state change happen without an
   * await in between, so a lease that arrives first makes this refuse.
   */
  async evictIfIdle(generation: number): Promise<EvictOutcome> {
    const lc = this.rt.lifecycle;
    const blocking = this.rt.holders.apply("evict").blocking;
    const eligible =
      lc.generation === generation &&
      lc.state === "ready" &&
      this.pool.leases === 0 &&
      blocking === 0 &&
      !this.rt.pinned &&
      !lc.migrating &&
      lc.rotatingTo === null &&
      this.pool.isOpen;
    if (!eligible) {
      // Refused because busy (a lease, or a holder such as the request that started the pool and
      // has not leased yet): tell the budget the moment the last one goes, so a waiting start does
      // not wait for the next heartbeat to learn this pool became idle.
      if (lc.generation === generation && (this.pool.leases > 0 || blocking > 0)) this.pool.reportWhenIdle();
      // A generation this object no longer runs holds nothing: let the budget release it.
      const gone = lc.generation !== generation && !this.pool.generations.holds(generation);
      return { evicted: gone, report: this.pool.report() };
    }
    await this.pool.stop("evicted");
    return { evicted: true, report: this.pool.report() };
  }

  /**
   * For the budget's reconcile: reclaims the leases held past their bound first (a lost release
   * must not keep the pool busy for ever), then says whether `generation` is still held and, if it
   * is the current ready one, the pool's own facts (the ledger corrects its copy from them).
   */
  checkGeneration(generation: number): GenerationCheck {
    this.pool.reclaimOverdueLeases(Date.now());
    const lc = this.rt.lifecycle;
    const current = lc.generation === generation && lc.state === "ready";
    return { holds: this.pool.generations.holds(generation), report: current ? this.pool.report() : null };
  }
}
