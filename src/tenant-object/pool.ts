/**
 * The tenant's pool: admission, the single-flight start of a generation, the generation ledger,
 * the lease count, checkout, and the stop of exactly the generation that drained.
 *
 * Single flight: input gates do not cover Postgres I/O, so two requests can both see `stopped`.
 * The in-memory `starting` promise makes the second join the first; the persisted generation makes
 * a restarted object start a new generation instead of pretending the old pool is alive.
 *
 * Capacity: a start reserves its full pool size from the host's BudgetObject before it opens a
 * connection, and the allocation is released only after the pool's connections are closed.
 */
import type { Client, Pool, PoolClient } from "@neondatabase/serverless";
import {
  appendGeneration,
  appendLifecycleEvents,
  highestGeneration,
  loadSealedPassword,
  withControlPlane,
} from "../control-plane/index.ts";
import {
  admitDecision,
  beginDrain,
  beginStart,
  classifyStartFailure,
  type FailureReason,
  skipGeneration,
  startFailed,
  startRefused,
  startSucceeded,
  stopped,
} from "../core/lifecycle.ts";
import { poolApplicationName, tenantMaintenanceApplicationName } from "../core/names.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { type ConnectionTarget, openPool, withTenantConnection } from "../postgres/index.ts";
import type { AdmitResult, PoolReport } from "../rpc/budget.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import { sessionLimits } from "../tenant-db/connect.ts";
import { trackTransactionStatus } from "./connection-state.ts";
import { TenantCredentials, type UnsealedCredential } from "./credentials.ts";
import { heartbeatMs, type TenantRuntime } from "./runtime.ts";

/** A lease on the current generation: the pool to check a connection out of, and where it points. */
export interface LiveLease {
  generation: number;
  pool: Pool;
  /** The database the pool connects to (a cancel request goes there too). */
  target: ConnectionTarget;
}

export class TenantPool {
  /** The pool of the current generation; null unless the lifecycle is ready or draining. */
  private pool: Pool | null = null;
  private poolGeneration = 0;
  private poolTarget: ConnectionTarget | null = null;
  /** Generations whose connections are still closing (their budget is not yet released). */
  private readonly closing = new Set<number>();
  private starting: Promise<void> | null = null;
  private leaseCount = 0;
  private idleSince: number | null = null;
  private lastUsed: number | null = null;
  private readonly leasesDrained: (() => void)[] = [];
  /** Set when this pool refused an eviction because it was busy; cleared by the next idle report. */
  private budgetWaitsForIdle = false;

  /** The tenant role's credential and the host-admin work done with it (repair, fence, terminate). */
  readonly credentials: TenantCredentials;

  constructor(
    private readonly rt: TenantRuntime,
    private readonly hooks: {
      /** The running migration's end, if one runs (admission waits on it, bounded). */
      migrationDone: () => Promise<void> | null;
      /** The last lease was released. */
      onIdle: () => void;
    },
  ) {
    this.credentials = new TenantCredentials(rt);
  }

  get leases(): number {
    return this.leaseCount;
  }

  get lastUsedAt(): number | null {
    return this.lastUsed;
  }

  /** A session lease ran a statement: the pool is in use even though no new lease was taken. */
  markUsed(): void {
    this.lastUsed = Date.now();
  }

  /** When the ready pool last became idle (null while leased or not ready). */
  get idleSinceReady(): number | null {
    return this.rt.lifecycle.state === "ready" ? this.idleSince : null;
  }

  /** Whether a pool of the current generation is open. */
  get isOpen(): boolean {
    return this.pool !== null;
  }

  /** Whether this object still holds connections of `generation` (live, or still closing). */
  holds(generation: number): boolean {
    const lc = this.rt.lifecycle;
    const live =
      lc.generation === generation &&
      (lc.state === "starting" || lc.state === "ready" || lc.state === "draining");
    return live || this.closing.has(generation);
  }

  /** Whether `generation` is still closing its connections. */
  isClosing(generation: number): boolean {
    return this.closing.has(generation);
  }

  // ── Leases ─────────────────────────────────────────────────────────────────────────────────────

