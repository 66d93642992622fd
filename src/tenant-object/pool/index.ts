/**
 * The tenant's pool: admission, the single-flight start of a generation, the lease count and its
 * overdue reclaim, checkout, the last use, and what the host's budget is told. The generations it
 * holds (the current one, one a rotation replaced, those closing: install, switch, retire, stop) are
 * generations.ts; one generation's connections of two kinds and their checkout generation.ts; a
 * generation's start, step by step, start.ts; opening its connections open.ts; the lease count
 * leases.ts; the size on an adaptive host sizing.ts.
 *
 * Single flight: input gates do not cover Postgres I/O, so two requests can both see `stopped`.
 * The in-memory `starting` promise makes the second join the first; the persisted generation makes
 * a restarted object start a new generation instead of pretending the old pool is alive.
 *
 * Capacity: a start reserves its pool size from the host's BudgetObject before it opens a
 * connection, and the allocation is released only after the pool's connections are closed. On an
 * adaptive host the size then moves (sizing.ts): every growth is admitted before the driver pool may
 * open more, and connections are closed before the budget gets them back.
 *
 * End users (JWT mode, docs/adr/012-end-user-jwts.md) get connections of their own from a second
 * pool of the same generation; the two share the generation's size (generation.ts).
 */
import type { PoolClient } from "@neondatabase/serverless";
import { admitDecision, leaseOverdueAfterMs } from "../../core/lifecycle.ts";
import { LessorError } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import type { ConnectionTarget } from "../../postgres/index.ts";
import { OpeningGate } from "../../postgres/opening-gate.ts";
import type { PoolReport } from "../../rpc/budget.ts";
import type { TenantRecord } from "../../rpc/tenant.ts";
import { gateError } from "../kernel/gate.ts";
import type { TenantRuntime } from "../runtime.ts";
import { TenantCredentials } from "./credentials.ts";
import type { ConnectionKind, Generation } from "./generation.ts";
import { flushEventsSoon, Generations, type PoolRepair } from "./generations.ts";
import { LeaseBook, type LeaseKind } from "./leases.ts";
import { GenerationOpener } from "./open.ts";
import { PoolSizing, type SizedPool } from "./sizing.ts";
import { GenerationStart, type StartedGeneration, startFailureError } from "./start.ts";

export { type ConnectionKind, CredentialMoved } from "./generation.ts";
export type { PoolRepair, PreparedGeneration } from "./generations.ts";
export type { LeaseKind } from "./leases.ts";

/** A lease on a generation: the generation to check a connection out of, and where it points. */
export interface LiveLease {
  /** The lease's entry in the pool's registry: releasing it a second time changes nothing. */
  id: number;
  generation: number;
  /** The generation the lease was taken on (a rotation's switch leaves it on the one it had). */
  of: Generation;
  /** The database the pool connects to (a cancel request goes there too). */
  target: ConnectionTarget;
}

export class TenantPool implements SizedPool {
  private starting: Promise<void> | null = null;
  /** The leases of the current generation and of the retiring one (leases.ts). */
  private readonly leaseBook = new LeaseBook();
  private idleSince: number | null = null;
  private lastUsed: number | null = null;
  private lastUsedPersisted: number | null = null;
  /** Set when this pool refused an eviction because it was busy; cleared by the next idle report. */
  private budgetWaitsForIdle = false;

  /** The tenant role's credential and the host-admin work done with it (repair, fence, terminate). */
  readonly credentials: TenantCredentials;
  /** Opens a generation's connections: control-plane claim, driver pool, proof, maintenance. */
  readonly opener: GenerationOpener;
  /** The pool's size on an adaptive host: observed use, growth and shrink (sizing.ts). */
  readonly sizing: PoolSizing;
  /** A generation's start, step by step (start.ts). */
  private readonly starter: GenerationStart;
  /** The current generation, the one a rotation replaced, and those closing (generations.ts). */
  readonly generations: Generations;

