/**
 * TenantObject: one Durable Object per tenant. It owns the tenant's pool of real Postgres
 * connections, the pool lifecycle (core/lifecycle.ts) and the leases counted against it: one per
 * `/sql` request in flight, and one per open session lease (a pinned connection across requests).
 *
 * Why the pool lives here: docs/adr/001-pool-in-durable-object.md. This class is only the RPC
 * front; each job has a room of its own (docs/adr/006-tenant-object-rooms.md):
 *
 *     runtime.ts    shared state; the one place the lifecycle changes (decided by the core)
 *     storage.ts    the object's SQLite tables (storage-schema.ts, drizzle migrations)
 *     auth.ts       the tenant record and the key check
 *     pool.ts       admission, single-flight start, generation ledger, leases, stop
 *     sizing.ts     adaptive pool size: observed use, growth and shrink (the policy is core/adaptive.ts)
 *     query.ts      `/sql` on a pooled connection (execute.ts speaks the protocol)
 *     sessions.ts   session leases, TTL, reclaim
 *     wire.ts       Postgres wire protocol connections (transaction and session mode)
 *     drain.ts      operator drain and budget eviction
 *     migrate.ts    schema migrations under the object
 *     rotation.ts   credential rotation through overlapping generations
 *     outbox.ts     lifecycle events and usage to the control plane
 *     erase.ts      the tenant erase: the gate and the stages
 *     move.ts       the move to another region: the fence, the stages, the pointer left behind
 *     heartbeat.ts  the alarm
 *     test-hooks.ts test-only step hooks and per-tenant settings (inert in production)
 */
import { DurableObject } from "cloudflare:workers";
import { recoverAfterRestart } from "../core/lifecycle.ts";
import type { SqlRequest, Statement } from "../core/neon-protocol.ts";
import { driverOutputMode, type OutputMode } from "../core/result-shape.ts";
import { LessorError } from "../errors/index.ts";
import { tenantObject } from "../placement/index.ts";
import type { EvictOutcome, GenerationCheck, ShrinkOutcome } from "../rpc/budget.ts";
import type {
  EraseAnswer,
  KeyProof,
  MigrateOutcome,
  MoveAnswer,
  MovedIn,
  RotateOutcome,
  SessionOpened,
  SqlOutcome,
  TenantRecord,
  TenantRuntimeStatus,
  Verdict,
} from "../rpc/tenant.ts";
import { parseWireOpen, wireOpenHeader } from "../rpc/wire.ts";
import { asLessorError } from "./answers.ts";
import { TenantAuth } from "./auth.ts";
import { TenantDrain } from "./drain.ts";
import { TenantErase } from "./erase.ts";
import { heartbeat } from "./heartbeat.ts";
import { SchemaMigration } from "./migrate.ts";
import { movedError, movingError, TenantMove } from "./move.ts";
import { TenantPool } from "./pool.ts";
import { TenantQueries } from "./query.ts";
import { CredentialRotation } from "./rotation.ts";
import { type EraseGate, type MoveGate, TenantRuntime } from "./runtime.ts";
import { SessionLeases } from "./sessions.ts";
import { WireConnections } from "./wire.ts";

