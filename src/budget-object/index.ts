/**
 * BudgetObject: one Durable Object per database host, the capacity authority for that host.
 *
 * Its ledger (SQLite, so it survives a restart) records every pool's allocation: reserved while
 * the pool starts, allocated once it is ready, draining while it closes. A start reserves its full
 * pool size before it opens a single connection. When the budget is full, the object asks the
 * least recently used idle pools to drain; each tenant decides atomically and refuses if it got a
 * lease in the meantime, so a leased pool is never evicted. Starts that cannot be admitted wait in
 * a bounded FIFO until a deadline, then get `capacity_saturated`.
 *
 * Adaptive hosts (docs/adr/022-adaptive-admission.md): a pool's allowance moves between its floor
 * and its tier's maximum. Every growth is admitted here like a start, in the same FIFO line (a
 * growth never jumps ahead of a waiting start); when the host is full, idle connections are first
 * taken back from under-used pools (`shrinkIdle`), and whole pools are evicted only after that.
 *
 * The admission and eviction math is in core/budget.ts; this class keeps the ledger and does I/O.
 * The host's maintenance reserve is its own room (maintenance.ts), over the same ledger.
 */
import { DurableObject } from "cloudflare:workers";
import { type BudgetSubject, budgetSubject, loadConfig } from "../config/index.ts";
import {
  type Allocation,
  type AllocationPhase,
  evictionCandidates,
  evictionDryRun,
  fits,
  planReclaim,
  poolCapacity,
  rotationFits,
  shrinkableConnections,
} from "../core/budget.ts";
import { describeMissing, type HostReport } from "../core/host-capabilities.ts";
import {
  initialTunnelHealth,
  type TunnelHealth,
  type TunnelOutcome,
  tunnelAdmission,
  tunnelOutcome,
} from "../core/tunnel.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { tenantObjectOnHost } from "../placement/index.ts";
import type {
  AdmitResult,
  CapacityStatus,
  EvictionReport,
  EvictOutcome,
  GenerationCheck,
  GrowResult,
  MaintenanceGrant,
  MaintenanceRequest,
  PoolReport,
  RepairKind,
  ShrinkOutcome,
  TunnelStatus,
} from "../rpc/budget.ts";
import { repairKinds } from "../rpc/budget.ts";
import { CapacityLedger } from "./ledger.ts";
import { MaintenanceSlots } from "./maintenance.ts";
import { HostSweep } from "./sweep.ts";
import { budgetHooksForTests } from "./test-hooks.ts";
import { WaitQueue } from "./wait-queue.ts";

interface Waiter {
  /** A pool's start, or a growth of an allocated pool by `size` (adaptive hosts). */
  kind: "start" | "grow";
  tenantId: string;
  generation: number;
  size: number;
  /** A start's floor on an adaptive host; null for a fixed-size pool. */
  floor: number | null;
  /** A growth's bound: the pool's tier's maximum (null for a start). */
  max: number | null;
}

/** What a waiter is answered: a start's admission, or a growth's. */
type WaitResult = AdmitResult | GrowResult;

/** Starts waiting for capacity at once, at most; more are refused at once. */
const maxWaiters = 1_000;
/** Victims asked per reclaim pass; bounds the work one admission can trigger. */
const maxVictimsPerPass = 8;