  constructor(
    readonly rt: TenantRuntime,
    private readonly hooks: {
      /** The running migration's end, if one runs (admission waits on it, bounded). */
      migrationDone: () => Promise<void> | null;
      /** The last lease was released. */
      onIdle: () => void;
      /** A credential change in progress, if one is (a start waits for it, bounded by its deadline). */
      credentialChange: () => Promise<unknown> | null;
      /** A retiring generation stopped: its credential's guard key may go. */
      onRetired: (generation: number) => void;
      /** The pool repaired its own accounting (counted on the host's budget, logged as an event). */
      onRepair: (repair: PoolRepair, count: number) => void;
    },
  ) {
    this.credentials = new TenantCredentials(rt);
    this.opener = new GenerationOpener(
      rt,
      this.credentials,
      (generation, error) => this.generations.onPoolError(generation, error),
      new OpeningGate(),
    );
    this.sizing = new PoolSizing(rt, this);
    this.starter = new GenerationStart(rt, this);
    this.generations = new Generations(rt, this.credentials, this.opener, this.sizing, this.leaseBook, {
      credentialChange: hooks.credentialChange,
      onRetired: hooks.onRetired,
      onRepair: hooks.onRepair,
      onServe: (how) => {
        this.idleSince = Date.now();
        if (how === "switch") this.lastUsed = Date.now();
      },
      onStopping: () => {
        this.idleSince = null;
        this.persistLastUsed();
      },
    });
  }

  /** A started generation becomes the one leases go to (start.ts, in the turn it came up). */
  install(started: StartedGeneration): void {
    this.generations.install(started);
  }

  /** Stops the current generation, if it is still the lifecycle's (generations.ts). */
  stop(reason: string): Promise<void> {
    return this.generations.stop(reason);
  }

  get leases(): number {
    return this.leaseBook.size;
  }

  get lastUsedAt(): number | null {
    return this.lastUsed;
  }

  /**
   * A request used the pool. The first use an instance of the object sees is kept at once (one
   * storage write per instance), so a deploy or a reset right after it cannot lose it; later ones
   * are kept by the heartbeat.
   */
  private touch(): void {
    this.lastUsed = Date.now();
    if (this.lastUsedPersisted === null) this.persistLastUsed();
  }

  /**
   * Keeps the last use in storage when it changed: from the heartbeat (at most one write per beat)
   * and when the pool stops; on the request path only the first use of an instance (`touch`).
   * Without it, an object evicted after its pool's idle stop answered `lastUsedAt: null` minutes
   * after the tenant's last request.
   */
  persistLastUsed(): void {
    if (this.lastUsed === null || this.lastUsed === this.lastUsedPersisted || !this.rt.storage.isOpen) return;
    this.rt.storage.write("lastUsed", this.lastUsed);
    this.lastUsedPersisted = this.lastUsed;
  }

  /** The last use a previous instance of the object kept (see {@link persistLastUsed}). */
  restoreLastUsed(): void {
    const kept = this.rt.storage.read("lastUsed");
    if (kept !== null && (this.lastUsed === null || kept > this.lastUsed)) {
      this.lastUsed = kept;
      this.lastUsedPersisted = kept;
    }
  }

  /** A session lease ran a statement: the pool is in use even though no new lease was taken. */
  markUsed(): void {
    this.touch();
  }

  /** When the ready pool last became idle (null while leased or not ready). */
  get idleSinceReady(): number | null {
    return this.rt.lifecycle.state === "ready" ? this.idleSince : null;
  }

  /** Whether a pool of the current generation is open. */
  get isOpen(): boolean {
    return this.generations.current() !== null;
  }

  // ── Size (adaptive admission: sizing.ts decides, these apply) ──────────────────────────────────

  /** The generation whose pool is open. */
  get openGeneration(): number {
    return this.generations.latest?.number ?? 0;
  }

  /** Connections the current generation may hold, both kinds together: what its ledger row holds. */
  get allowance(): number {
    return this.generations.latest?.allowance ?? 1;
  }