  /** A lease on a ready generation, starting one (once, however many ask) if there is none. */
  async acquire(record: TenantRecord): Promise<LiveLease> {
    // Bounded: each pass returns, throws, or waits on something that itself settles.
    for (let attempt = 0; attempt < 4; attempt++) {
      // An erase closed the gate (maybe while this request waited behind a start): no new lease.
      if (this.rt.erasing) throw new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
      const decision = admitDecision(this.rt.lifecycle, Date.now());
      switch (decision.kind) {
        case "use": {
          if (!this.pool || !this.poolTarget || this.poolGeneration !== this.rt.lifecycle.generation) break;
          this.leaseCount++;
          this.idleSince = null;
          this.lastUsed = Date.now();
          return { generation: this.poolGeneration, pool: this.pool, target: this.poolTarget };
        }
        case "start":
        case "join_start":
          this.starting ??= this.start(record).finally(() => {
            this.starting = null;
          });
          await this.starting;
          break;
        case "wait_migration": {
          const done = this.hooks.migrationDone();
          if (done) await Promise.race([done, sleep(this.rt.config.admissionWaitMs)]);
          if (this.rt.lifecycle.migrating) {
            throw new LessorError("tenant_migrating", { retryAfterSeconds: 2 });
          }
          break;
        }
        case "refuse_backoff":
          throw new LessorError("tenant_starting_failed", {
            internal: `start failed (${decision.reason}); backing off`,
            retryAfterSeconds: decision.retryAfterMs / 1000,
          });
        case "refuse_draining":
          throw new LessorError("tenant_draining", { retryAfterSeconds: 1 });
      }
    }
    throw new LessorError("tenant_starting_failed", {
      internal: "pool did not become ready",
      retryAfterSeconds: 1,
    });
  }

  release(): void {
    this.leaseCount--;
    if (this.leaseCount > 0) return;
    this.idleSince = Date.now();
    if (this.budgetWaitsForIdle) {
      this.budgetWaitsForIdle = false;
      this.rt.ctx.waitUntil(this.reportToBudget().catch(() => undefined));
    }
    for (const wake of this.leasesDrained.splice(0)) wake();
    this.hooks.onIdle();
  }

  /** Settles once a start in flight has finished (either way); at once if none runs. */
  async settleStart(): Promise<void> {
    await this.starting?.catch(() => undefined);
  }