export class BudgetObject extends DurableObject<Env> {
  private ledgerStore: CapacityLedger | null = null;
  /** Starts waiting for room in the pools' share (served by releases and by eviction). */
  private waiters = new WaitQueue<Waiter, WaitResult>(maxWaiters);
  /** Rotations waiting for room in the rotation reserve (never served by eviction). */
  private rotationWaiters = new WaitQueue<Waiter, WaitResult>(maxWaiters);
  /** The host's maintenance reserve (maintenance.ts). */
  private readonly maintenance = new MaintenanceSlots(this.env, () => this.ledger, maxWaiters);
  private reclaiming: Promise<void> | null = null;
  /**
   * A tunnel's health (core/tunnel.ts): in memory, learnt again from the next starts after a
   * restart. Unused for a host.
   */
  private tunnelHealth: TunnelHealth = initialTunnelHealth;
  /** The host's own periodic work, in this object's alarm (sweep.ts, docs/adr/028). */
  private readonly sweep = new HostSweep(this.ctx.storage, this.env, {
    holders: () => this.ledger.rows().length + this.ledger.maintenanceRows().length,
    reconcile: (host) => this.reconcile(host),
    recordReconcile: (n) => this.recordReconcile(n),
  });

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    ctx.blockConcurrencyWhile(async () => {
      this.ledgerStore = await CapacityLedger.open(ctx.storage);
      // Restarted with pools in the ledger (a deploy killed their objects, perhaps): the host is
      // looked at for orphaned backends at the next alarm.
      const host = this.sweep.host();
      if (host !== null && this.ledger.rows().length > 0)
        await this.sweep.lookAt(host, "restarted_with_pools");
    });
  }

  /** The host's sweep (sweep.ts): the ledger reconcile, and the host work when it is due. */
  override async alarm(): Promise<void> {
    await this.sweep.run();
  }

  /**
   * Makes sure the host's sweep has an alarm (the cron's slow visit, docs/adr/028): no query to
   * the host, no tenant's object woken. Answers when the alarm fires.
   */
  async ensureSweep(hostName: string): Promise<number> {
    this.host(hostName);
    return this.sweep.ensureAlarm(hostName);
  }

  /** Asks for a look at the host at the next alarm (an operator, a test, a failed start). */
  async lookAtHost(hostName: string): Promise<void> {
    this.host(hostName);
    await this.sweep.lookAt(hostName, "asked");
  }

  private get ledger(): CapacityLedger {
    // blockConcurrencyWhile runs before any call reaches the object.
    if (!this.ledgerStore) throw new Error("budget ledger used before it was opened");
    return this.ledgerStore;
  }

  // ── RPC ────────────────────────────────────────────────────────────────────────────────────────

  /**
   * Reserves `size` connections for a starting pool, waiting up to the admission deadline. A
   * repeated admit of the same generation is granted without reserving twice. `floor` is given by
   * an adaptive pool (the fewest connections it keeps); a fixed pool gives none and is never shrunk.
   */
  async admit(
    hostName: string,
    tenantId: string,
    generation: number,
    size: number,
    floor: number | null = null,
  ): Promise<AdmitResult> {
    const host = this.host(hostName);
    if (this.ledger.isClosed(tenantId))
      return { granted: false, retryAfterMs: 5_000, waited: false, closed: true };
    if (this.ledger.find(tenantId, generation)) return { granted: true };
    // A tunnel that failed twice in a row refuses its starts at once until its cool-down passes.
    if (host.tunnel) {
      const breaker = tunnelAdmission(this.tunnelHealth, Date.now());
      if (breaker.kind === "refuse") {
        this.ledger.bump("tunnel_refused");
        return { granted: false, retryAfterMs: breaker.retryAfterMs, waited: false, tunnel: breaker.fault };
      }
    }
    // A host whose admin cannot do what Lessor needs runs no new pool (src/core/host-capabilities.ts).
    const report = this.ledger.hostReport(hostName);
    if (report && !report.verdict.fit) {
      return {
        granted: false,
        retryAfterMs: 30_000,
        waited: false,
        unfit: describeMissing(hostName, report.verdict),
      };
    }
    const adaptiveFloor = host.adaptive && floor !== null ? Math.min(floor, size) : null;
    if (this.waiters.length === 0 && fits(this.ledger.rows(), host.budget, size)) {
      this.ledger.reserve(tenantId, generation, size, adaptiveFloor);
      this.ledger.bump("admissions");
      return { granted: true };
    }
    if (this.waiters.full) {
      this.ledger.bump("saturations");
      return saturated(host, false);
    }
    const result = this.waiters.wait(
      { kind: "start", tenantId, generation, size, floor: adaptiveFloor, max: null },
      budgetHooksForTests.admissionWaitMs?.(hostName) ?? loadConfig(this.env).admissionWaitMs,
      () => {
        this.ledger.bump("saturations");
        return saturated(host, true);
      },
    );
    this.kickReclaim(host);
    return result as Promise<AdmitResult>;
  }

  /**
   * Admits a growth of an allocated adaptive pool by `by` connections (never past `max`, its tier's
   * maximum): granted at once if it fits and nothing waits; otherwise it takes its place in the
   * line starts wait in (FIFO: it never jumps ahead of a start that waited first, and while idle
   * connections are taken back for it, starts that come later wait behind it). A growth is served by
   * free room or by idle connections taken back from other pools, never by evicting a pool; when
   * nothing can serve it, it leaves the line at once, refused, rather than hold the starts behind it
   * (docs/adr/022, the fairness rule).
   */
  async grow(
    hostName: string,
    tenantId: string,
    generation: number,
    by: number,
    max: number,
  ): Promise<GrowResult> {
    const host = this.host(hostName);
    const row = this.ledger.find(tenantId, generation);
    const step = row ? Math.min(by, max - row.size) : 0;
    if (!host.adaptive || !row || row.phase !== "allocated" || step <= 0 || this.ledger.isClosed(tenantId)) {
      return { granted: false, reason: "not_allocated", waiting: this.waiters.length };
    }
    if (this.waiters.length === 0 && fits(this.ledger.rows(), host.budget, step)) {
      this.ledger.resize(tenantId, generation, step);
      this.ledger.bump("growths", step);
      return { granted: true, by: step };
    }
    const refused = (reason: "saturated" | "starts_waiting"): GrowResult => {
      this.ledger.bump("growths_refused");
      return { granted: false, reason, waiting: this.waiters.length };
    };
    if (this.waiters.full) return refused("starts_waiting");
    const result = this.waiters.wait(
      { kind: "grow", tenantId, generation, size: step, floor: null, max },
      budgetHooksForTests.admissionWaitMs?.(hostName) ?? loadConfig(this.env).admissionWaitMs,
      () => refused("starts_waiting"),
    );
    this.kickReclaim(host);
    return result as Promise<GrowResult>;
  }

  /**
   * An adaptive pool closed `released` idle connections and lowered its allowance by as many (its
   * own review found them idle for a whole window): the ledger gives them to whoever waits.
   */
  async shrunk(hostName: string, tenantId: string, generation: number, released: number): Promise<void> {
    if (released <= 0 || !this.ledger.find(tenantId, generation)) return;
    this.ledger.resize(tenantId, generation, -released);
    this.ledger.bump("shrinks", released);
    this.serveWaiters(this.host(hostName));
  }

  /**
   * Reserves `size` connections for a credential rotation's new generation of a tenant whose
   * current generation stays open meanwhile: admitted against the pools' share plus the host's
   * rotation reserve (core/budget.ts `rotationFits`). It waits up to `waitMs` for a release, in FIFO
   * order, and never asks a pool to drain for it: a rotation is never worth an eviction.
   */
  async admitRotation(
    hostName: string,
    tenantId: string,
    generation: number,
    size: number,
    waitMs: number,
    floor: number | null = null,
  ): Promise<AdmitResult> {
    const host = this.host(hostName);
    if (this.ledger.find(tenantId, generation)) return { granted: true };
    const adaptiveFloor = host.adaptive && floor !== null ? Math.min(floor, size) : null;
    if (this.rotationWaiters.length === 0 && rotationFits(this.ledger.rows(), host.budget, size)) {
      this.ledger.reserve(tenantId, generation, size, adaptiveFloor);
      this.ledger.bump("rotations_admitted");
      return { granted: true };
    }
    if (waitMs <= 0 || this.rotationWaiters.full) {
      this.ledger.bump("rotations_refused");
      return saturated(host, false);
    }
    return this.rotationWaiters.wait(
      { kind: "start", tenantId, generation, size, floor: adaptiveFloor, max: null },
      waitMs,
      () => {
        this.ledger.bump("rotations_refused");
        return saturated(host, true);
      },
    ) as Promise<AdmitResult>;
  }

  /** The pool of this generation is open and ready. */
  async confirm(hostName: string, tenantId: string, generation: number, report: PoolReport): Promise<void> {
    const hook = budgetHooksForTests.onConfirm;
    if (hook) await hook(tenantId, generation, "reached");
    this.ledger.setPhase(tenantId, generation, "allocated", report);
    // Starts that found only starting pools to evict can now be served by this one, once idle.
    if (this.waiters.length > 0 && report.leases === 0) this.kickReclaim(this.host(hostName));
    // A live pool: the ledger is reconciled every minute from the alarm while it runs.
    await this.sweep.ensureAlarm(hostName);
    if (hook) await hook(tenantId, generation, "recorded");
  }

  /**
   * Fresh facts about a pool, for victim selection (sent from the tenant's heartbeat). Answers how
   * many starts and growths wait on the host: the pressure an adaptive pool's review weighs.
   */
  async report(
    hostName: string,
    tenantId: string,
    generation: number,
    report: PoolReport,
  ): Promise<{ waiting: number }> {
    const current = this.ledger.find(tenantId, generation);
    if (current) this.ledger.setPhase(tenantId, generation, current.phase, report);
    // A pool that just became idle (or holds idle connections) may be what a waiter needs.
    if (this.waiters.length > 0 && (report.leases === 0 || (current && shrinkableConnections(current) > 0)))
      this.kickReclaim(this.host(hostName));
    return { waiting: this.waiters.length };
  }

  /** The pool is draining: its connections still count until `release`. */
  async draining(tenantId: string, generation: number): Promise<void> {
    const current = this.ledger.find(tenantId, generation);
    if (current) this.ledger.setPhase(tenantId, generation, "draining", null);
  }

  /** The pool's connections are closed (or were never opened). Idempotent. */
  async release(hostName: string, tenantId: string, generation: number): Promise<void> {
    const had = this.ledger.find(tenantId, generation) !== undefined;
    this.ledger.remove(tenantId, generation);
    this.serveWaiters(this.host(hostName));
    // A pool stopped (or a start gave its reservation back): its host is looked at once, soon.
    if (had) await this.sweep.lookAt(hostName, "pool_stopped");
  }

  /**
   * An erase closed the tenant's gate: from now on no pool of it is admitted (a start already
   * granted keeps its allocation until the erase stops the pool and calls `releaseTenant`).
   * Idempotent.
   */
  async closeTenant(tenantId: string): Promise<void> {
    this.ledger.close(tenantId);
    this.waiters.settleWhere((w) => w.tenantId === tenantId, {
      granted: false,
      retryAfterMs: 5_000,
      waited: true,
      closed: true,
    });
  }

  /**
   * Releases every allocation of a tenant, whatever its generation (an erase, once its pool is
   * stopped: nothing of the tenant may stay in the ledger). Idempotent; says how many there were.
   */
  async releaseTenant(hostName: string, tenantId: string): Promise<number> {
    const released = this.ledger.removeTenant(tenantId);
    if (released > 0) this.serveWaiters(this.host(hostName));
    return released;
  }

  /** Forgets that a tenant was closed (an erase's last step in the ledger). Idempotent. */
  async reopenTenant(tenantId: string): Promise<boolean> {
    return this.ledger.reopen(tenantId);
  }

  /**
   * Reserves one maintenance connection from the host's reserve, waiting up to `waitMs` in FIFO
   * order. Pools never use the reserve and maintenance never uses the pools' share, so the two
   * together never exceed the host's connections. The holder releases it when done; a holder that
   * died is reclaimed when its `holdMs` runs out.
   */
  async acquireMaintenance(hostName: string, request: MaintenanceRequest): Promise<MaintenanceGrant> {
    const grant = await this.maintenance.acquire(this.host(hostName), request);
    // A holder that dies is reclaimed by the alarm's reconcile.
    if (grant.granted) await this.sweep.ensureAlarm(hostName);
    // The holder learns the host's last report with its slot: no second call to know whether to probe.
    return grant.granted ? { ...grant, hostReport: this.ledger.hostReport(hostName) } : grant;
  }

  /** What the last probe of the host's admin role found, or null before the first. */
  async hostReport(hostName: string): Promise<HostReport | null> {
    return this.ledger.hostReport(this.host(hostName).name);
  }

  /** Keeps a probe's report (src/tenant-db/capabilities.ts); from now on admissions follow its verdict. */
  async recordHostReport(hostName: string, report: HostReport): Promise<void> {
    const before = this.ledger.hostReport(this.host(hostName).name);
    this.ledger.recordHostReport(hostName, report);
    if (before?.verdict.fit !== report.verdict.fit) {
      logEvent(report.verdict.fit ? "info" : "error", "host_capabilities", {
        host: hostName,
        fit: report.verdict.fit,
        containment: report.verdict.containment,
        missing: report.verdict.missing.map((m) => m.capability),
      });
    }
  }

  /**
   * What a connection attempt through this tunnel taught (a pool start, the attach probe): it
   * carried us to the server (`ok`, even if the server then refused the credential), or it timed out
   * (`slow`) or was refused or cut (`down`). Two failures in a row open the breaker (core/tunnel.ts).
   */
  async recordTunnelOutcome(name: string, outcome: TunnelOutcome): Promise<void> {
    if (!this.host(name).tunnel) return;
    const before = this.tunnelHealth;
    this.tunnelHealth = tunnelOutcome(before, outcome, Date.now(), Math.random());
    if (outcome !== "ok") this.ledger.bump(outcome === "slow" ? "tunnel_slow" : "tunnel_down");
    if (before.state !== this.tunnelHealth.state) {
      logEvent(outcome === "ok" ? "info" : "warn", "tunnel_health", {
        tunnel: name,
        state: this.tunnelHealth.state,
        failures: this.tunnelHealth.consecutiveFailures,
      });
    }
  }

  /** A maintenance slot's holder is alive: the slot expires `holdMs` from now. False if it is gone. */
  async renewMaintenance(_hostName: string, leaseId: string, holdMs: number): Promise<boolean> {
    return this.maintenance.renew(leaseId, holdMs);
  }

  /** The maintenance connection is closed. Idempotent. */
  async releaseMaintenance(hostName: string, leaseId: string): Promise<void> {
    this.maintenance.release(this.host(hostName), leaseId);
  }

  /**
   * Counts repairs a pool made to its own accounting (an overdue lease reclaimed, a close forced
   * past its bound): each is a defect caught, so it is counted where operators look (`/metrics`).
   */
  async recordRepairs(repair: RepairKind, count: number): Promise<void> {
    if (count > 0) this.ledger.bump(repair, count);
  }

  /** Counts what the cron reconcile found on the host itself (orphaned backends it terminated). */
  async recordReconcile(orphansTerminated: number): Promise<void> {
    for (let i = 0; i < orphansTerminated; i++) this.ledger.bump("orphans_terminated");
  }

  /** Per-host capacity for `GET /v1/capacity`: counts, and only the first few eviction candidates. */
  async status(hostName: string, candidateLimit = 5): Promise<CapacityStatus> {
    const host = this.host(hostName);
    const allocations = this.ledger.rows();
    const sum = (phase: AllocationPhase) =>
      allocations.filter((a) => a.phase === phase).reduce((n, a) => n + a.size, 0);
    const count = (phase: AllocationPhase) => allocations.filter((a) => a.phase === phase).length;
    const now = Date.now();
    return {
      host: hostName,
      budget: host.budget.connections,
      reserve: host.budget.reserve,
      rotationReserve: host.budget.rotationReserve ?? 0,
      poolCapacity: poolCapacity(host.budget),
      rotations: {
        admitted: this.ledger.counter("rotations_admitted"),
        refused: this.ledger.counter("rotations_refused"),
        waiting: this.rotationWaiters.length,
      },
      allocated: sum("allocated"),
      reserved: sum("reserved"),
      draining: sum("draining"),
      pools: { reserved: count("reserved"), allocated: count("allocated"), draining: count("draining") },
      waiters: this.waiters.length,
      evictions: this.ledger.counter("evictions"),
      saturations: this.ledger.counter("saturations"),
      admissions: this.ledger.counter("admissions"),
      leases: allocations.reduce((n, a) => n + a.leases, 0),
      pooled: pooledConnections(allocations),
      adaptive: {
        enabled: host.adaptive !== null,
        policy: host.adaptive,
        growths: this.ledger.counter("growths"),
        growthsRefused: this.ledger.counter("growths_refused"),
        shrinks: this.ledger.counter("shrinks"),
        reclaimShrinks: this.ledger.counter("reclaim_shrinks"),
      },
      maintenance: this.maintenance.status(),
      capabilities: host.tunnel ? null : this.ledger.hostReport(hostName),
      tunnel: host.tunnel ? this.tunnelStatus(host) : null,
      reconciled: {
        allocationsReleased: this.ledger.counter("allocations_released"),
        orphansTerminated: this.ledger.counter("orphans_terminated"),
        maintenanceExpired: this.ledger.counter("maintenance_expired"),
        ...Object.fromEntries(repairKinds.map((kind) => [kind, this.ledger.counter(kind)])),
      } as CapacityStatus["reconciled"],
      candidates: evictionCandidates(allocations)
        .slice(0, candidateLimit)
        .map((a) => ({
          tenantId: a.tenantId,
          generation: a.generation,
          size: a.size,
          idleMs: a.idleSince === null ? 0 : Math.max(0, now - a.idleSince),
          leases: a.leases,
          pinned: a.pinned,
        })),
    };
  }

  /** A tunnel's health and what it refused, for `GET /v1/capacity`. */
  private tunnelStatus(subject: BudgetSubject): TunnelStatus {
    const health = this.tunnelHealth;
    const iso = (at: number | null) => (at === null ? null : new Date(at).toISOString());
    const now = Date.now();
    return {
      name: subject.tunnel?.name ?? subject.name,
      health: health.state,
      breaker: tunnelAdmission(health, now).kind === "refuse" ? "open" : "closed",
      consecutiveFailures: health.consecutiveFailures,
      openUntil: health.openUntil !== null && health.openUntil > now ? iso(health.openUntil) : null,
      lastOkAt: iso(health.lastOkAt),
      lastFailureAt: iso(health.lastFailureAt),
      failures: { slow: this.ledger.counter("tunnel_slow"), down: this.ledger.counter("tunnel_down") },
      refusedByBreaker: this.ledger.counter("tunnel_refused"),
    };
  }

  /**
   * What an admission of `size` connections would evict right now, and why every other pool is
   * spared (`lessorctl evict --dry-run`). Reads the ledger only: nothing is asked to drain.
   */
  async evictionReport(hostName: string, size: number): Promise<EvictionReport> {
    const host = this.host(hostName);
    const now = Date.now();
    const report = evictionDryRun(this.ledger.rows(), host.budget, size);
    return {
      host: hostName,
      budget: host.budget.connections,
      reserve: host.budget.reserve,
      waiters: this.waiters.length,
      size: report.size,
      poolCapacity: report.poolCapacity,
      used: report.used,
      draining: report.draining,
      outcome: report.outcome,
      pools: report.pools.map((p) => ({
        tenantId: p.allocation.tenantId,
        generation: p.allocation.generation,
        size: p.allocation.size,
        phase: p.allocation.phase,
        idleMs: p.allocation.idleSince === null ? null : Math.max(0, now - p.allocation.idleSince),
        leases: p.allocation.leases,
        pinned: p.allocation.pinned,
        migrating: p.allocation.migrating,
        verdict: p.verdict,
        order: p.verdict === "evict" || p.verdict === "shrink" ? p.order : null,
        take: p.verdict === "shrink" ? p.take : null,
        reason: p.verdict === "not_eligible" ? p.reason : null,
      })),
    };
  }

  /**
   * Repairs the ledger from the pools' own truth, for every allocation quiet for `olderThanMs`:
   * one whose tenant object no longer holds the generation (an object that died, a start that
   * never finished, a close that was forced) is released; one whose lease count differs from the
   * pool's own is corrected (the pool first reclaims leases held past their bound, so a lost
   * release cannot keep a pool busy for ever), and so is one left `draining` by an eviction whose
   * answer was lost to a reset while the pool still runs. Each repair is counted and logged. Run by the cron
   * trigger; safe to run at any time.
   */
  async reconcile(
    hostName: string,
    olderThanMs = 30_000,
  ): Promise<{ checked: number; released: number; corrected: number; maintenanceExpired: number }> {
    const cutoff = Date.now() - olderThanMs;
    const maintenanceExpired = await this.maintenance.reclaim(this.host(hostName), cutoff);
    const stale = this.ledger.rows().filter((row) => row.updatedAt < cutoff);
    let released = 0;
    let corrected = 0;
    for (const row of stale) {
      let check: GenerationCheck;
      try {
        check = await tenantObjectOnHost(this.env, hostName, row.tenantId).checkGeneration(row.generation);
      } catch (error) {
        logEvent("warn", "budget_reconcile_probe_failed", {
          host: hostName,
          tenant: row.tenantId,
          failure: describeFailure(error),
        });
        continue;
      }
      // The row may have changed (or gone) while the object answered.
      const now = this.ledger.find(row.tenantId, row.generation);
      if (!now) continue;
      if (!check.holds) {
        await this.release(hostName, row.tenantId, row.generation);
        this.ledger.bump("allocations_released");
        released++;
        continue;
      }
      if (check.report && now.phase === "draining") {
        // The pool is ready, yet the ledger says draining: an eviction was asked and its answer
        // never came back (this object was reset in between). Such a row is never evicted, shrunk
        // or counted as idle, so put it back to what the pool says it is.
        logEvent("warn", "budget_phase_corrected", {
          host: hostName,
          tenant: row.tenantId,
          generation: row.generation,
          ledger: now.phase,
        });
        this.ledger.setPhase(row.tenantId, row.generation, "allocated", check.report);
        this.ledger.bump("phase_corrected");
        corrected++;
        continue;
      }
      if (check.report && check.report.leases !== now.leases) {
        logEvent("warn", "budget_lease_count_corrected", {
          host: hostName,
          tenant: row.tenantId,
          generation: row.generation,
          ledger: now.leases,
          pool: check.report.leases,
        });
        this.ledger.setPhase(row.tenantId, row.generation, now.phase, check.report);
        this.ledger.bump("lease_count_corrected");
        corrected++;
      }
    }
    if (released + corrected > 0)
      logEvent("info", "budget_reconciled", { host: hostName, released, corrected });
    if (corrected > 0) this.serveWaiters(this.host(hostName));
    return { checked: stale.length, released, corrected, maintenanceExpired };
  }

  // ── Waiters and reclaim ────────────────────────────────────────────────────────────────────────

  /** Grants waiters in FIFO order while the head fits, then reclaims for the rest. */
  private serveWaiters(host: BudgetSubject): void {
    this.rotationWaiters.serveWhile((head) =>
      rotationFits(this.ledger.rows(), host.budget, head.size)
        ? this.reserveFor(head, "rotations_admitted")
        : null,
    );
    this.grantFitting(host);
    if (this.waiters.length > 0) this.kickReclaim(host);
  }

  /** Grants waiters in FIFO order while the head fits. Never starts a reclaim (reclaim calls it). */
  private grantFitting(host: BudgetSubject): void {
    this.waiters.serveWhile((head) => {
      if (head.kind === "grow") {
        // The pool stopped (or was evicted) while its growth waited: nothing to grow.
        const row = this.ledger.find(head.tenantId, head.generation);
        // The tier's maximum, again: the pool may have changed while its growth waited.
        const step = row ? Math.min(head.size, (head.max ?? row.size) - row.size) : 0;
        if (row?.phase !== "allocated" || step <= 0)
          return { granted: false, reason: "not_allocated", waiting: this.waiters.length - 1 };
        if (!fits(this.ledger.rows(), host.budget, step)) return null;
        this.ledger.resize(head.tenantId, head.generation, step);
        this.ledger.bump("growths", step);
        return { granted: true, by: step };
      }
      return fits(this.ledger.rows(), host.budget, head.size) ? this.reserveFor(head, "admissions") : null;
    });
  }

  /** Reserves a served waiter's connections (once, if a repeated admit already did) and grants it. */
  private reserveFor(waiter: Waiter, counter: "admissions" | "rotations_admitted"): AdmitResult {
    if (!this.ledger.find(waiter.tenantId, waiter.generation)) {
      this.ledger.reserve(waiter.tenantId, waiter.generation, waiter.size, waiter.floor);
      this.ledger.bump(counter);
    }
    return { granted: true };
  }

  private kickReclaim(host: BudgetSubject): void {
    this.reclaiming ??= this.reclaim(host).finally(() => {
      this.reclaiming = null;
    });
  }

  /**
   * Makes room for the head waiter, one step at a time (core/budget.ts `planReclaim`): idle
   * connections taken back from under-used adaptive pools first, then, for a start only, least
   * recently used idle pools asked to drain. Each pool decides atomically and never gives up a lease
   * in use; a refusal just moves on to the next. A growth nothing can serve leaves the line refused.
   */
  private async reclaim(host: BudgetSubject): Promise<void> {
    const refused = new Set<string>();
    for (let pass = 0; pass < maxVictimsPerPass && this.waiters.length > 0; pass++) {
      this.grantFitting(host);
      const head = this.waiters.head();
      if (!head) return;
      // Refused victims still hold their connections: they stay in the count, marked as neither
      // shrinkable nor evictable for the rest of this reclaim.
      const allocations = this.ledger
        .rows()
        .map((a) =>
          refused.has(`${a.tenantId}:${a.generation}`)
            ? { ...a, leases: Math.max(1, a.leases), floor: null }
            : a,
        );
      const plan = planReclaim(allocations, host.budget, head.size, {
        excludeTenant: head.tenantId,
        allowEviction: head.kind === "start",
      });
      const step = plan?.[0];
      if (!step) {
        if (plan === null && head.kind === "grow") {
          // Nothing can serve this growth now: it must not hold the starts behind it.
          this.ledger.bump("growths_refused");
          this.waiters.settleHead({ granted: false, reason: "saturated", waiting: this.waiters.length - 1 });
          continue;
        }
        return; // nothing to reclaim now: wait for a release or the deadline
      }
      const victim = step.allocation;
      const key = `${victim.tenantId}:${victim.generation}`;
      if (step.kind === "shrink") {
        let outcome: ShrinkOutcome | null;
        try {
          outcome = await tenantObjectOnHost(this.env, host.name, victim.tenantId).shrinkIdle(
            victim.generation,
            step.take,
          );
        } catch (error) {
          logEvent("warn", "budget_shrink_failed", {
            tenant: victim.tenantId,
            failure: describeFailure(error),
          });
          outcome = null;
        }
        const released = outcome?.released ?? 0;
        if (released > 0 && this.ledger.find(victim.tenantId, victim.generation)) {
          this.ledger.resize(victim.tenantId, victim.generation, -released);
          this.ledger.bump("reclaim_shrinks", released);
        }
        if (outcome && this.ledger.find(victim.tenantId, victim.generation)) {
          const row = this.ledger.find(victim.tenantId, victim.generation);
          if (row) this.ledger.setPhase(victim.tenantId, victim.generation, row.phase, outcome.report);
        }
        if (released < step.take) refused.add(key);
        continue;
      }
      let outcome: EvictOutcome | null;
      try {
        this.ledger.setPhase(victim.tenantId, victim.generation, "draining", null);
        outcome = await tenantObjectOnHost(this.env, host.name, victim.tenantId).evictIfIdle(
          victim.generation,
        );
      } catch (error) {
        // Not an answer about the pool: nothing is learned about its leases (the reconcile asks
        // again later). It is only passed over for the rest of this reclaim.
        logEvent("warn", "budget_evict_failed", { tenant: victim.tenantId, failure: describeFailure(error) });
        outcome = null;
      }
      if (outcome?.evicted) {
        this.ledger.bump("evictions");
        this.ledger.remove(victim.tenantId, victim.generation);
      } else {
        refused.add(key);
        if (this.ledger.find(victim.tenantId, victim.generation)) {
          this.ledger.setPhase(victim.tenantId, victim.generation, "allocated", outcome?.report ?? null);
        }
      }
    }
    this.grantFitting(host);
  }

  // ── Hosts and tunnels ──────────────────────────────────────────────────────────────────────────

  /** The host, or the customer's tunnel (`tunnel:<name>`), this object budgets. */
  private host(hostName: string): BudgetSubject {
    const subject = budgetSubject(loadConfig(this.env), hostName);
    if (!subject) throw new Error(`unknown host or tunnel ${hostName}`);
    return subject;
  }
}