  /** Checkouts waiting now because every connection of the generation is in use. */
  waitingCheckouts(): number {
    return this.generations.current()?.waitingCheckouts() ?? 0;
  }

  /** The host admitted `by` more connections: the driver pools may open them now. */
  raiseAllowance(by: number): void {
    this.generations.current()?.raiseAllowance(by);
  }

  /** Closes idle connections for `want` of allowance, never below `lowest` (generation.ts). */
  async giveBackIdle(want: number, lowest: number): Promise<number> {
    return (await this.generations.current()?.giveBackIdle(want, lowest)) ?? 0;
  }

  // ── Leases ─────────────────────────────────────────────────────────────────────────────────────

  /** A lease on a ready generation, starting one (once, however many ask) if there is none. */
  async acquire(record: TenantRecord, kind: LeaseKind = "sql"): Promise<LiveLease> {
    // Bounded: each pass returns, throws, or waits on something that itself settles.
    for (let attempt = 0; attempt < 4; attempt++) {
      // An erase's gate or a move's fence closed (maybe while this request waited behind a
      // start): no new lease. The gate's table says so (kernel/gate.ts, purpose `acquire`).
      const refused = gateError(this.rt, "acquire", null);
      if (refused) throw refused;
      const decision = admitDecision(this.rt.lifecycle, Date.now());
      switch (decision.kind) {
        case "use": {
          const live = this.generations.current();
          if (!live || live.number !== this.rt.lifecycle.generation) break;
          const id = this.leaseBook.take(
            kind,
            live.number,
            Date.now(),
            leaseOverdueAfterMs(kind, this.rt.config),
          );
          this.idleSince = null;
          this.touch();
          this.sizing.onLeases(this.leaseBook.size);
          return { id, generation: live.number, of: live, target: live.target };
        }
        case "start":
        case "join_start": {
          // A stopped tenant's credential being changed: start under the new one, not a race with it.
          const change = this.hooks.credentialChange();
          if (change && decision.kind === "start") {
            await change.catch(() => undefined);
            break;
          }
          this.starting ??= this.starter.start(record).finally(() => {
            this.starting = null;
          });
          await this.starting;
          break;
        }
        case "wait_migration": {
          const done = this.hooks.migrationDone();
          if (done) await Promise.race([done, sleep(this.rt.config.admissionWaitMs)]);
          if (this.rt.lifecycle.migrating) {
            throw new LessorError("tenant_migrating", { retryAfterSeconds: 2 });
          }
          break;
        }
        case "refuse_backoff":
          // Retrying will not help until the operator fixes the configuration: say so.
          if (decision.reason === "misconfigured") {
            throw new LessorError("misconfigured", { internal: "start failed (misconfigured); backing off" });
          }
          throw startFailureError(record, decision.reason, decision.retryAfterMs / 1000);
        case "refuse_draining":
          throw new LessorError("tenant_draining", { retryAfterSeconds: 1 });
      }
    }
    throw new LessorError("tenant_starting_failed", {
      internal: "pool did not become ready",
      retryAfterSeconds: 1,
    });
  }

  /**
   * What ends the work of `lease` if it is ever reclaimed as overdue (its connection, cut): whoever
   * waits on that work then fails and releases, instead of waiting for ever.
   */
  onAbandon(lease: LiveLease, abandon: () => void): void {
    this.leaseBook.onAbandon(lease.id, abandon);
  }

  /** Ends a lease (of the current generation, or of the retiring one). A second release is a no-op. */
  release(lease: Pick<LiveLease, "id">): void {
    const where = this.leaseBook.release(lease.id);
    if (where === "retiring") {
      if (this.leaseBook.retiringSize === 0) this.generations.retiringDrained();
    } else if (where === "current") {
      this.sizing.onLeases(this.leaseBook.size);
      this.afterRelease();
    }
  }

