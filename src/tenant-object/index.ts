/**
 * TenantObject: one Durable Object per tenant. It owns the tenant's pool of real Postgres
 * connections, the pool lifecycle (core/lifecycle.ts), and the leases counted against it: one per
 * `/sql` request in flight, and one per open session lease (a pinned connection across requests).
 *
 * Why the pool lives here (docs/adr/001-pool-in-durable-object.md): a Durable Object is the only
 * place in Workers where one object per tenant outlives a request, so the pool's connections are
 * reused across requests and concurrent first requests can converge on one start.
 *
 * Single flight: input gates do not cover Postgres I/O, so two requests can both see `stopped`.
 * The in-memory `starting` promise makes the second join the first; the persisted generation makes
 * a restarted object start a new generation instead of pretending the old pool is alive.
 *
 * Capacity: a start reserves its full pool size from the host's BudgetObject before it opens a
 * connection, and the allocation is released only after the pool's connections are closed.
 */
import { DurableObject } from "cloudflare:workers";
import type { Pool, PoolClient } from "@neondatabase/serverless";
import { sql as dsql, eq } from "drizzle-orm";
import type { PoolReport } from "../budget-object/index.ts";
import { type LessorConfig, loadConfig } from "../config/index.ts";
import {
  appendGeneration,
  appendLifecycleEvents,
  highestGeneration,
  type LifecycleEventRow,
  loadSealedPassword,
  loadTenantRecord,
  withControlPlane,
} from "../control-plane/index.ts";
import { tenants } from "../control-plane/schema.ts";
import {
  admitDecision,
  beginStart,
  classifyStartFailure,
  type FailureReason,
  idleDecision,
  initialLifecycle,
  type Lifecycle,
  recoverAfterRestart,
  skipGeneration,
  startFailed,
  startSucceeded,
} from "../core/lifecycle.ts";
import {
  type PostgresErrorBody,
  postgresErrorBody,
  type SqlRequest,
  type SqlResponseBody,
  type Statement,
} from "../core/neon-protocol.ts";
import { hashesEqual, hashKey } from "../crypto/keys.ts";
import { unseal } from "../crypto/seal.ts";
import { describeFailure, LessorError, logEvent, type WireError } from "../errors/index.ts";
import { tenantMigrations } from "../migrations/tenant.gen.ts";
import { type ConnectionTarget, openPool, withConnection } from "../postgres/index.ts";
import { detached, requireTenantScope, withTenantScope } from "../tenant-context/index.ts";
import { MigrationError, migrateTenantDatabase, readSchemaVersion } from "../tenant-db/migrator.ts";
import {
  appendUsageDeltas,
  isZeroUsage,
  type UsageCounters,
  type UsageDeltaRow,
  zeroUsage,
} from "../usage/index.ts";
import { isIdleOutsideTransaction, trackTransactionStatus } from "./connection-state.ts";
import { executeSqlRequest, mayLeaveSessionState, runStatement } from "./execute.ts";
import type { TenantRecord, TenantRuntimeStatus } from "./record.ts";

/** The answer to a statement, as it crosses RPC back to the Worker. */
export type SqlOutcome =
  // The answer is serialised once, here: the Worker passes the text through.
  { ok: true; json: string } | { ok: false; postgres: PostgresErrorBody } | { ok: false; error: WireError };

export type SessionOpened =
  | { ok: true; lease: string; generation: number; expiresAt: string }
  | { ok: false; error: WireError };

export type MigrateOutcome =
  | { outcome: "migrated"; fromVersion: number; toVersion: number; applied: number[] }
  | { outcome: "skipped"; reason: "tenant_unknown" | "already_migrating" | "leases_held"; leases?: number }
  | { outcome: "failed"; version: number | null; summary: string };

/** Alarm cadence while a pool is warm: keeps the object resident, checks idleness, reports to the budget. */
const heartbeatMs = 30_000;
/** How long an unknown tenant is remembered as unknown, so probes do not hammer the control plane. */
const negativeCacheMs = 5_000;
/** Session lease tokens: `lsl_<tenant>_<random>`; the tenant part routes the request to this object. */
export const sessionTokenPrefix = "lsl_";

interface LiveLease {
  generation: number;
  pool: Pool;
}

interface Session {
  tokenHash: string;
  client: PoolClient;
  generation: number;
  ttlMs: number;
  expiresAt: number;
  createdAt: number;
  busy: boolean;
}

interface DrainState {
  startedAt: number;
  overdueReported: boolean;
}

export class TenantObject extends DurableObject<Env> {
  private readonly config: LessorConfig;
  private lifecycle: Lifecycle = initialLifecycle;
  private record: TenantRecord | null = null;
  private unknownUntil = 0;
  private pinned = false;