/**
 * The host's pooled connections by use, from the ledger: in use (leases, as last reported, at most
 * a pool's size) against idle (the rest of allocated pools' allowances), and how far pools have
 * grown past or shrunk below the size they started at.
 */
function pooledConnections(allocations: readonly Allocation[]): CapacityStatus["pooled"] {
  const allocated = allocations.filter((a) => a.phase === "allocated");
  const inUse = allocated.reduce((n, a) => n + Math.min(a.leases, a.size), 0);
  const held = allocated.reduce((n, a) => n + a.size, 0);
  return {
    inUse,
    idle: held - inUse,
    grown: allocations.reduce((n, a) => n + Math.max(0, a.size - (a.startSize ?? a.size)), 0),
    shrunk: allocations.reduce((n, a) => n + Math.max(0, (a.startSize ?? a.size) - a.size), 0),
    adaptivePools: allocations.filter((a) => a.floor !== null && a.floor !== undefined).length,
  };
}

/**
 * A start or rotation that found no room: on a host `capacity_saturated`, on a tunnel
 * `tunnel_unavailable` (full), which only the tenants behind it ever see.
 */
function saturated(subject: BudgetSubject, waited: boolean): AdmitResult {
  return {
    granted: false,
    retryAfterMs: 1_000,
    waited,
    ...(subject.tunnel ? { tunnel: "full" as const } : {}),
  };
}
