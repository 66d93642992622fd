/**
 * TenantObject: one Durable Object per tenant. It owns the tenant's pool of real Postgres
 * connections, the pool lifecycle (see core/lifecycle.ts) and the leases counted against it.
 *
 * Why the pool lives here (docs/adr/001-pool-in-durable-object.md): a Durable Object is the only
 * place in Workers where one object per tenant outlives a request, so the pool's connections are
 * reused across requests and concurrent first requests can converge on one start.
 *
 * Single flight: input gates do not cover Postgres I/O, so two requests can both see `stopped`.
 * The in-memory `starting` promise makes the second one join the first; the persisted generation
 * makes a restarted object start a new generation rather than pretend the old pool is alive.
 */
import { DurableObject } from "cloudflare:workers";
import type { Pool, PoolClient } from "@neondatabase/serverless";
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
import {
  admitDecision,
  beginDrain,
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
  stopped,
} from "../core/lifecycle.ts";
import {
  type PostgresErrorBody,
  postgresErrorBody,
  type SqlRequest,
  type SqlResponseBody,
} from "../core/neon-protocol.ts";
import { hashesEqual } from "../crypto/keys.ts";
import { unseal } from "../crypto/seal.ts";
import { describeFailure, LessorError, logEvent, type WireError } from "../errors/index.ts";
import { openPool } from "../postgres/index.ts";
import {
  appendUsageDeltas,
  isZeroUsage,
  type UsageCounters,
  type UsageDeltaRow,
  zeroUsage,
} from "../usage/index.ts";
import { isIdleOutsideTransaction, trackTransactionStatus } from "./connection-state.ts";
import { executeSqlRequest, mayLeaveSessionState } from "./execute.ts";
import type { TenantRecord, TenantRuntimeStatus } from "./record.ts";

/** The answer to a `/sql` request, as it crosses RPC back to the Worker. */
export type SqlOutcome =
  | { ok: true; body: SqlResponseBody }
  | { ok: false; postgres: PostgresErrorBody }
  | { ok: false; error: WireError };

/** Alarm cadence while a pool is warm: keeps the object resident and checks idleness. */
const heartbeatMs = 30_000;
/** How long an unknown tenant is remembered as unknown, so probes do not hammer the control plane. */
const negativeCacheMs = 5_000;

interface LiveLease {
  generation: number;
  pool: Pool;
}

export class TenantObject extends DurableObject<Env> {
  private readonly config: LessorConfig;
  private lifecycle: Lifecycle = initialLifecycle;
  private record: TenantRecord | null = null;
  private unknownUntil = 0;