export class TenantObject extends DurableObject<Env> {
  private readonly rt: TenantRuntime;
  private readonly auth: TenantAuth;
  private readonly pool: TenantPool;
  private readonly queries: TenantQueries;
  private readonly sessions: SessionLeases;
  private readonly wire: WireConnections;
  private readonly drains: TenantDrain;
  private readonly migration: SchemaMigration;
  private readonly rotation: CredentialRotation;
  private readonly erasure: TenantErase;
  private readonly moves: TenantMove;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    const rt = new TenantRuntime(ctx, env);
    this.rt = rt;
    this.auth = new TenantAuth(rt);
    this.pool = new TenantPool(rt, {
      migrationDone: () => this.migration.done,
      onIdle: () => {
        if (rt.lifecycle.state === "draining") void this.drains.finishIfIdle();
      },
      credentialChange: () => this.rotation.inProgress,
      onRetired: (generation) => this.rotation.retired(generation),
      onRepair: (repair, count) => {
        const host = rt.record?.host;
        if (!host) return;
        ctx.waitUntil(
          rt
            .budget(host)
            .recordRepairs(repair, count)
            .catch(() => undefined),
        );
      },
    });
    this.queries = new TenantQueries(rt, this.auth, this.pool);
    this.sessions = new SessionLeases(rt, this.auth, this.pool);
    this.wire = new WireConnections(rt, this.auth, this.pool, this.sessions);
    this.drains = new TenantDrain(rt, this.pool, this.sessions, this.wire);
    this.migration = new SchemaMigration(rt, this.auth, this.pool);
    this.rotation = new CredentialRotation(rt, this.auth, this.pool);
    this.erasure = new TenantErase(rt, this.auth, this.pool, this.sessions, this.wire);
    this.moves = new TenantMove(rt, this.auth, this.pool, this.sessions);
    ctx.blockConcurrencyWhile(() => this.load());
  }

  /** Loads what storage holds; an object that never served a tenant has nothing (and creates nothing). */
  private async load(): Promise<void> {
    const rt = this.rt;
    if (!rt.storage.hasTables()) return;
    await rt.storage.open();
    this.auth.restoreRecord();
    rt.pinned = rt.storage.read<boolean>("pinned") ?? false;
    rt.fencePending = rt.storage.read<boolean>("fence") ?? false;
    rt.erase = rt.storage.read<EraseGate>("erase");
    rt.move = rt.storage.read<MoveGate>("move");
    rt.lifecycle = { ...rt.lifecycle, ...(rt.storage.read<typeof rt.lifecycle>("lifecycle") ?? {}) };
    this.pool.restoreLastUsed();
    const { lifecycle, deadGenerations } = recoverAfterRestart(rt.lifecycle);
    if (deadGenerations.length > 0 || lifecycle.migrating !== rt.lifecycle.migrating) {
      // No pool survives a restart: the persisted generations are dead, whatever they claimed (a
      // rotation's old and new generation included: neither is left running).
      rt.apply(lifecycle, "object_restarted");
    }
    if (deadGenerations.length > 0) rt.requireFence();
    // Usage a killed instance answered for but did not stage: the heartbeat flushes it.
    const unstagedUsage = rt.restoreUsage();
    if (rt.record) {
      const { host, tenantId } = rt.record;
      for (const dead of deadGenerations) {
        this.ctx.waitUntil(
          rt
            .budget(host)
            .release(host, tenantId, dead)
            .catch(() => undefined),
        );
      }
    }
    // A move not committed yet resumes from the alarm (a killed instance's runner is gone).
    const moveRunning = rt.move !== null && rt.move.committed !== true;
    if (rt.storage.pendingOutboxRows() > 0 || unstagedUsage || rt.erasing || moveRunning) {
      await rt.ensureAlarm(Date.now() + 1_000);
    }
  }

  // ── Catalog ────────────────────────────────────────────────────────────────────────────────────

  /** Installs or replaces the catalog record (provisioning, disable, enable, key changes). */
  async configure(record: TenantRecord): Promise<void> {
    // A move owns the object now: a late refresh must not bring keys back here.
    if (this.rt.move !== null) return;
    await this.auth.install(record);
    this.sessions.endLeasesOfRemovedKeys(record);
    this.wire.endForRemovedKeys(record);
    if (record.status === "disabled") this.wire.endAll(new LessorError("tenant_disabled"));
  }

  /** Pins or unpins the pool: a pinned pool is never chosen as an eviction victim. */
  async setPinned(pinned: boolean): Promise<void> {
    // An erase or a move owns the object now (the route refuses first; this covers a race with it).
    if (this.rt.erasing || this.rt.move !== null) return;
    // Called only for a tenant the catalog holds, so its storage may be created.
    await this.rt.storage.open();
    this.rt.pinned = pinned;
    this.rt.storage.write("pinned", pinned);
    await this.pool.reportToBudget();
  }

  /** Authenticates a tenant key hash for the tenant's own REST endpoints. */
  async verifyKey(tenantId: string, proof: KeyProof): Promise<Verdict> {
    const moved = this.moveRefusal(tenantId, "new");
    if (moved) return { ok: false, error: moved };
    try {
      await this.auth.authenticate(tenantId, proof);
      return { ok: true };
    } catch (error) {
      return { ok: false, error: asLessorError(this.rt.tenantId, error).toWire() };
    }
  }

  // ── Queries and session leases ─────────────────────────────────────────────────────────────────

  /**
   * Authenticates the key hash and runs one `/sql` request under a lease; with `bearer`, as the end
   * user whose token it is (JWT mode).
   */
  sql(
    tenantId: string,
    proof: KeyProof,
    request: SqlRequest,
    requiredSchemaVersion: number | null = null,
    bearer: string | null = null,
  ): Promise<SqlOutcome> {
    const moved = this.moveRefusal(tenantId, "new");
    if (moved) return Promise.resolve({ ok: false, error: moved, authenticated: false });
    return this.counted(this.queries.sql(tenantId, proof, request, requiredSchemaVersion, bearer));
  }

  openSession(tenantId: string, proof: KeyProof, ttlMs: number): Promise<SessionOpened> {
    const moved = this.moveRefusal(tenantId, "new");
    if (moved) return Promise.resolve({ ok: false, error: moved });
    return this.counted(this.sessions.open(tenantId, proof, ttlMs));
  }

  sessionSql(
    tenantId: string,
    proof: KeyProof,
    token: string,
    statement: Statement,
    output: OutputMode = driverOutputMode,
  ): Promise<SqlOutcome> {
    const moved = this.moveRefusal(tenantId, "lease");
    if (moved) return Promise.resolve({ ok: false, error: moved, authenticated: false });
    return this.counted(this.sessions.sql(tenantId, proof, token, statement, output));
  }

  closeSession(tenantId: string, proof: KeyProof, token: string): Promise<Verdict> {
    const moved = this.moveRefusal(tenantId, "lease");
    if (moved) return Promise.resolve({ ok: false, error: moved });
    return this.counted(this.sessions.close(tenantId, proof, token));
  }

  /**
   * Why this object refuses a caller of `tenantId` because of a move (null: it does not): while the
   * fence holds, new work gets `503 tenant_moving` (a statement on a lease opened before still
   * runs, until the drain ends the lease); once the tenant moved, everything gets `409
   * tenant_moved` naming its region, which the Worker follows (src/placement/moves.ts).
   */
  private moveRefusal(tenantId: string, purpose: "new" | "lease") {
    const gate = this.rt.move;
    if (gate?.tenantId !== tenantId) return null;
    if (gate.state === "moved") return movedError(gate.to).toWire();
    return purpose === "new" ? movingError().toWire() : null;
  }

  /** The new owner of a tenant that moved away, for the budget's and the reaper's questions. */
  private newOwner() {
    const gate = this.rt.move;
    return gate?.state === "moved" ? tenantObject(this.env, gate.to, gate.tenantId) : null;
  }

  /**
   * A wire connection the edge authenticated (src/routes/wire.ts): the key hash is checked here too,
   * and the answer is the WebSocket its traffic crosses, or a JSON refusal (wire.ts).
   */
  override async fetch(request: Request): Promise<Response> {
    const open = parseWireOpen(request.headers.get(wireOpenHeader));
    if (!open || request.headers.get("Upgrade")?.toLowerCase() !== "websocket") {
      return Response.json(
        { error: new LessorError("not_found").toWire(), authenticated: false },
        { status: 404 },
      );
    }
    const moved = this.moveRefusal(open.tenantId, "new");
    if (moved) return Response.json({ error: moved, authenticated: false }, { status: 409 });
    return this.counted(this.wire.accept(open));
  }

  /** A CancelRequest for the wire connection with this cancel key; true if a statement was cancelled. */
  async cancelWire(pid: number, secret: number): Promise<boolean> {
    return this.wire.cancel(pid, secret);
  }

  /**
   * Has the usage the work counted saved soon after (runtime.ts, `noteUsage`): batched, never a
   * storage write per request.
   */
  private async counted<T>(work: Promise<T>): Promise<T> {
    try {
      return await work;
    } finally {
      this.rt.noteUsage();
    }
  }

  // ── Operations ─────────────────────────────────────────────────────────────────────────────────

  /** The runtime status (no secrets). */
  async status(): Promise<TenantRuntimeStatus> {
    const { lifecycle: lc, record, config } = this.rt;
    const now = Date.now();
    const iso = (at: number | null) => (at === null ? null : new Date(at).toISOString());
    const drain = this.drains.current;
    return {
      state: lc.state,
      generation: lc.generation,
      poolSize: record?.poolSize ?? null,
      leases: this.pool.leases,
      lastUsedAt: iso(this.pool.lastUsedAt),
      idleSince: iso(this.pool.idleSinceReady),
      failureReason: lc.state === "failed" ? lc.failureReason : null,
      retryAt: lc.state === "failed" ? iso(lc.retryAt) : null,
      pendingEvents: this.rt.storage.pendingOutboxRows(),
      sessions: this.sessions.size,
      pinned: this.rt.pinned,
      migrating: lc.migrating,
      schemaVersion: record?.schemaVersion ?? null,
      drain: drain
        ? {
            startedAt: new Date(drain.startedAt).toISOString(),
            overdue: now - drain.startedAt > config.maxDrainMs,
            heldLeases: this.sessions.all().map((s) => ({
              lease: s.tokenHash.slice(0, 12),
              ageMs: now - s.createdAt,
            })),
          }
        : null,
      reclaimedLeases: this.rt.reclaimedLeases,
      retiring: this.pool.retiringStatus,
      rotatingTo: lc.rotatingTo,
      erasing: this.rt.erasing,
      move: this.rt.move ? { state: this.rt.move.state, to: this.rt.move.to } : null,
      storageRowsWritten: this.rt.storage.rowsWritten,
      pool: this.pool.sizing.status(),
    };
  }

  /** Operator drain (see drain.ts); answers the status after it. */
  async drain(force: boolean): Promise<TenantRuntimeStatus> {
    await this.drains.drain(force);
    return this.status();
  }

  /** Asked by the BudgetObject: stop this generation if it is idle right now. */
  evictIfIdle(generation: number): Promise<EvictOutcome> {
    const owner = this.newOwner();
    if (owner) return owner.evictIfIdle(generation);
    return this.drains.evictIfIdle(generation);
  }

  /**
   * Asked by the BudgetObject while a start or a growth waits: give back up to `want` idle
   * connections of `generation` (adaptive hosts; see sizing.ts). Never a lease in use.
   */
  shrinkIdle(generation: number, want: number): Promise<ShrinkOutcome> {
    const owner = this.newOwner();
    if (owner) return owner.shrinkIdle(generation, want);
    return this.pool.sizing.shrinkIdle(generation, want);
  }

  /** For the orphan reaper: does this object still hold connections of `generation`? */
  async holdsGeneration(generation: number): Promise<boolean> {
    const owner = this.newOwner();
    if (owner) return owner.holdsGeneration(generation);
    return this.pool.holds(generation);
  }

  /**
   * For the budget's reconcile: reclaims the leases held past their bound first (a lost release
   * must not keep the pool busy for ever), then says whether `generation` is still held and, if it
   * is the current ready one, the pool's own facts (the ledger corrects its copy from them).
   */
  async checkGeneration(generation: number): Promise<GenerationCheck> {
    const owner = this.newOwner();
    if (owner) return owner.checkGeneration(generation);
    this.pool.reclaimOverdueLeases(Date.now());
    const lc = this.rt.lifecycle;
    const current = lc.generation === generation && lc.state === "ready";
    return { holds: this.pool.holds(generation), report: current ? this.pool.report() : null };
  }

  /** For budget reconciliation: does this instance still hold the maintenance slot `leaseId`? */
  async holdsMaintenance(leaseId: string): Promise<boolean> {
    const owner = this.newOwner();
    if (owner && !this.rt.maintenanceHeld.has(leaseId)) return owner.holdsMaintenance(leaseId);
    return this.rt.maintenanceHeld.has(leaseId);
  }

  /** Rotates the tenant's database credential through overlapping generations (see rotation.ts). */
  async rotateCredentials(tenantId: string): Promise<RotateOutcome> {
    // An erasing or erased tenant gets no new credential (the erase removes the old one).
    if (this.rt.erase !== null) {
      const code = this.rt.erasing ? "tenant_erasing" : "tenant_erased";
      return { ok: false, error: new LessorError(code, { retryAfterSeconds: 5 }).toWire() };
    }
    const moved = this.moveRefusal(tenantId, "new");
    if (moved) return { ok: false, error: moved };
    // A rotation starts a pool (a pool start is counted in usage).
    return this.counted(this.rotation.rotate(tenantId));
  }

  /**
   * Moves a customer's database to a credential its customer supplied, through overlapping
   * generations (see rotation.ts `supply`); `user` null keeps the role.
   */
  async supplyCredential(
    tenantId: string,
    user: string | null,
    password: string,
    actor: string,
  ): Promise<RotateOutcome> {
    if (this.rt.erase !== null) {
      const code = this.rt.erasing ? "tenant_erasing" : "tenant_erased";
      return { ok: false, error: new LessorError(code, { retryAfterSeconds: 5 }).toWire() };
    }
    const record = await this.auth.resolve(tenantId).catch(() => null);
    return this.counted(this.rotation.supply(tenantId, user ?? record?.roleName ?? "", password, actor));
  }

  /** Migrates the tenant's database to `targetVersion` (see migrate.ts). */
  migrate(tenantId: string, targetVersion: number, drainTimeoutMs: number): Promise<MigrateOutcome> {
    // A campaign migrates its own region's tenants only: a tenant that moved away is not one.
    if (this.rt.move?.tenantId === tenantId) {
      return Promise.resolve({
        outcome: "skipped",
        reason: this.rt.move.state === "moving" ? "tenant_moving" : "tenant_unknown",
      });
    }
    return this.migration.migrate(tenantId, targetVersion, drainTimeoutMs);
  }

  // ── Erase ──────────────────────────────────────────────────────────────────────────────────────

  /** Starts erasing the tenant (or answers the erase running); the gate is closed when this answers. */
  requestErase(tenantId: string, actor: string, force: boolean): Promise<EraseAnswer> {
    const moved = this.moveRefusal(tenantId, "new");
    if (moved) return Promise.resolve({ ok: false, error: moved });
    return this.erasure.request(tenantId, actor, force);
  }

  /** Resumes a running erase from its progress row (the cron trigger calls this); answers its status. */
  resumeErase(tenantId: string): Promise<EraseAnswer> {
    return this.erasure.resume(tenantId);
  }

  // ── Move ───────────────────────────────────────────────────────────────────────────────────────

  /** Starts moving the tenant to region `to` (or answers the move running); the fence is closed when this answers. */
  requestMove(tenantId: string, to: string, actor: string, force: boolean): Promise<MoveAnswer> {
    return this.moves.request(tenantId, to, actor, force);
  }

  /** Resumes a running move from its progress row (the cron trigger calls this); answers its status. */
  resumeMove(tenantId: string): Promise<MoveAnswer> {
    return this.moves.resume(tenantId);
  }

  /**
   * Called on the new region's object at a move's `start` stage: the record, and the sequence
   * numbers its outboxes go on from. A pointer this object held (the tenant lived here before and
   * moved away) is dropped: it is the owner again.
   */
  async moveIn(moved: MovedIn): Promise<void> {
    if (this.rt.move !== null) {
      this.rt.move = null;
      if (this.rt.storage.isOpen) this.rt.storage.forget("move");
    }
    await this.auth.install(moved.record);
    this.rt.storage.raiseSequences(moved.eventSeq, moved.usageSeq);
  }

  override async alarm(): Promise<void> {
    await heartbeat(this.rt, {
      pool: this.pool,
      sessions: this.sessions,
      drain: this.drains,
      erase: this.erasure,
      move: this.moves,
    });
  }
}