  /** The pool of the current generation; null unless the lifecycle is ready or draining. */
  private pool: Pool | null = null;
  private poolGeneration = 0;
  /** Generations whose connections are still closing (their budget is not yet released). */
  private readonly closing = new Set<number>();
  private starting: Promise<void> | null = null;
  private leases = 0;
  private idleSince: number | null = null;
  private lastUsedAt: number | null = null;
  private readonly sessions = new Map<string, Session>();
  private drainState: DrainState | null = null;
  private leasesDrained: (() => void)[] = [];
  private migrationDone: Promise<void> | null = null;
  private reclaimedLeases = 0;
  /** Set when this pool refused an eviction because it was busy; cleared by the next idle report. */
  private budgetWaitsForIdle = false;
  /** Usage since the last flush; staged into the durable usage outbox by the alarm. */
  private usage: UsageCounters = { ...zeroUsage };

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.config = loadConfig(env);
    ctx.blockConcurrencyWhile(async () => {
      const exec = ctx.storage.sql.exec.bind(ctx.storage.sql);
      exec("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT NOT NULL)");
      exec(`CREATE TABLE IF NOT EXISTS outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, generation INTEGER NOT NULL, from_state TEXT NOT NULL,
        to_state TEXT NOT NULL, reason TEXT NOT NULL, at INTEGER NOT NULL)`);
      exec(`CREATE TABLE IF NOT EXISTS usage_outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, queries INTEGER NOT NULL, rows_returned INTEGER NOT NULL,
        errors INTEGER NOT NULL, lease_ms INTEGER NOT NULL, pool_starts INTEGER NOT NULL, at INTEGER NOT NULL)`);
      // Session leases outlive nothing but their token: after a restart a token of a dead
      // generation is recognised and refused as stale rather than unknown.
      exec(`CREATE TABLE IF NOT EXISTS session_tokens (
        token_hash TEXT PRIMARY KEY, generation INTEGER NOT NULL, expires_at INTEGER NOT NULL,
        lost INTEGER NOT NULL DEFAULT 0)`);
      this.record = this.readKv<TenantRecord>("record");
      this.pinned = this.readKv<boolean>("pinned") ?? false;
      this.lifecycle = { ...initialLifecycle, ...(this.readKv<Lifecycle>("lifecycle") ?? {}) };
      const { lifecycle, deadGeneration } = recoverAfterRestart(this.lifecycle);
      if (deadGeneration !== null || lifecycle.migrating !== this.lifecycle.migrating) {
        // No pool survives a restart: the persisted generation is dead, whatever it claimed.
        this.transition(lifecycle, "object_restarted");
      }
      if (deadGeneration !== null && this.record) {
        const host = this.record.host;
        const tenantId = this.record.tenantId;
        ctx.waitUntil(
          this.budget(host)
            .release(host, tenantId, deadGeneration)
            .catch(() => undefined),
        );
      }
      if (this.pendingOutboxRows() > 0) await this.ensureAlarm(Date.now() + 1_000);
    });
  }

  // ── RPC: catalog ───────────────────────────────────────────────────────────────────────────────

  /** Installs or replaces the catalog record (provisioning, disable, enable). */
  async configure(record: TenantRecord): Promise<void> {
    this.record = record;
    this.unknownUntil = 0;
    this.writeKv("record", record);
  }

  /** Pins or unpins the pool: a pinned pool is never chosen as an eviction victim. */
  async setPinned(pinned: boolean): Promise<void> {
    this.pinned = pinned;
    this.writeKv("pinned", pinned);
    await this.reportToBudget();
  }

  /**
   * Authenticates a tenant key hash for the tenant's own REST endpoints. An unknown tenant and a
   * wrong key get the same refusal; a disabled tenant is refused only after the key checks out.
   */
  async verifyKey(
    tenantId: string,
    keyHash: string,
  ): Promise<{ ok: true } | { ok: false; error: WireError }> {
    try {
      await this.authenticate(tenantId, keyHash);
      return { ok: true };
    } catch (error) {
      return { ok: false, error: this.toLessorError(error).toWire() };
    }
  }

  // ── RPC: queries ───────────────────────────────────────────────────────────────────────────────

  /** Authenticates the key hash and runs one `/sql` request under a lease. */
  async sql(
    tenantId: string,
    keyHash: string,
    request: SqlRequest,
    requiredSchemaVersion: number | null = null,
  ): Promise<SqlOutcome> {
    let authenticated = false;
    try {
      const record = await this.authenticate(tenantId, keyHash);
      authenticated = true;
      if (requiredSchemaVersion !== null && record.schemaVersion < requiredSchemaVersion) {
        throw new LessorError("schema_too_old", {
          publicMessage: `The tenant's schema is at version ${record.schemaVersion}; this request needs ${requiredSchemaVersion}.`,
        });
      }
      const lease = await this.acquireLease(record);
      const leasedAt = Date.now();
      try {
        this.refuseIfDisabled();
        const body = await this.runOnLease(record.tenantId, lease, request);
        this.usage.queries++;
        this.usage.rowsReturned +=
          "results" in body ? body.results.reduce((n, r) => n + r.rows.length, 0) : body.rows.length;
        return { ok: true, json: JSON.stringify(body) };
      } finally {
        this.usage.leaseMs += Date.now() - leasedAt;
        this.releaseLease();
      }
    } catch (error) {
      if (authenticated) {
        this.usage.queries++;
        this.usage.errors++;
      }
      return this.failure(error);
    }
  }

  // ── RPC: session leases ────────────────────────────────────────────────────────────────────────

  /** Opens a session lease: one connection of the current generation, pinned until released or expired. */
  async openSession(tenantId: string, keyHash: string, ttlMs: number): Promise<SessionOpened> {
    try {
      const record = await this.authenticate(tenantId, keyHash);
      const ttl = Math.min(Math.max(1_000, Math.floor(ttlMs)), this.config.leaseMaxTtlMs);
      if (this.sessions.size >= record.poolSize)
        throw new LessorError("lease_limit", { retryAfterSeconds: 1 });
      const lease = await this.acquireLease(record);
      let client: PoolClient;
      try {
        this.refuseIfDisabled();
        client = await this.checkout(lease.pool);
      } catch (error) {
        this.releaseLease();
        throw error;
      }
      const token = `${sessionTokenPrefix}${tenantId}_${randomToken()}`;
      const tokenHash = await hashKey(token);
      const now = Date.now();
      const session: Session = {
        tokenHash,
        client,
        generation: lease.generation,
        ttlMs: ttl,
        expiresAt: now + ttl,
        createdAt: now,
        busy: false,
      };
      this.sessions.set(tokenHash, session);
      this.ctx.storage.sql.exec(
        "INSERT OR REPLACE INTO session_tokens (token_hash, generation, expires_at) VALUES (?, ?, ?)",
        tokenHash,
        lease.generation,
        session.expiresAt,
      );
      await this.ensureAlarm(session.expiresAt);
      return {
        ok: true,
        lease: token,
        generation: lease.generation,
        expiresAt: new Date(session.expiresAt).toISOString(),
      };
    } catch (error) {
      return { ok: false, error: this.toLessorError(error).toWire() };
    }
  }

  /** Runs one statement on a session lease's pinned connection, extending its TTL. */
  async sessionSql(
    tenantId: string,
    keyHash: string,
    token: string,
    statement: Statement,
  ): Promise<SqlOutcome> {
    try {
      await this.authenticate(tenantId, keyHash);
      const session = await this.findSession(token);
      if (session.busy) {
        throw new LessorError("invalid_request", {
          publicMessage: "This lease is already running a statement.",
        });
      }
      session.busy = true;
      this.lastUsedAt = Date.now();
      try {
        const body = await withTenantScope(
          { tenantId, generation: session.generation, leaseId: session.tokenHash.slice(0, 12) },
          () => {
            requireTenantScope(tenantId);
            return runStatement(session.client, statement);
          },
        );
        this.usage.queries++;
        this.usage.rowsReturned += body.rows.length;
        return { ok: true, json: JSON.stringify(body) };
      } catch (error) {
        this.usage.queries++;
        this.usage.errors++;
        if (postgresErrorBody(error) && !isConnectionFatal(error)) throw error;
        // The connection is gone: so is the transaction. End the lease and say so.
        this.endSession(session, error instanceof Error ? error : new Error("connection lost"), "lost");
        throw new LessorError("connection_lost", { internal: "session connection failed", cause: error });
      } finally {
        session.busy = false;
        if (this.sessions.has(session.tokenHash)) {
          session.expiresAt = Date.now() + session.ttlMs;
          await this.ensureAlarm(session.expiresAt);
        }
      }
    } catch (error) {
      return this.failure(error);
    }
  }

  /** Releases a session lease: rolls back anything open and returns the connection clean. */
  async closeSession(
    tenantId: string,
    keyHash: string,
    token: string,
  ): Promise<{ ok: true } | { ok: false; error: WireError }> {
    try {
      await this.authenticate(tenantId, keyHash);
      const session = await this.findSession(token);
      if (session.busy) {
        throw new LessorError("invalid_request", { publicMessage: "This lease is running a statement." });
      }
      await this.resetAndEndSession(session, "released");
      return { ok: true };
    } catch (error) {
      return { ok: false, error: this.toLessorError(error).toWire() };
    }
  }

  // ── RPC: operations ────────────────────────────────────────────────────────────────────────────

  /** The runtime status (no secrets). */
  async status(): Promise<TenantRuntimeStatus> {
    const lc = this.lifecycle;
    const now = Date.now();
    return {
      state: lc.state,
      generation: lc.generation,
      poolSize: this.record?.poolSize ?? null,
      leases: this.leases,
      lastUsedAt: this.lastUsedAt === null ? null : new Date(this.lastUsedAt).toISOString(),
      idleSince:
        this.idleSince === null || lc.state !== "ready" ? null : new Date(this.idleSince).toISOString(),
      failureReason: lc.state === "failed" ? lc.failureReason : null,
      retryAt: lc.state === "failed" && lc.retryAt !== null ? new Date(lc.retryAt).toISOString() : null,
      pendingEvents: this.pendingOutboxRows(),
      sessions: this.sessions.size,
      pinned: this.pinned,
      migrating: lc.migrating,
      schemaVersion: this.record?.schemaVersion ?? null,
      drain:
        lc.state === "draining" && this.drainState
          ? {
              startedAt: new Date(this.drainState.startedAt).toISOString(),
              overdue: now - this.drainState.startedAt > this.config.maxDrainMs,
              heldLeases: [...this.sessions.values()].map((s) => ({
                lease: s.tokenHash.slice(0, 12),
                ageMs: now - s.createdAt,
              })),
            }
          : null,
      reclaimedLeases: this.reclaimedLeases,
    };
  }

  /**
   * Operator drain: the generation takes no new lease and stops when its leases reach zero. A lease
   * held past the maximum drain time is reported, never killed, unless `force` is set: then every
   * session lease's connection is closed (its transaction rolls back) so the drain can finish.
   */
  async drain(force: boolean): Promise<TenantRuntimeStatus> {
    if (this.lifecycle.state === "ready") {
      this.drainState = { startedAt: Date.now(), overdueReported: false };
      this.transition(
        { ...this.lifecycle, state: "draining" },
        force ? "operator_drain_forced" : "operator_drain",
      );
      if (this.record)
        await this.budget(this.record.host).draining(this.record.tenantId, this.lifecycle.generation);
      await this.ensureAlarm(Date.now() + this.config.maxDrainMs);
    }
    if (force && this.lifecycle.state === "draining") {
      for (const session of [...this.sessions.values()]) {
        this.endSession(session, new Error("forced drain"), "stale");
        logEvent("warn", "lease_killed_by_forced_drain", {
          tenant: this.record?.tenantId,
          lease: session.tokenHash.slice(0, 12),
        });
      }
    }
    await this.finishDrainIfIdle();
    return this.status();
  }

  /**
   * Asked by the BudgetObject: drain and stop this generation if, right now, it is ready, holds no
   * lease, is not pinned and is not migrating. The check and the state change happen without an
   * await in between, so a lease that arrives first makes this refuse.
   */
  async evictIfIdle(generation: number): Promise<{ evicted: boolean; report: PoolReport }> {
    const lc = this.lifecycle;
    const eligible =
      lc.generation === generation &&
      lc.state === "ready" &&
      this.leases === 0 &&
      this.sessions.size === 0 &&
      !this.pinned &&
      !lc.migrating &&
      this.pool !== null;
    if (!eligible) {
      // Refused because busy: tell the budget the moment the last lease goes, so a waiting start
      // does not wait for the next heartbeat to learn this pool became idle.
      if (lc.generation === generation && this.leases > 0) this.budgetWaitsForIdle = true;
      // A generation this object no longer runs holds nothing: let the budget release it.
      const gone = lc.generation !== generation && !this.closing.has(generation);
      return { evicted: gone, report: this.poolReport() };
    }
    await this.stopPool("evicted");
    return { evicted: true, report: this.poolReport() };
  }

  /** For budget reconciliation: does this object still hold connections of `generation`? */
  async holdsGeneration(generation: number): Promise<boolean> {
    const lc = this.lifecycle;
    const live =
      lc.generation === generation &&
      (lc.state === "starting" || lc.state === "ready" || lc.state === "draining");
    return live || this.closing.has(generation);
  }

  /**
   * Migrates the tenant's database to `targetVersion`: enters `migrating` (new leases wait, then get
   * `tenant_migrating`), waits up to `drainTimeoutMs` for held leases to finish (else skips), and
   * applies each pending migration in a transaction of its own under the migrator's advisory lock.
   */
  async migrate(tenantId: string, targetVersion: number, drainTimeoutMs: number): Promise<MigrateOutcome> {
    const record = await this.resolveRecord(tenantId).catch(() => null);
    if (!record) return { outcome: "skipped", reason: "tenant_unknown" };
    if (this.lifecycle.migrating) return { outcome: "skipped", reason: "already_migrating" };
    let finish: () => void = () => undefined;
    this.migrationDone = new Promise<void>((resolve) => {
      finish = resolve;
    });
    this.transition({ ...this.lifecycle, migrating: true }, "migration_started");
    let reached: number | null = null;
    try {
      await this.reportToBudget();
      if (!(await this.waitForLeasesToDrain(drainTimeoutMs))) {
        return { outcome: "skipped", reason: "leases_held", leases: this.leases };
      }
      const run = await withTenantScope(
        { tenantId, generation: this.lifecycle.generation, leaseId: "migrate" },
        () =>
          this.withDedicatedConnection(record, "migrate", async (client) => {
            requireTenantScope(tenantId);
            try {
              return await migrateTenantDatabase(client, tenantMigrations, targetVersion);
            } catch (error) {
              // Earlier steps may have applied: remember the version the database really reached.
              reached = await readSchemaVersion(client).catch(() => null);
              throw error;
            }
          }),
      );
      await this.recordSchemaVersion(record, run.toVersion);
      return { outcome: "migrated", ...run };
    } catch (error) {
      const version = error instanceof MigrationError ? error.version : null;
      const cause = error instanceof MigrationError ? error.cause : error;
      const summary = `${error instanceof Error ? error.message : "migration failed"}${
        postgresErrorBody(cause) ? `: ${describeFailure(cause)}` : ""
      }`;
      logEvent("warn", "tenant_migration_failed", {
        tenant: tenantId,
        version,
        failure: describeFailure(cause),
      });
      if (reached !== null && reached !== record.schemaVersion) {
        await this.recordSchemaVersion(record, reached).catch(() => undefined);
      }
      return { outcome: "failed", version, summary: summary.slice(0, 500) };
    } finally {
      this.transition({ ...this.lifecycle, migrating: false }, "migration_finished");
      finish();
      this.migrationDone = null;
      await this.reportToBudget().catch(() => undefined);
    }
  }

  /** Records the schema version the tenant database reached, here and in the catalog. */
  private async recordSchemaVersion(record: TenantRecord, version: number): Promise<void> {
    this.record = { ...(this.record ?? record), schemaVersion: version };
    this.writeKv("record", this.record);
    await withControlPlane(this.config, this.env, (db) =>
      db
        .update(tenants)
        .set({ schemaVersion: version, updatedAt: dsql`now()` })
        .where(eq(tenants.id, record.tenantId)),
    );
  }

  override async alarm(): Promise<void> {
    const now = Date.now();
    await detached(() => this.reclaimExpiredSessions(now));
    if (this.lifecycle.state === "draining" && this.drainState && !this.drainState.overdueReported) {
      if (now - this.drainState.startedAt >= this.config.maxDrainMs && this.leases > 0) {
        this.drainState.overdueReported = true;
        this.note(`drain_overdue: ${this.leases} lease(s) held past ${this.config.maxDrainMs} ms`);
        logEvent("warn", "drain_overdue", { tenant: this.record?.tenantId, leases: this.leases });
      }
    }
    const decision = idleDecision({
      state: this.lifecycle.state,
      leases: this.leases,
      idleSince: this.idleSince,
      now,
      idleTimeoutMs: this.config.idleTimeoutMs,
      heartbeatMs,
    });
    if (decision.kind === "drain" && !this.lifecycle.migrating) await this.stopPool("idle_timeout");
    else await this.reportToBudget().catch(() => undefined);
    await this.flushOutboxes().catch((error: unknown) =>
      logEvent("warn", "outbox_flush_failed", {
        tenant: this.record?.tenantId,
        failure: describeFailure(error),
      }),
    );
    const wakeups = [
      decision.kind === "rearm" ? decision.at : null,
      ...[...this.sessions.values()].map((s) => s.expiresAt),
      this.lifecycle.state === "draining" ? now + heartbeatMs : null,
      this.pendingOutboxRows() > 0 || !isZeroUsage(this.usage) ? now + heartbeatMs : null,
    ].filter((t): t is number => t !== null);
    if (wakeups.length > 0) await this.ctx.storage.setAlarm(Math.max(now + 100, Math.min(...wakeups)));
  }

  // ── Authentication ─────────────────────────────────────────────────────────────────────────────

  private async authenticate(tenantId: string, keyHash: string): Promise<TenantRecord> {
    const record = await this.resolveRecord(tenantId);
    // Unknown tenant and wrong key are indistinguishable to the caller.
    if (!record || record.tenantId !== tenantId || !hashesEqual(record.keyHash, keyHash)) {
      throw new LessorError("invalid_credentials");
    }
    if (record.status === "disabled") throw new LessorError("tenant_disabled");
    return record;
  }

  /**
   * A tenant disabled while a request waited for its lease (behind a start, say) is refused with
   * the lease already in hand; the caller's `finally` releases it.
   */
  private refuseIfDisabled(): void {
    if (this.record?.status === "disabled") throw new LessorError("tenant_disabled");
  }

  private async resolveRecord(tenantId: string): Promise<TenantRecord | null> {
    if (this.record) return this.record;
    if (Date.now() < this.unknownUntil) return null;
    const record = await withControlPlane(this.config, this.env, (db) =>
      loadTenantRecord(db, this.config, tenantId),
    );
    if (!record) {
      this.unknownUntil = Date.now() + negativeCacheMs;
      return null;
    }
    await this.configure(record);
    return record;
  }

  // ── Leases and the single-flight start ─────────────────────────────────────────────────────────

  private async acquireLease(record: TenantRecord): Promise<LiveLease> {
    // Bounded: each pass returns, throws, or waits on something that itself settles.
    for (let attempt = 0; attempt < 4; attempt++) {
      const decision = admitDecision(this.lifecycle, Date.now());
      switch (decision.kind) {
        case "use": {
          if (!this.pool || this.poolGeneration !== this.lifecycle.generation) break;
          this.leases++;
          this.idleSince = null;
          this.lastUsedAt = Date.now();
          return { generation: this.poolGeneration, pool: this.pool };
        }
        case "start":
        case "join_start":
          this.starting ??= this.startGeneration(record).finally(() => {
            this.starting = null;
          });
          await this.starting;
          break;
        case "wait_migration": {
          const done = this.migrationDone;
          if (done) await Promise.race([done, sleep(this.config.admissionWaitMs)]);
          if (this.lifecycle.migrating) throw new LessorError("tenant_migrating", { retryAfterSeconds: 2 });
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

  private releaseLease(): void {
    this.leases--;
    if (this.leases > 0) return;
    this.idleSince = Date.now();
    if (this.budgetWaitsForIdle) {
      this.budgetWaitsForIdle = false;
      this.ctx.waitUntil(this.reportToBudget().catch(() => undefined));
    }
    for (const wake of this.leasesDrained.splice(0)) wake();
    if (this.lifecycle.state === "draining") void this.finishDrainIfIdle();
  }

  private waitForLeasesToDrain(timeoutMs: number): Promise<boolean> {
    if (this.leases === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(this.leases === 0), timeoutMs);
      this.leasesDrained.push(() => {
        clearTimeout(timer);
        resolve(true);
      });
    });
  }

  /**
   * Starts a new generation. Rejects with the reason when it cannot (budget saturated, database
   * unreachable, …) so every request that joined this start gets the same distinct answer.
   */
  private async startGeneration(record: TenantRecord): Promise<void> {
    this.transition(beginStart(this.lifecycle), this.lifecycle.state === "failed" ? "retry" : "demand");
    let generation = this.lifecycle.generation;
    const budget = this.budget(record.host);
    let admitted: Awaited<ReturnType<typeof budget.admit>>;
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
      this.transition({ ...this.lifecycle, state: "stopped" }, "budget_unavailable");
      throw new LessorError("capacity_saturated", { retryAfterSeconds: 1 });
    }
    if (!admitted.granted) {
      this.transition({ ...this.lifecycle, state: "stopped" }, "capacity_saturated");
      throw new LessorError("capacity_saturated", { retryAfterSeconds: admitted.retryAfterMs / 1000 });
    }
    let pool: Pool | null = null;
    try {
      const sealed = await withControlPlane(this.config, this.env, async (db) => {
        // Insert-only ledger: a conflict means this generation was taken; move past it.
        for (
          let tries = 0;
          !(await appendGeneration(db, record.tenantId, generation, record.poolSize));
          tries++
        ) {
          if (tries >= 3)
            throw new LessorError("internal", { internal: "generation ledger kept conflicting" });
          const taken = generation;
          this.transition(
            skipGeneration(this.lifecycle, await highestGeneration(db, record.tenantId)),
            "generation_taken",
          );
          generation = this.lifecycle.generation;
          await budget.release(record.host, record.tenantId, taken);
          const again = await budget.admit(record.host, record.tenantId, generation, record.poolSize);
          if (!again.granted)
            throw new LessorError("capacity_saturated", { retryAfterSeconds: again.retryAfterMs / 1000 });
        }
        const events = this.pendingEvents();
        await appendLifecycleEvents(db, record.tenantId, events);
        const last = events.at(-1);
        if (last) this.forgetEvents(last.seq);
        return loadSealedPassword(db, record.tenantId);
      });
      if (!sealed) throw new LessorError("internal", { internal: "tenant has no sealed credential" });
      pool = openPool(this.config, await this.connectionTarget(record, sealed), {
        max: record.poolSize,
        applicationName: `lessor:${record.tenantId}:${generation}`,
        onError: (error) => this.onPoolError(generation, error),
      });
      // One connection proves the credentials and the database before the pool is declared ready.
      await pool.query("SELECT 1");
      this.pool = pool;
      this.poolGeneration = generation;
      this.idleSince = Date.now();
      this.usage.poolStarts++;
      this.transition(startSucceeded(this.lifecycle), "pool_ready");
      await budget.confirm(record.host, record.tenantId, generation, this.poolReport());
      await this.ensureAlarm(Date.now() + Math.min(heartbeatMs, this.config.idleTimeoutMs));
    } catch (error) {
      if (pool) await pool.end().catch(() => undefined);
      await budget.release(record.host, record.tenantId, generation).catch(() => undefined);
      if (error instanceof LessorError && error.code === "capacity_saturated") {
        this.transition({ ...this.lifecycle, state: "stopped" }, "capacity_saturated");
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
      this.transition(startFailed(this.lifecycle, reason, Date.now(), Math.random()), reason);
      await this.ensureAlarm(Date.now() + 1_000);
      const retryAt = this.lifecycle.retryAt ?? Date.now() + 1_000;
      throw new LessorError("tenant_starting_failed", {
        internal: `start failed (${reason})`,
        retryAfterSeconds: (retryAt - Date.now()) / 1000,
      });
    }
  }

  private async connectionTarget(record: TenantRecord, sealed: string): Promise<ConnectionTarget> {
    const host = this.config.hosts.get(record.host);
    if (!host)
      throw new LessorError("misconfigured", { internal: `tenant host ${record.host} is not configured` });
    return {
      host: host.hostname,
      port: host.port,
      user: record.roleName,
      password: await unseal(this.env.LESSOR_SEAL_KEY, record.tenantId, sealed),
      database: record.databaseName,
    };
  }

  /** A connection outside the pool, for maintenance (migrations). It draws on the host's reserve. */
  private async withDedicatedConnection<T>(
    record: TenantRecord,
    purpose: string,
    work: (client: import("@neondatabase/serverless").Client) => Promise<T>,
  ): Promise<T> {
    const sealed = await withControlPlane(this.config, this.env, (db) =>
      loadSealedPassword(db, record.tenantId),
    );
    if (!sealed) throw new LessorError("internal", { internal: "tenant has no sealed credential" });
    const target = await this.connectionTarget(record, sealed);
    const url = `postgres://${encodeURIComponent(target.user)}:${encodeURIComponent(target.password)}@${target.host}:${target.port}/${encodeURIComponent(target.database)}`;
    return withConnection(this.config, url, `lessor:${record.tenantId}:${purpose}`, work);
  }

  private onPoolError(generation: number, error: Error): void {
    // A pool that is being ended on purpose reports its closing sockets: not news.
    if (generation !== this.poolGeneration || this.pool === null) return;
    // An idle pooled connection died (backend killed, database restarted). The pool replaces it on
    // the next checkout; the generation itself stays valid.
    logEvent("warn", "pool_connection_error", {
      tenant: this.record?.tenantId,
      generation,
      failure: describeFailure(error),
    });
  }

  private async checkout(pool: Pool): Promise<PoolClient> {
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

  private async runOnLease(
    tenantId: string,
    lease: LiveLease,
    request: SqlRequest,
  ): Promise<SqlResponseBody> {
    const client = await this.checkout(lease.pool);
    let broken: Error | undefined;
    try {
      return await withTenantScope({ tenantId, generation: lease.generation, leaseId: "sql" }, () => {
        requireTenantScope(tenantId);
        return executeSqlRequest(client, request);
      });
    } catch (error) {
      if (!postgresErrorBody(error) || isConnectionFatal(error)) {
        broken = error instanceof Error ? error : new Error("query failed");
        if (error instanceof LessorError) throw error;
        throw new LessorError("connection_lost", { internal: "connection failed mid-query", cause: error });
      }
      throw error;
    } finally {
      if (!broken) broken = await resetConnection(client, mayLeaveSessionState(request));
      client.release(broken);
    }
  }

  // ── Sessions ───────────────────────────────────────────────────────────────────────────────────

  private async findSession(token: string): Promise<Session> {
    const tokenHash = await hashKey(token);
    const session = this.sessions.get(tokenHash);
    if (session) {
      if (session.generation !== this.lifecycle.generation || this.pool === null) {
        this.endSession(session, new Error("stale generation"), "stale");
        throw new LessorError("stale_generation", { retryAfterSeconds: 1 });
      }
      return session;
    }
    const known = this.ctx.storage.sql
      .exec<{ generation: number; lost: number }>(
        "SELECT generation, lost FROM session_tokens WHERE token_hash = ?",
        tokenHash,
      )
      .toArray()[0];
    if (known) {
      if (known.lost === 1) throw new LessorError("lease_lost");
      // Known, but not live in this object: its generation died with a restart or a stop.
      throw new LessorError("stale_generation", { retryAfterSeconds: 1 });
    }
    throw new LessorError("lease_not_found");
  }

  /**
   * Ends a session at once, destroying its connection (used when the connection is suspect). The
   * token stays known, so its owner learns why (`lease_lost` when the connection died,
   * `stale_generation` when its generation ended) rather than that the lease never existed.
   */
  private endSession(session: Session, destroyWith: Error, remember: "lost" | "stale"): void {
    if (!this.sessions.delete(session.tokenHash)) return;
    if (remember === "lost") {
      this.ctx.storage.sql.exec("UPDATE session_tokens SET lost = 1 WHERE token_hash = ?", session.tokenHash);
    }
    session.client.release(destroyWith);
    this.releaseLease();
  }

  /** Ends a session politely: roll back, discard session state, and return the connection. */
  private async resetAndEndSession(session: Session, why: string): Promise<void> {
    if (!this.sessions.delete(session.tokenHash)) return;
    this.ctx.storage.sql.exec("DELETE FROM session_tokens WHERE token_hash = ?", session.tokenHash);
    const broken = await withTenantScope(
      {
        tenantId: this.record?.tenantId ?? "",
        generation: session.generation,
        leaseId: `${why}:${session.tokenHash.slice(0, 12)}`,
      },
      () => resetConnection(session.client, true),
    );
    session.client.release(broken);
    this.releaseLease();
  }

  /** Reclaims session leases whose owner stopped using them (the TTL passed). */
  private async reclaimExpiredSessions(now: number): Promise<void> {
    for (const session of [...this.sessions.values()]) {
      if (session.busy || session.expiresAt > now) continue;
      this.reclaimedLeases++;
      logEvent("warn", "lease_reclaimed", {
        tenant: this.record?.tenantId,
        generation: session.generation,
        lease: session.tokenHash.slice(0, 12),
        heldMs: now - session.createdAt,
      });
      await this.resetAndEndSession(session, "reclaim");
    }
    this.ctx.storage.sql.exec("DELETE FROM session_tokens WHERE expires_at < ?", now - 24 * 3600_000);
  }

  // ── Stopping ───────────────────────────────────────────────────────────────────────────────────

  /** Finishes an operator drain once no lease is held. */
  private async finishDrainIfIdle(): Promise<void> {
    if (this.lifecycle.state !== "draining" || this.leases > 0) return;
    await this.stopPool("operator_drain");
  }

  /**
   * Stops the current generation's pool: the generation ends at once (new requests start a new
   * one), its connections close, and only then is its budget allocation released. It stops only
   * the generation it was called for.
   */
  private async stopPool(reason: string): Promise<void> {
    const pool = this.pool;
    const generation = this.poolGeneration;
    if (!pool || this.lifecycle.generation !== generation) return;
    this.pool = null;
    this.idleSince = null;
    this.drainState = null;
    this.closing.add(generation);
    if (this.lifecycle.state === "ready") this.transition({ ...this.lifecycle, state: "draining" }, reason);
    this.transition({ ...this.lifecycle, state: "stopped" }, "drained");
    try {
      await pool.end().catch(() => undefined);
    } finally {
      this.closing.delete(generation);
    }
    // Only now are the connections closed; releasing is idempotent (an evicting budget releases too).
    if (this.record) {
      await this.budget(this.record.host)
        .release(this.record.host, this.record.tenantId, generation)
        .catch(() => undefined);
    }
  }

  // ── Budget ─────────────────────────────────────────────────────────────────────────────────────

  private budget(host: string) {
    return this.env.BUDGETS.getByName(host);
  }

  private poolReport(): PoolReport {
    return {
      leases: this.leases,
      idleSince: this.leases === 0 ? this.idleSince : null,
      pinned: this.pinned,
      migrating: this.lifecycle.migrating,
    };
  }

  private async reportToBudget(): Promise<void> {
    if (!this.record || this.lifecycle.state !== "ready") return;
    const { host, tenantId } = this.record;
    await this.budget(host).report(host, tenantId, this.lifecycle.generation, this.poolReport());
  }

  // ── Persistence ────────────────────────────────────────────────────────────────────────────────

  /** Persists the new lifecycle and appends the transition to the outbox, in one storage transaction. */
  private transition(next: Lifecycle, reason: string): void {
    const previous = this.lifecycle;
    this.lifecycle = next;
    this.ctx.storage.transactionSync(() => {
      this.writeKv("lifecycle", next);
      const from = previous.migrating ? "migrating" : previous.state;
      const to = next.migrating ? "migrating" : next.state;
      if (from !== to || previous.generation !== next.generation)
        this.appendEvent(next.generation, from, to, reason);
    });
  }

  /** Appends an event that is not a transition (an overdue drain, say). */
  private note(reason: string): void {
    const state = this.lifecycle.migrating ? "migrating" : this.lifecycle.state;
    this.appendEvent(this.lifecycle.generation, state, state, reason);
  }

  private appendEvent(generation: number, from: string, to: string, reason: string): void {
    this.ctx.storage.sql.exec(
      "INSERT INTO outbox (generation, from_state, to_state, reason, at) VALUES (?, ?, ?, ?, ?)",
      generation,
      from,
      to,
      reason,
      Date.now(),
    );
  }

  private pendingEvents(): LifecycleEventRow[] {
    return this.ctx.storage.sql
      .exec<{
        seq: number;
        generation: number;
        from_state: string;
        to_state: string;
        reason: string;
        at: number;
      }>("SELECT seq, generation, from_state, to_state, reason, at FROM outbox ORDER BY seq LIMIT 500")
      .toArray()
      .map((row) => ({
        seq: row.seq,
        generation: row.generation,
        fromState: row.from_state,
        toState: row.to_state,
        reason: row.reason,
        at: row.at,
      }));
  }

  private forgetEvents(upTo: number): void {
    this.ctx.storage.sql.exec("DELETE FROM outbox WHERE seq <= ?", upTo);
  }

  /** Rows waiting in either outbox (lifecycle events, usage deltas). */
  private pendingOutboxRows(): number {
    return this.ctx.storage.sql
      .exec<{ n: number }>("SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM usage_outbox) AS n")
      .one().n;
  }

  /** Moves the in-memory usage counters into the durable usage outbox. */
  private stageUsage(): void {
    if (isZeroUsage(this.usage)) return;
    const u = this.usage;
    this.ctx.storage.sql.exec(
      "INSERT INTO usage_outbox (queries, rows_returned, errors, lease_ms, pool_starts, at) VALUES (?, ?, ?, ?, ?, ?)",
      u.queries,
      u.rowsReturned,
      u.errors,
      u.leaseMs,
      u.poolStarts,
      Date.now(),
    );
    this.usage = { ...zeroUsage };
  }

  private pendingUsage(): UsageDeltaRow[] {
    return this.ctx.storage.sql
      .exec<{
        seq: number;
        queries: number;
        rows_returned: number;
        errors: number;
        lease_ms: number;
        pool_starts: number;
        at: number;
      }>("SELECT * FROM usage_outbox ORDER BY seq LIMIT 500")
      .toArray()
      .map((row) => ({
        seq: row.seq,
        queries: row.queries,
        rowsReturned: row.rows_returned,
        errors: row.errors,
        leaseMs: row.lease_ms,
        poolStarts: row.pool_starts,
        at: row.at,
      }));
  }

  /**
   * Appends both outboxes to the control plane in one connection. Each append is idempotent on
   * (tenant, seq), so a flush that dies after the append and before the local delete is harmless.
   */
  private async flushOutboxes(): Promise<void> {
    const record = this.record;
    this.stageUsage();
    const events = this.pendingEvents();
    const usage = this.pendingUsage();
    if (!record || (events.length === 0 && usage.length === 0)) return;
    await withControlPlane(this.config, this.env, async (db) => {
      await appendLifecycleEvents(db, record.tenantId, events);
      await appendUsageDeltas(db, record.tenantId, usage);
    });
    const lastEvent = events.at(-1);
    if (lastEvent) this.forgetEvents(lastEvent.seq);
    const lastUsage = usage.at(-1);
    if (lastUsage) this.ctx.storage.sql.exec("DELETE FROM usage_outbox WHERE seq <= ?", lastUsage.seq);
  }

  private async ensureAlarm(at: number): Promise<void> {
    const current = await this.ctx.storage.getAlarm();
    if (current === null || current > at) await this.ctx.storage.setAlarm(at);
  }

  private readKv<T>(key: string): T | null {
    const row = this.ctx.storage.sql.exec<{ v: string }>("SELECT v FROM kv WHERE k = ?", key).toArray()[0];
    return row ? (JSON.parse(row.v) as T) : null;
  }

  private writeKv(key: string, value: unknown): void {
    this.ctx.storage.sql.exec("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", key, JSON.stringify(value));
  }

  private failure(error: unknown): SqlOutcome {
    const postgres = postgresErrorBody(error);
    if (postgres) return { ok: false, postgres };
    return { ok: false, error: this.toLessorError(error).toWire() };
  }

  private toLessorError(error: unknown): LessorError {
    if (error instanceof LessorError) {
      if (error.code === "internal" || error.code === "misconfigured") {
        logEvent("error", "tenant_object_error", {
          tenant: this.record?.tenantId,
          failure: describeFailure(error),
        });
      }
      return error;
    }
    logEvent("error", "tenant_object_error", {
      tenant: this.record?.tenantId,
      failure: describeFailure(error),
    });
    return new LessorError("internal", { cause: error });
  }
}

/** SQLSTATE classes after which the connection cannot be reused (terminated, protocol trouble). */
function isConnectionFatal(error: unknown): boolean {
  const code = (error as { code?: unknown }).code;
  return typeof code === "string" && (code.startsWith("57P") || code.startsWith("08"));
}

/**
 * Leaves the connection as a fresh one would be: outside any transaction and, where the work may
 * have set session state, without it. Returns an error if the connection cannot be made clean, so
 * the pool destroys it instead of reusing it.
 */
async function resetConnection(client: PoolClient, discardSessionState: boolean): Promise<Error | undefined> {
  try {
    if (!isIdleOutsideTransaction(client)) await client.query("ROLLBACK");
    if (discardSessionState) await client.query("DISCARD ALL");
    return undefined;
  } catch (error) {
    return error instanceof Error ? error : new Error("reset failed");
  }
}

function randomToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(24));
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