  /**
   * Reclaims every lease held past its bound, which nothing legitimate does (a `/sql` request is
   * bounded by its checkout wait and statement bound, a session lease by its lifetime): a lease
   * whose release was lost would otherwise keep its generation from ever going idle, its pool from
   * ever stopping, and its budget from ever coming back. Each is logged as an event and counted.
   * Says how many were reclaimed.
   */
  reclaimOverdueLeases(now: number): number {
    const before = this.leaseBook.size;
    const swept = this.leaseBook.sweep(now);
    for (const lease of swept.reclaimed) {
      logEvent("error", "lease_reclaimed", {
        tenant: this.rt.tenantId,
        generation: lease.generation,
        kind: lease.kind,
        heldMs: now - lease.since,
      });
      this.rt.note(
        `lease_reclaimed: a ${lease.kind} lease of generation ${lease.generation} held ${now - lease.since} ms`,
      );
      try {
        lease.abandon?.();
      } catch {
        // Its connection is already gone.
      }
    }
    if (swept.retiringEmpty) this.generations.retiringDrained();
    if (this.leaseBook.size !== before) this.sizing.onLeases(this.leaseBook.size);
    if (swept.currentEmptied) this.afterRelease();
    const reclaimed = swept.reclaimed.length;
    if (reclaimed > 0) {
      this.hooks.onRepair("lease_reclaimed", reclaimed);
      flushEventsSoon(this.rt);
    }
    return reclaimed;
  }

  /** The current generation's last lease may have gone: it becomes idle, and whoever waits learns it. */
  private afterRelease(): void {
    if (this.leaseBook.size > 0) return;
    this.idleSince = Date.now();
    if (this.budgetWaitsForIdle) {
      this.budgetWaitsForIdle = false;
      this.rt.ctx.waitUntil(this.reportToBudget().catch(() => undefined));
    }
    this.hooks.onIdle();
  }

  /** Settles once a start in flight has finished (either way); at once if none runs. */
  async settleStart(): Promise<void> {
    await this.starting?.catch(() => undefined);
  }

  /** Resolves true once no lease is held, or with whether none is held after `timeoutMs`. */
  waitForNoLeases(timeoutMs: number): Promise<boolean> {
    return this.leaseBook.waitForNone(timeoutMs);
  }

  /** A connection of the lease's generation, of `kind` (generation.ts). */
  checkout(lease: LiveLease, kind: ConnectionKind = "tenant"): Promise<PoolClient> {
    return lease.of.checkout(kind);
  }

  /** Signs claims for the backend `pid` of an end-user connection of the current generation. */
  signClaims(pid: number, claims: string): Promise<string> {
    const live = this.generations.current();
    if (!live) throw new LessorError("stale_generation", { retryAfterSeconds: 1 });
    return live.signClaims(pid, claims);
  }

  // ── Budget ─────────────────────────────────────────────────────────────────────────────────────

  /** What the budget needs to know to choose eviction victims. */
  report(): PoolReport {
    return {
      leases: this.leaseBook.size,
      idleSince: this.leaseBook.size === 0 ? this.idleSince : null,
      pinned: this.rt.pinned,
      migrating: this.rt.lifecycle.migrating,
      ...this.sizing.reportFields(),
    };
  }

  async reportToBudget(): Promise<void> {
    const { record, lifecycle } = this.rt;
    if (!record || lifecycle.state !== "ready") return;
    const pressure = await this.rt
      .budget(record.host)
      .report(record.host, record.tenantId, lifecycle.generation, this.report());
    // An older BudgetObject answers nothing: no pressure known.
    if (pressure) this.sizing.notePressure(pressure);
  }

  /** The budget asked to evict while leases or holders were held: report the moment the last one goes. */
  reportWhenIdle(): void {
    this.budgetWaitsForIdle = true;
  }

  /** A holder left the registry (kernel/holders.ts): with no lease left either, a waiting budget learns it. */
  holderLeft(): void {
    if (!this.budgetWaitsForIdle || this.leaseBook.size > 0) return;
    this.budgetWaitsForIdle = false;
    this.rt.ctx.waitUntil(this.reportToBudget().catch(() => undefined));
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
