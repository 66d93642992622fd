/**
 * The tenant's pool: admission, the single-flight start of a generation, the lease count, checkout,
 * a rotation's switch to a new generation and the old one's retirement, and the stop of exactly the
 * generation that drained. A generation's start, step by step, is start.ts; opening its connections
 * open.ts; the lease count leases.ts; the size on an adaptive host sizing.ts.
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
 * End users (JWT mode, docs/adr/012-end-user-jwts.md) get connections of their own, logged in as the
 * tenant's end-user login role, from a second pool of the same generation opened on first use. Both
 * pools share the generation's pool size: a connection of one kind is opened only while the two
 * together hold fewer, and an idle one of the other kind is closed to make room.
 */
import type { Pool, PoolClient } from "@neondatabase/serverless";
import { admitDecision, beginDrain, leaseOverdueAfterMs, retired, stopped } from "../../core/lifecycle.ts";
import { poolApplicationName } from "../../core/names.ts";
import {
  checkoutStep,
  giveBackAmount,
  giveBackFrom,
  keptAfterGiveBack,
  type SideCounts,
} from "../../core/shared-capacity.ts";
import { describeFailure, LessorError } from "../../errors/index.ts";
import { logEvent, logEventSampled } from "../../log/index.ts";
import { type ConnectionTarget, endPool, openPool, terminateAndWait } from "../../postgres/index.ts";
import { driverPoolMax, setDriverPoolMax } from "../../postgres/internals.ts";
import { OpeningGate } from "../../postgres/opening-gate.ts";
import type { PoolReport } from "../../rpc/budget.ts";
import type { TenantRecord } from "../../rpc/tenant.ts";
import { sessionLimits } from "../../tenant-db/connect.ts";
import { gateError } from "../kernel/gate.ts";
import type { TenantRuntime } from "../runtime.ts";
import { markEndedOnPurpose, trackTransactionStatus, wasEndedOnPurpose } from "./connection-state.ts";
import { type JwtCredential, TenantCredentials, type UnsealedCredential } from "./credentials.ts";
import { LeaseBook, type LeaseKind } from "./leases.ts";
import { GenerationOpener, ownBackendsFenceSql } from "./open.ts";
import { PoolSizing, type SizedPool } from "./sizing.ts";
import { GenerationStart, type StartedGeneration, startFailureError } from "./start.ts";

/** A lease on the current generation: the pool to check a connection out of, and where it points. */
export interface LiveLease {
  /** The lease's entry in the pool's registry: releasing it a second time changes nothing. */
  id: number;
  generation: number;
  pool: Pool;
  /** The database the pool connects to (a cancel request goes there too). */
  target: ConnectionTarget;
}

/** Who a connection is logged in as: the tenant role, or the tenant's end-user login role. */
export type ConnectionKind = "tenant" | "jwt";

export type { LeaseKind } from "./leases.ts";

/** A repair the pool made to its own accounting, for the host's repair counters. */
export type PoolRepair = "lease_reclaimed" | "close_forced";

/** Where the pool keeps its last use for the next instance of the object (kv). */

/** A bound on the passes of a give-back beyond the connections it gives back. */
const maxPoolSizeBound = 8;

/** How long a checkout waits for a connection of the shared capacity (the driver pool's own bound). */
const checkoutWaitMs = 10_000;