  /** Resolves true once no lease is held, or with whether none is held after `timeoutMs`. */
  waitForNoLeases(timeoutMs: number): Promise<boolean> {
    if (this.leaseCount === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(this.leaseCount === 0), timeoutMs);
      this.leasesDrained.push(() => {
        clearTimeout(timer);
        resolve(true);
      });
    });
  }

  /** A connection of the lease's pool, tracked so it is never returned inside a transaction. */
  async checkout(pool: Pool): Promise<PoolClient> {
    try {
      const client = await pool.connect();
      trackTransactionStatus(client, (error) => this.onPoolError(this.poolGeneration, error));
      return client;
    } catch (error) {
      throw new LessorError(/timeout/i.test(String(error)) ? "lease_timeout" : "connection_lost", {
        internal: "pool checkout failed",
        cause: error,
      });
    }
  }

  // ── Start ──────────────────────────────────────────────────────────────────────────────────────

  /**
   * Starts a new generation. Rejects with the reason when it cannot (budget saturated, database
   * unreachable, …) so every request that joined this start gets the same distinct answer.
   */
  private async start(record: TenantRecord): Promise<void> {
    const rt = this.rt;
    rt.apply(beginStart(rt.lifecycle), rt.lifecycle.state === "failed" ? "retry" : "demand");
    let generation = rt.lifecycle.generation;
    const budget = rt.budget(record.host);
    let admitted: AdmitResult;
    try {
      admitted = await budget.admit(record.host, record.tenantId, generation, record.poolSize);
    } catch (error) {
      // The budget object restarted mid-call. Whatever it reserved is released (or reconciled).
      logEvent("warn", "budget_unavailable", {
        tenant: record.tenantId,
        generation,
        failure: describeFailure(error),
      });
      await budget.release(record.host, record.tenantId, generation).catch(() => undefined);
      rt.apply(startRefused(rt.lifecycle), "budget_unavailable");
      throw new LessorError("capacity_saturated", { retryAfterSeconds: 1 });
    }
    if (!admitted.granted) {
      rt.apply(startRefused(rt.lifecycle), admitted.closed ? "tenant_erasing" : "capacity_saturated");
      if (admitted.closed) throw new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
      throw new LessorError("capacity_saturated", { retryAfterSeconds: admitted.retryAfterMs / 1000 });
    }
    let pool: Pool | null = null;
    try {
      const sealed = await withControlPlane(rt.config, rt.env, async (db) => {
        // Insert-only ledger: a conflict means this generation was taken; move past it.
        for (
          let tries = 0;
          !(await appendGeneration(db, record.tenantId, generation, record.poolSize));
          tries++
        ) {
          if (tries >= 3) {
            throw new LessorError("internal", { internal: "generation ledger kept conflicting" });
          }
          const taken = generation;
          rt.apply(
            skipGeneration(rt.lifecycle, await highestGeneration(db, record.tenantId)),
            "generation_taken",
          );
          generation = rt.lifecycle.generation;
          await budget.release(record.host, record.tenantId, taken);
          const again = await budget.admit(record.host, record.tenantId, generation, record.poolSize);
          if (!again.granted) {
            throw new LessorError("capacity_saturated", { retryAfterSeconds: again.retryAfterMs / 1000 });
          }
        }
        const events = rt.storage.pendingEvents();
        await appendLifecycleEvents(db, record.tenantId, events);
        const last = events.at(-1);
        if (last) rt.storage.forgetEvents(last.seq);
        return loadSealedPassword(db, record.tenantId);
      });
      if (!sealed) throw new LessorError("internal", { internal: "tenant has no sealed credential" });
      const credential = await this.credentials.open(record, sealed);
      pool = this.open(record, generation, credential);
      // One connection proves the credentials and the database before the pool is declared ready.
      pool = await this.prove(pool, record, generation, credential);
      this.pool = pool;
      this.poolGeneration = generation;
      this.poolTarget = credential.target;
      this.idleSince = Date.now();
      rt.usage.poolStarts++;
      rt.apply(startSucceeded(rt.lifecycle), "pool_ready");
      await budget.confirm(record.host, record.tenantId, generation, this.report());
      await rt.ensureAlarm(Date.now() + Math.min(heartbeatMs, rt.config.idleTimeoutMs));
    } catch (error) {
      if (pool) await pool.end().catch(() => undefined);
      await budget.release(record.host, record.tenantId, generation).catch(() => undefined);
      if (error instanceof LessorError && error.code === "capacity_saturated") {
        rt.apply(startRefused(rt.lifecycle), "capacity_saturated");
        throw error;
      }
      const reason: FailureReason =
        error instanceof LessorError && error.code === "control_plane_unavailable"
          ? "control_plane_unavailable"
          : classifyStartFailure(error);
      logEvent("warn", "pool_start_failed", {
        tenant: record.tenantId,
        generation,
        reason,
        failure: describeFailure(error),
      });
      rt.apply(startFailed(rt.lifecycle, reason, Date.now(), Math.random()), reason);
      await rt.ensureAlarm(Date.now() + 1_000);
      const retryAt = rt.lifecycle.retryAt ?? Date.now() + 1_000;
      throw new LessorError("tenant_starting_failed", {
        internal: `start failed (${reason})`,
        retryAfterSeconds: (retryAt - Date.now()) / 1000,
      });
    }
  }

  private open(record: TenantRecord, generation: number, credential: UnsealedCredential): Pool {
    return openPool(this.rt.config, credential.target, {
      max: record.poolSize,
      applicationName: poolApplicationName(record.roleName, generation),
      limits: sessionLimits(this.rt.config),
      loginToken: credential.loginToken,
      onError: (error) => this.onPoolError(generation, error),
    });
  }

  /**
   * Opens the pool's first connection. Two refusals have a cure Lessor applies itself, once: a
   * password that drifted (28P01: the tenant set its own) is repaired through the admin role, and a
   * role at its connection limit with no live pool of ours (53300: backends a dead generation left)
   * is fenced.
   */
  private async prove(
    pool: Pool,
    record: TenantRecord,
    generation: number,
    credential: UnsealedCredential,
  ): Promise<Pool> {
    try {
      await this.firstQuery(pool, record);
      return pool;
    } catch (error) {
      const code = (error as { code?: unknown }).code;
      if (code !== "28P01" && code !== "53300") throw error;
      await pool.end().catch(() => undefined);
      if (code === "28P01") await this.credentials.repair(record, credential, generation);
      else await this.credentials.fence(record, "role connection limit reached");
      const retried = this.open(record, generation, credential);
      try {
        await this.firstQuery(retried, record);
      } catch (again) {
        await retried.end().catch(() => undefined);
        throw again;
      }
      return retried;
    }
  }

  /**
   * The pool's first query. After a restart with a live generation, that generation's backends may
   * still be writing: the role ends them itself (a role may terminate its own backends) and waits
   * for them to go, so none of their writes can commit once this generation serves.
   */
  private async firstQuery(pool: Pool, record: TenantRecord): Promise<void> {
    if (!this.rt.fencePending) {
      await pool.query("SELECT 1");
      return;
    }
    const { rows } = await pool.query(
      `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))::int AS ended
         FROM pg_stat_activity
        WHERE usename = current_user AND pid <> pg_backend_pid() AND application_name IS DISTINCT FROM $1`,
      [tenantMaintenanceApplicationName(record.roleName, "migrate")],
    );
    const ended = Number(rows[0]?.ended ?? 0);
    if (ended > 0) {
      this.rt.note(`fenced: ${ended} backend(s) of the dead generation ended`);
      logEvent("warn", "backends_fenced", { tenant: record.tenantId, ended });
    }
    this.rt.clearFence();
  }

  /** A connection outside the pool, for maintenance (migrations). It draws on the host's reserve. */
  async withDedicatedConnection<T>(
    record: TenantRecord,
    purpose: "migrate",
    work: (client: Client) => Promise<T>,
  ): Promise<T> {
    const sealed = await withControlPlane(this.rt.config, this.rt.env, (db) =>
      loadSealedPassword(db, record.tenantId),
    );
    if (!sealed) throw new LessorError("internal", { internal: "tenant has no sealed credential" });
    const credential = await this.credentials.open(record, sealed);
    return withTenantConnection(
      this.rt.config,
      credential.target,
      {
        applicationName: tenantMaintenanceApplicationName(record.roleName, purpose),
        limits: sessionLimits(this.rt.config),
        loginToken: credential.loginToken,
      },
      work,
    );
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
    const generation = this.poolGeneration;
    if (!pool || rt.lifecycle.generation !== generation) return;
    this.pool = null;
    this.idleSince = null;
    this.closing.add(generation);
    rt.apply(beginDrain(rt.lifecycle), reason);
    rt.apply(stopped(rt.lifecycle, generation), "drained");
    try {
      await pool.end().catch(() => undefined);
    } finally {
      this.closing.delete(generation);
    }
    // Only now are the connections closed; releasing is idempotent (an evicting budget releases too).
    if (rt.record) {
      await rt
        .budget(rt.record.host)
        .release(rt.record.host, rt.record.tenantId, generation)
        .catch(() => undefined);
    }
  }

  // ── Budget ─────────────────────────────────────────────────────────────────────────────────────

  /** What the budget needs to know to choose eviction victims. */
  report(): PoolReport {
    return {
      leases: this.leaseCount,
      idleSince: this.leaseCount === 0 ? this.idleSince : null,
      pinned: this.rt.pinned,
      migrating: this.rt.lifecycle.migrating,
    };
  }

  async reportToBudget(): Promise<void> {
    const { record, lifecycle } = this.rt;
    if (!record || lifecycle.state !== "ready") return;
    await this.rt
      .budget(record.host)
      .report(record.host, record.tenantId, lifecycle.generation, this.report());
  }

  /** The budget asked to evict while leases were held: report the moment the last one goes. */
  reportWhenIdle(): void {
    this.budgetWaitsForIdle = true;
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