  /** The pool of the current generation; null unless the lifecycle is ready or draining. */
  private pool: Pool | null = null;
  private poolGeneration = 0;
  private starting: Promise<void> | null = null;
  private leases = 0;
  private idleSince: number | null = null;
  private lastUsedAt: number | null = null;
  /** Usage since the last flush; moved to the usage outbox by the alarm. */
  private usage: UsageCounters = { ...zeroUsage };

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.config = loadConfig(env);
    ctx.blockConcurrencyWhile(async () => {
      ctx.storage.sql.exec(`CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT NOT NULL)`);
      ctx.storage.sql.exec(`CREATE TABLE IF NOT EXISTS outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, generation INTEGER NOT NULL, from_state TEXT NOT NULL,
        to_state TEXT NOT NULL, reason TEXT NOT NULL, at INTEGER NOT NULL)`);
      ctx.storage.sql.exec(`CREATE TABLE IF NOT EXISTS usage_outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, queries INTEGER NOT NULL, rows_returned INTEGER NOT NULL,
        errors INTEGER NOT NULL, lease_ms INTEGER NOT NULL, pool_starts INTEGER NOT NULL, at INTEGER NOT NULL)`);
      this.record = this.readKv<TenantRecord>("record");
      const persisted = this.readKv<Lifecycle>("lifecycle") ?? initialLifecycle;
      const { lifecycle, deadGeneration } = recoverAfterRestart(persisted);
      this.lifecycle = persisted;
      if (deadGeneration !== null) {
        // No pool survives a restart: the persisted generation is dead, whatever it claimed.
        this.transition(lifecycle, "object_restarted");
      }
      if (this.pendingEventCount() > 0) await this.ensureAlarm(Date.now() + 1_000);
    });
  }

  // ── RPC ────────────────────────────────────────────────────────────────────────────────────────

  /** Installs or replaces the catalog record (provisioning, disable, enable). */
  async configure(record: TenantRecord): Promise<void> {
    this.record = record;
    this.unknownUntil = 0;
    this.writeKv("record", record);
  }

  /** Authenticates the key hash and runs one `/sql` request under a lease. */
  async sql(tenantId: string, keyHash: string, request: SqlRequest): Promise<SqlOutcome> {
    let authenticated = false;
    try {
      const record = await this.authenticate(tenantId, keyHash);
      authenticated = true;
      const lease = await this.acquireLease(record);
      const leasedAt = Date.now();
      try {
        const body = await this.runOnLease(lease, request);
        this.usage.queries++;
        this.usage.rowsReturned +=
          "results" in body ? body.results.reduce((n, r) => n + r.rows.length, 0) : body.rows.length;
        return { ok: true, body };
      } finally {
        this.usage.leaseMs += Date.now() - leasedAt;
        this.releaseLease();
      }
    } catch (error) {
      if (authenticated) {
        this.usage.queries++;
        this.usage.errors++;
      }
      const postgres = postgresErrorBody(error);
      if (postgres) return { ok: false, postgres };
      return { ok: false, error: this.toLessorError(error).toWire() };
    }
  }

  /**
   * Authenticates a tenant key hash for the tenant's own REST endpoints. Answers with the same
   * refusal for an unknown tenant and a wrong key; a disabled tenant is refused after the key checks.
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

  /** The runtime status (no secrets). */
  async status(): Promise<TenantRuntimeStatus> {
    const lc = this.lifecycle;
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
      pendingEvents: this.pendingEventCount(),
    };
  }

  override async alarm(): Promise<void> {
    const now = Date.now();
    const decision = idleDecision({
      state: this.lifecycle.state,
      leases: this.leases,
      idleSince: this.idleSince,
      now,
      idleTimeoutMs: this.config.idleTimeoutMs,
      heartbeatMs,
    });
    if (decision.kind === "drain") await this.drainIdle("idle_timeout");
    await this.flushOutboxes().catch((error: unknown) =>
      logEvent("warn", "outbox_flush_failed", {
        tenant: this.record?.tenantId,
        failure: describeFailure(error),
      }),
    );
    const next = decision.kind === "rearm" ? decision.at : null;
    if (next !== null) await this.ensureAlarm(next);
    else if (this.pendingEventCount() > 0) await this.ensureAlarm(now + heartbeatMs);
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
    // Bounded: each pass either returns, throws, or waits on a start that itself settles.
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
          this.starting ??= this.startGeneration(record).finally(() => {
            this.starting = null;
          });
          await this.starting;
          break;
        case "join_start":
          if (this.starting) await this.starting;
          else this.transition({ ...this.lifecycle, state: "stopped" }, "start_abandoned");
          break;
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
    if (this.leases === 0) this.idleSince = Date.now();
  }

  private async startGeneration(record: TenantRecord): Promise<void> {
    this.transition(beginStart(this.lifecycle), this.lifecycle.state === "failed" ? "retry" : "demand");
    let pool: Pool | null = null;
    try {
      const sealed = await withControlPlane(this.config, this.env, async (db) => {
        // Insert-only ledger: a conflict means this generation was taken; move past it.
        for (
          let tries = 0;
          !(await appendGeneration(db, record.tenantId, this.lifecycle.generation, record.poolSize));
          tries++
        ) {
          if (tries >= 3)
            throw new LessorError("internal", { internal: "generation ledger kept conflicting" });
          this.transition(
            skipGeneration(this.lifecycle, await highestGeneration(db, record.tenantId)),
            "generation_taken",
          );
        }
        const events = this.pendingEvents();
        await appendLifecycleEvents(db, record.tenantId, events);
        const last = events.at(-1);
        if (last) this.forgetEvents(last.seq);
        return loadSealedPassword(db, record.tenantId);
      });
      if (!sealed) throw new LessorError("internal", { internal: "tenant has no sealed credential" });
      const host = this.config.hosts.get(record.host);
      if (!host)
        throw new LessorError("misconfigured", { internal: `tenant host ${record.host} is not configured` });
      const generation = this.lifecycle.generation;
      pool = openPool(
        this.config,
        {
          host: host.hostname,
          port: host.port,
          user: record.roleName,
          password: await unseal(this.env.LESSOR_SEAL_KEY, record.tenantId, sealed),
          database: record.databaseName,
        },
        {
          max: record.poolSize,
          applicationName: `lessor:${record.tenantId}:${generation}`,
          onError: (error) => this.onPoolError(generation, error),
        },
      );
      // One connection proves the credentials and the database before the pool is declared ready.
      await pool.query("SELECT 1");
      this.pool = pool;
      this.poolGeneration = generation;
      this.idleSince = Date.now();
      this.usage.poolStarts++;
      this.transition(startSucceeded(this.lifecycle), "pool_ready");
      await this.ensureAlarm(Date.now() + Math.min(heartbeatMs, this.config.idleTimeoutMs));
    } catch (error) {
      if (pool) void pool.end().catch(() => undefined);
      const reason: FailureReason =
        error instanceof LessorError && error.code === "control_plane_unavailable"
          ? "control_plane_unavailable"
          : classifyStartFailure(error);
      logEvent("warn", "pool_start_failed", {
        tenant: record.tenantId,
        generation: this.lifecycle.generation,
        reason,
        failure: describeFailure(error),
      });
      this.transition(startFailed(this.lifecycle, reason, Date.now(), Math.random()), reason);
      await this.ensureAlarm(Date.now() + 1_000);
    }
  }

  private onPoolError(generation: number, error: Error): void {
    // An idle pooled connection died (backend killed, database restarted). The pool replaces it on
    // the next checkout; the generation itself stays valid.
    logEvent("warn", "pool_connection_error", {
      tenant: this.record?.tenantId,
      generation,
      failure: describeFailure(error),
    });
  }

  private async runOnLease(lease: LiveLease, request: SqlRequest): Promise<SqlResponseBody> {
    let client: PoolClient;
    try {
      client = await lease.pool.connect();
    } catch (error) {
      throw new LessorError(/timeout/i.test(String(error)) ? "lease_timeout" : "connection_lost", {
        internal: "pool checkout failed",
        cause: error,
      });
    }
    trackTransactionStatus(client);
    let broken: Error | undefined;
    try {
      return await executeSqlRequest(client, request);
    } catch (error) {
      if (!postgresErrorBody(error) || isConnectionFatal(error)) {
        broken = error instanceof Error ? error : new Error("query failed");
        throw new LessorError("connection_lost", { internal: "connection failed mid-query", cause: error });
      }
      throw error;
    } finally {
      if (!broken) broken = await resetConnection(client, request);
      client.release(broken);
    }
  }

  /** Drains an idle generation: only if no lease is held, and it stops only the generation it drained. */
  private async drainIdle(reason: string): Promise<void> {
    if (this.lifecycle.state !== "ready" || this.leases > 0) return;
    const generation = this.lifecycle.generation;
    this.transition(beginDrain(this.lifecycle), reason);
    const pool = this.pool;
    this.pool = null;
    this.transition(stopped(this.lifecycle, generation), "drained");
    this.idleSince = null;
    if (pool) await pool.end().catch(() => undefined);
  }

  // ── Persistence ────────────────────────────────────────────────────────────────────────────────

  /** Persists the new lifecycle and appends the transition to the outbox in one storage transaction. */
  private transition(next: Lifecycle, reason: string): void {
    const previous = this.lifecycle;
    this.lifecycle = next;
    this.ctx.storage.transactionSync(() => {
      this.writeKv("lifecycle", next);
      if (previous.state !== next.state || previous.generation !== next.generation) {
        this.ctx.storage.sql.exec(
          "INSERT INTO outbox (generation, from_state, to_state, reason, at) VALUES (?, ?, ?, ?, ?)",
          next.generation,
          previous.state,
          next.state,
          reason,
          Date.now(),
        );
      }
    });
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
  private pendingEventCount(): number {
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
 * Leaves the connection as a fresh one would be: outside any transaction, and without session state
 * the request may have set. Returns an error if the connection cannot be made clean, so the pool
 * destroys it instead of reusing it.
 */
async function resetConnection(client: PoolClient, request: SqlRequest): Promise<Error | undefined> {
  try {
    if (!isIdleOutsideTransaction(client)) await client.query("ROLLBACK");
    if (mayLeaveSessionState(request)) await client.query("DISCARD ALL");
    return undefined;
  } catch (error) {
    return error instanceof Error ? error : new Error("reset failed");
  }
}