export class TenantPool implements SizedPool {
  /** The pool of the current generation; null unless the lifecycle is ready or draining. */
  private pool: Pool | null = null;
  private poolGeneration = 0;
  private poolTarget: ConnectionTarget | null = null;
  /** Connections the generation may hold, both kinds together (its pool size at start). */
  private poolMax = 1;
  /** The end-user pool of the current generation (JWT mode), opened on first use. */
  private jwtPool: Pool | null = null;
  /** Whether the end-user pool's first connection has ended what a dead generation left. */
  private jwtFenced = false;
  /** The end-user login role's credential and the claims signer, derived at start. */
  private jwtCredential: JwtCredential | null = null;
  /** Checkouts waiting for an idle connection the driver pool hands over on its next tick. */
  private readonly idleClaims = new WeakMap<Pool, number>();
  /** Connections closed to make room for the other kind whose close has not completed. */
  private closingForRoom = 0;
  /** Checkouts waiting for a connection of either kind to come back. */
  private readonly capacityWaiters: (() => void)[] = [];
  /** Generations whose connections are still closing (their budget is not yet released). */
  private readonly closing = new Set<number>();
  private starting: Promise<void> | null = null;
  /** The leases of the current generation and of the retiring one (leases.ts). */
  private readonly leaseBook = new LeaseBook();
  private idleSince: number | null = null;
  private lastUsed: number | null = null;
  private lastUsedPersisted: number | null = null;
  /** Set when this pool refused an eviction because it was busy; cleared by the next idle report. */
  private budgetWaitsForIdle = false;
  /**
   * The generation a credential rotation replaced: it serves only the leases it held at the switch
   * (session leases, `/sql` in flight) and stops when the last one ends (docs/adr/013).
   */
  private retiring: {
    pool: Pool;
    jwtPool: Pool | null;
    generation: number;
  } | null = null;

  /** The tenant role's credential and the host-admin work done with it (repair, fence, terminate). */
  readonly credentials: TenantCredentials;
  /** Opens a generation's connections: control-plane claim, driver pool, proof, maintenance. */
  readonly opener: GenerationOpener;
  /** The pool's size on an adaptive host: observed use, growth and shrink (sizing.ts). */
  readonly sizing: PoolSizing;
  /** A generation's start, step by step (start.ts). */
  private readonly starter: GenerationStart;

  constructor(
    private readonly rt: TenantRuntime,
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
      (generation, error) => this.onPoolError(generation, error),
      new OpeningGate(),
    );
    this.sizing = new PoolSizing(rt, this);
    this.starter = new GenerationStart(rt, this);
  }

  /** A started generation becomes the one leases go to (start.ts, in the turn it came up). */
  install(started: StartedGeneration): void {
    this.jwtCredential = started.jwtCredential;
    this.pool = started.pool;
    this.poolGeneration = started.generation;
    this.poolTarget = started.target;
    this.poolMax = started.size;
    this.sizing.onStart();
    this.idleSince = Date.now();
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
    return this.pool !== null;
  }

  // ── Size (adaptive admission: sizing.ts decides, these apply) ──────────────────────────────────

  /** The generation whose pool is open. */
  get openGeneration(): number {
    return this.poolGeneration;
  }

  /** Connections the current generation may hold, both kinds together: what its ledger row holds. */
  get allowance(): number {
    return this.poolMax;
  }

  /** Checkouts waiting now because every connection of the generation is in use. */
  waitingCheckouts(): number {
    return (this.pool?.waitingCount ?? 0) + (this.jwtPool?.waitingCount ?? 0) + this.capacityWaiters.length;
  }

  /** The host admitted `by` more connections: the driver pools may open them now. */
  raiseAllowance(by: number): void {
    if (!this.pool || by <= 0) return;
    this.poolMax += by;
    setDriverPoolMax(this.pool, this.poolMax);
    if (this.jwtPool) setDriverPoolMax(this.jwtPool, this.poolMax);
    this.wakeCapacityWaiters();
  }

  /**
   * Lowers the allowance by up to `want` (never below `lowest`) and closes idle connections until
   * the generation holds no more than it; resolves with how many connections of allowance it gave
   * back. Only idle connections are closed, each one's backend gone before this resolves, so the
   * budget never gives away a connection that still exists: a connection checked out meanwhile
   * stays, and is not given back. Relative to the allowance on purpose: a growth admitted while
   * this runs adds up with it in either order.
   */
  async giveBackIdle(want: number, lowest: number): Promise<number> {
    const pool = this.pool;
    if (!pool || this.waitingCheckouts() > 0) return 0;
    const generation = this.poolGeneration;
    const lowered = giveBackAmount(want, this.poolMax, lowest);
    if (lowered <= 0) return 0;
    this.poolMax -= lowered;
    setDriverPoolMax(pool, this.poolMax);
    if (this.jwtPool) setDriverPoolMax(this.jwtPool, this.poolMax);
    const open = () => pool.totalCount + (this.jwtPool?.totalCount ?? 0) + this.closingForRoom;
    // Bounded: each pass closes one idle connection, or stops.
    for (let pass = 0; pass < lowered + maxPoolSizeBound && open() > this.poolMax; pass++) {
      const jwtPool = this.jwtPool;
      const side = giveBackFrom(this.countsOf(pool), jwtPool ? this.countsOf(jwtPool) : null);
      const from = side === "tenant" ? pool : side === "jwt" ? jwtPool : null;
      if (!from) break;
      await this.closeIdle(from, "given back to the host's budget");
    }
    // The generation stopped meanwhile: its whole allocation goes with it, nothing to give back here.
    if (this.pool !== pool || this.poolGeneration !== generation) return 0;
    // Connections checked out while this ran are still open: the allowance keeps them.
    const kept = keptAfterGiveBack(lowered, open(), this.poolMax);
    if (kept > 0) {
      this.poolMax += kept;
      setDriverPoolMax(pool, this.poolMax);
      if (this.jwtPool) setDriverPoolMax(this.jwtPool, this.poolMax);
    }
    return lowered - kept;
  }

  /** Whether this object still holds connections (or budget) of `generation`: live, retiring, being prepared, or closing. */
  holds(generation: number): boolean {
    const lc = this.rt.lifecycle;
    const live =
      lc.generation === generation &&
      (lc.state === "starting" || lc.state === "ready" || lc.state === "draining");
    return (
      live ||
      this.closing.has(generation) ||
      this.retiring?.generation === generation ||
      lc.rotatingTo === generation
    );
  }

  /** Whether a lease of `generation` may still run: the current open pool's, or the retiring one's. */
  serves(generation: number): boolean {
    if (this.pool !== null && this.poolGeneration === generation) return true;
    return this.retiring?.generation === generation;
  }

  /** The retiring generation and the leases it still holds (for status). */
  get retiringStatus(): { generation: number; leases: number } | null {
    return this.retiring
      ? { generation: this.retiring.generation, leases: this.leaseBook.retiringSize ?? 0 }
      : null;
  }

  /** Whether `generation` is still closing its connections. */
  isClosing(generation: number): boolean {
    return this.closing.has(generation);
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
          if (!this.pool || !this.poolTarget || this.poolGeneration !== this.rt.lifecycle.generation) break;
          const id = this.leaseBook.take(
            kind,
            this.poolGeneration,
            Date.now(),
            leaseOverdueAfterMs(kind, this.rt.config),
          );
          this.idleSince = null;
          this.touch();
          this.sizing.onLeases(this.leaseBook.size);
          return { id, generation: this.poolGeneration, pool: this.pool, target: this.poolTarget };
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
      const old = this.retiring;
      if (old && this.leaseBook.retiringSize === 0) this.rt.ctx.waitUntil(this.retire(old));
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
    const old = this.retiring;
    if (old && swept.retiringEmpty) this.rt.ctx.waitUntil(this.retire(old));
    if (this.leaseBook.size !== before) this.sizing.onLeases(this.leaseBook.size);
    if (swept.currentEmptied) this.afterRelease();
    const reclaimed = swept.reclaimed.length;
    if (reclaimed > 0) {
      this.hooks.onRepair("lease_reclaimed", reclaimed);
      this.flushEventsSoon();
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

  /**
   * A connection of the lease's generation, of `kind`, tracked so it is never returned inside a
   * transaction. While the generation has no end-user pool, this is the driver pool's own checkout.
   */
  async checkout(lease: LiveLease, kind: ConnectionKind = "tenant"): Promise<PoolClient> {
    // A retiring generation's lease (a rotation) uses its own pool as it is.
    if (kind === "tenant" && (!this.jwtPool || lease.pool !== this.pool))
      return this.checkoutFrom(lease.pool);
    const jwtPool = this.jwtPoolOf(lease);
    const own = kind === "jwt" ? jwtPool : lease.pool;
    const other = kind === "jwt" ? lease.pool : jwtPool;
    const deadline = Date.now() + checkoutWaitMs;
    // Bounded: every pass takes a connection, closes one, or waits until the deadline.
    for (;;) {
      // A driver pool hands an idle connection over on the next tick: until then it is claimed, so
      // two checkouts never count on the same idle one (the second would open a connection).
      const step = checkoutStep(this.countsOf(own), this.countsOf(other), this.closingForRoom, this.poolMax);
      if (step === "take") {
        const client = await this.claiming(own, () => this.checkoutFrom(own)).catch((error: unknown) =>
          this.repairJwt(kind, own, error),
        );
        // Only the current end-user pool's first connection fences. A rotation may have switched
        // generations while this checkout waited: the connection is then the replaced generation's,
        // which still serves this lease, and the new generation fences on its own first use.
        if (kind === "jwt" && own === this.jwtPool && !this.jwtFenced) await this.fenceJwt(client);
        return client;
      }
      if (step === "close_other") {
        await this.closeIdle(other, "closed to make room for the other kind");
        continue;
      }
      const returned = this.capacityReturned(deadline);
      // Queued now: the pool's growth sees this checkout waiting.
      this.sizing.onQueued();
      if (!(await returned)) {
        this.sizing.onRefusal();
        throw new LessorError("lease_timeout", {
          internal: "no connection of the shared capacity came back",
        });
      }
    }
  }

  /**
   * Closes one idle connection of `pool` (claimed, so no checkout counts on it meanwhile), counted
   * in `closingForRoom` until its backend has exited, so the two kinds never hold more than the
   * generation's maximum and the budget never gets back a place Postgres still counts.
   */
  private async closeIdle(pool: Pool, why: string): Promise<void> {
    const idle = await this.claiming(pool, () => pool.connect());
    markEndedOnPurpose(idle);
    this.closingForRoom++;
    try {
      await terminateAndWait(idle);
    } finally {
      this.closingForRoom--;
      idle.release(new Error(why));
    }
  }

  private claimsOn(pool: Pool): number {
    return this.idleClaims.get(pool) ?? 0;
  }

  /** A driver pool's counts for the capacity decisions (core/shared-capacity.ts). */
  private countsOf(pool: Pool): SideCounts {
    return { total: pool.totalCount, idle: pool.idleCount, claimed: this.claimsOn(pool) };
  }

  /** Runs a checkout from `pool` counted as a claim on one of its idle connections until it settles. */
  private async claiming<T>(pool: Pool, checkout: () => Promise<T>): Promise<T> {
    const claimsIdle = pool.idleCount > 0;
    if (claimsIdle) this.idleClaims.set(pool, this.claimsOn(pool) + 1);
    try {
      return await checkout();
    } finally {
      if (claimsIdle) this.idleClaims.set(pool, this.claimsOn(pool) - 1);
    }
  }

  private async checkoutFrom(pool: Pool): Promise<PoolClient> {
    const current = pool === this.pool || (pool === this.jwtPool && pool !== null);
    const queuedAt = Date.now();
    try {
      const generation = pool === this.pool ? this.poolGeneration : (this.retiring?.generation ?? -1);
      const connecting = pool.connect();
      // connect() has queued the checkout or opened a connection, synchronously: more checkouts now
      // wait than idle connections and room for new ones can serve, so this one waits for a release,
      // and the pool may grow.
      const queued =
        current && pool.waitingCount > pool.idleCount + Math.max(0, driverPoolMax(pool) - pool.totalCount);
      if (queued) this.sizing.onQueued();
      const client = await connecting;
      if (queued) this.sizing.onWait(Date.now() - queuedAt);
      trackTransactionStatus(client, (error) => this.onPoolError(generation, error));
      return client;
    } catch (error) {
      const code = (error as { code?: unknown }).code;
      const change = this.hooks.credentialChange();
      logEventSampled("warn", "pool_checkout_failed", this.rt.tenantId, {
        tenant: this.rt.tenantId,
        current: pool === this.pool,
        rotating: change !== null,
        code: typeof code === "string" ? code : null,
        failure: describeFailure(error),
      });
      // A login refused while the credential changes (or on a generation it replaced) is the
      // rotation's doing, not drift: the request moves to the new generation, nothing is repaired.
      const current = pool === this.pool || (pool === this.jwtPool && this.jwtPool !== null);
      const retiring = pool === this.retiring?.pool || (pool === this.retiring?.jwtPool && pool !== null);
      const movable = (current && change !== null) || retiring;
      if ((code === "28P01" || code === "28000") && movable) {
        if (change)
          await Promise.race([change.catch(() => undefined), sleep(this.rt.config.admissionWaitMs)]);
        if (this.pool !== null && pool !== this.pool && pool !== this.jwtPool) throw new CredentialMoved();
      }
      const timedOut = /timeout/i.test(String(error));
      if (timedOut && current) this.sizing.onRefusal();
      throw new LessorError(timedOut ? "lease_timeout" : "connection_lost", {
        internal: "pool checkout failed",
        cause: error,
      });
    }
  }

  /** Resolves true when a connection of either kind comes back (or closes), false at the deadline. */
  private capacityReturned(deadline: number): Promise<boolean> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), Math.max(0, deadline - Date.now()));
      this.capacityWaiters.push(() => {
        clearTimeout(timer);
        resolve(true);
      });
    });
  }

  private wakeCapacityWaiters = (): void => {
    for (const wake of this.capacityWaiters.splice(0)) wake();
  };

  /**
   * An end-user connection that could not log in for a reason Lessor cures itself, once: the login
   * role drifted (an end user ran `ALTER ROLE CURRENT_USER …` after `RESET ROLE`: 28P01; its CONNECT
   * went: 42501), or the role is at its connection limit with backends a dead generation left (53300).
   */
  private async repairJwt(kind: ConnectionKind, pool: Pool, error: unknown): Promise<PoolClient> {
    const code = (error as { cause?: { code?: unknown } }).cause?.code;
    const record = this.rt.record;
    const credential = this.jwtCredential;
    if (
      kind !== "jwt" ||
      !record ||
      !credential ||
      (code !== "28P01" && code !== "42501" && code !== "53300")
    ) {
      throw error;
    }
    // Never while a credential changes (the role's password is moving on purpose), nor while a
    // replaced generation still serves: its end-user connections are live, not a dead generation's.
    if (this.hooks.credentialChange() !== null || this.retiring !== null) throw error;
    if (code === "28P01" || code === "42501") await this.credentials.repairJwt(record, credential);
    else
      await this.credentials.fenceRole(
        record,
        credential.target.user,
        "end-user role connection limit reached",
      );
    return this.checkoutFrom(pool);
  }

  /** The lease generation's end-user pool, opened on first use. */
  private jwtPoolOf(lease: LiveLease): Pool {
    const record = this.rt.record;
    const credential = this.jwtCredential;
    // A rotation switched generations after this lease was taken: nothing ran on it yet, so the
    // request runs once on the new generation (its end-user pool has the new credential).
    if (this.retiring !== null && lease.generation === this.retiring.generation) throw new CredentialMoved();
    if (!record || !credential || lease.generation !== this.poolGeneration || this.pool !== lease.pool) {
      throw new LessorError("stale_generation", { retryAfterSeconds: 1 });
    }
    if (this.jwtPool) return this.jwtPool;
    const generation = lease.generation;
    const jwtPool = openPool(this.rt.config, credential.target, {
      max: this.poolMax,
      // The generation's name: the budget's pg_stat_activity count sees both kinds.
      applicationName: poolApplicationName(record.roleName, generation),
      limits: sessionLimits(this.rt.config),
      loginToken: credential.loginToken,
      openingGate: this.opener.openingGate,
      onError: (error, client) => {
        if (!wasEndedOnPurpose(client)) this.onPoolError(generation, error);
      },
    });
    for (const pool of [lease.pool, jwtPool]) {
      pool.on("release", this.wakeCapacityWaiters);
      pool.on("remove", this.wakeCapacityWaiters);
    }
    this.jwtPool = jwtPool;
    this.jwtFenced = false;
    return jwtPool;
  }

  /**
   * The end-user pool's first connection ends the login role's other backends (a dead generation's,
   * after a restart): the role may end its own. Only the generations this object holds are live: the
   * current one, and one a rotation replaced that still finishes its leases.
   */
  private async fenceJwt(client: PoolClient): Promise<void> {
    const record = this.rt.record;
    if (!record) return;
    try {
      // A generation a rotation replaced still serves its leases: its end users' backends stay.
      const live = [this.poolGeneration, ...(this.retiring ? [this.retiring.generation] : [])];
      const fencing = this.jwtPool;
      await client.query(ownBackendsFenceSql, [live.map((g) => poolApplicationName(record.roleName, g))]);
      // A switch while the fence ran leaves the new generation's pool to fence on its own first use.
      if (this.jwtPool === fencing) this.jwtFenced = true;
    } catch (error) {
      client.release(error instanceof Error ? error : new Error("fence failed"));
      throw new LessorError("connection_lost", { internal: "end-user pool fence failed", cause: error });
    }
  }

  /** Signs claims for the backend `pid` of an end-user connection (src/crypto/jwt-claims.ts). */
  signClaims(pid: number, claims: string): Promise<string> {
    if (!this.jwtCredential) throw new LessorError("stale_generation", { retryAfterSeconds: 1 });
    return this.jwtCredential.signClaims(pid, claims);
  }

  // ── Start ──────────────────────────────────────────────────────────────────────────────────────

  /**
   * Starts a new generation. Rejects with the reason when it cannot (budget saturated, database
   * unreachable, …) so every request that joined this start gets the same distinct answer.
   */
  /**
   * Opens the pool of a rotation's new generation under its new credential and proves it with one
   * query. Nothing routes to it until `switchTo`.
   */
  async prepare(
    record: TenantRecord,
    generation: number,
    credential: UnsealedCredential,
    size: number,
  ): Promise<PreparedGeneration> {
    const jwtCredential = await this.credentials.openJwt(record, credential);
    const pool = this.opener.open(record, generation, credential, size);
    try {
      await pool.query("SELECT 1");
    } catch (error) {
      await endPool(pool);
      throw error;
    }
    return { pool, target: credential.target, jwtCredential, size };
  }

  /**
   * The size a rotation's new generation is admitted and opened at: the current generation's
   * allowance (a grown or shrunk pool keeps its size through a rotation), or the start size.
   */
  rotationSize(record: TenantRecord): number {
    return this.pool ? this.poolMax : this.sizing.bounds(record).start;
  }

  /**
   * Makes a prepared generation current (the caller applies `rotationSwitched` in the same turn):
   * new leases go to it from now on; the old generation keeps the leases it holds and retires when
   * the last one ends. No await, so no lease can be taken between the two.
   */
  switchTo(prepared: PreparedGeneration, generation: number): void {
    const old = this.pool
      ? { pool: this.pool, jwtPool: this.jwtPool, generation: this.poolGeneration }
      : null;
    // The new generation opens its own end-user pool on first use, under the new credential's
    // derived login password and claims key (src/tenant-object/credentials.ts `changePassword`).
    this.jwtPool = null;
    this.jwtFenced = false;
    this.jwtCredential = prepared.jwtCredential;
    this.pool = prepared.pool;
    this.poolGeneration = generation;
    this.poolTarget = prepared.target;
    this.poolMax = prepared.size;
    this.sizing.onStart();
    this.idleSince = Date.now();
    this.lastUsed = Date.now();
    this.retiring = old;
    // The old generation keeps its leases; whoever waited for them (a drain) now watches the new one's.
    const retiringLeases = this.leaseBook.retireCurrent();
    if (old && retiringLeases === 0) this.rt.ctx.waitUntil(this.retire(old));
  }

  /** Stops a retiring generation: closes its pool, then releases its budget allocation. */
  private async retire(old: { pool: Pool; jwtPool: Pool | null; generation: number }): Promise<void> {
    if (this.retiring !== old) return;
    this.retiring = null;
    this.leaseBook.endRetiring();
    this.closing.add(old.generation);
    try {
      await this.closePools(old.generation, old.pool, old.jwtPool);
    } finally {
      this.closing.delete(old.generation);
    }
    const rt = this.rt;
    rt.apply(retired(rt.lifecycle, old.generation), "retired");
    rt.note(`rotation_retired: generation ${old.generation} stopped`);
    // The alarm flushes the events soon rather than at the next heartbeat.
    await rt.alarms.wakeBy(Date.now() + 1_000).catch(() => undefined);
    if (rt.record) {
      await rt
        .budget(rt.record.host)
        .release(rt.record.host, rt.record.tenantId, old.generation)
        .catch(() => undefined);
    }
    this.hooks.onRetired(old.generation);
  }

  private onPoolError(generation: number, error: Error): void {
    // A pool that is being ended on purpose reports its closing sockets: not news.
    if (generation !== this.poolGeneration || this.pool === null) return;
    // An idle pooled connection died (backend killed, database restarted). The pool replaces it on
    // the next checkout; the generation itself stays valid.
    logEvent("warn", "pool_connection_error", {
      tenant: this.rt.tenantId,
      generation,
      failure: describeFailure(error),
    });
  }

  // ── Stop ───────────────────────────────────────────────────────────────────────────────────────

  /**
   * Stops the current generation's pool: the generation ends at once (new requests start a new
   * one), its connections close, and only then is its budget allocation released. It stops only
   * the generation it was called for.
   */
  async stop(reason: string): Promise<void> {
    const rt = this.rt;
    const pool = this.pool;
    const jwtPool = this.jwtPool;
    const generation = this.poolGeneration;
    if (!pool || rt.lifecycle.generation !== generation) return;
    this.pool = null;
    this.jwtPool = null;
    this.idleSince = null;
    this.sizing.onStop();
    this.closing.add(generation);
    rt.apply(beginDrain(rt.lifecycle), reason);
    rt.apply(stopped(rt.lifecycle, generation), "drained");
    this.persistLastUsed();
    try {
      await this.closePools(generation, pool, jwtPool);
    } finally {
      this.closing.delete(generation);
      rt.deadlines.quiesce();
    }
    // Only now are the connections closed; releasing is idempotent (an evicting budget releases too).
    if (rt.record) {
      await rt
        .budget(rt.record.host)
        .release(rt.record.host, rt.record.tenantId, generation)
        .catch(() => undefined);
    }
  }

  /**
   * Closes a generation's pools, bounded (`endPool`): a connection that does not come back within
   * the bound is cut, so a generation never stays `closing` (holding its budget) for ever. A forced
   * close is logged as an event and counted.
   */
  private async closePools(generation: number, pool: Pool, jwtPool: Pool | null): Promise<void> {
    const outcomes = await Promise.all([endPool(pool), jwtPool ? endPool(jwtPool) : "ended"]);
    if (!outcomes.includes("forced")) return;
    logEvent("warn", "pool_close_forced", { tenant: this.rt.tenantId, generation });
    this.rt.note(`pool_close_forced: generation ${generation} did not close within the bound`);
    this.hooks.onRepair("close_forced", 1);
    this.flushEventsSoon();
  }

  /** A repair's event reaches the control plane soon rather than at the next heartbeat. */
  private flushEventsSoon(): void {
    this.rt.ctx.waitUntil(this.rt.alarms.wakeBy(Date.now() + 1_000).catch(() => undefined));
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

/** A generation a rotation prepared: its pool, where it points, and its end users' credential. */
export interface PreparedGeneration {
  pool: Pool;
  target: ConnectionTarget;
  jwtCredential: JwtCredential;
  /** Connections the generation was admitted with (its allowance once it serves). */
  size: number;
}

/** A checkout refused because a rotation moved the credential: retry on the current generation. */
export class CredentialMoved extends Error {
  constructor() {
    super("the credential moved to a new generation during checkout");
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
