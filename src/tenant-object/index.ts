/**
 * TenantObject: one Durable Object per tenant, owner of its pool (docs/adr/001). Only its RPC front:
 * each capability is a room installed once (rooms.ts), each RPC names its purpose to the one gate
 * (kernel/gate.ts), every holder is in one registry (kernel/holders.ts). Why: docs/adr/026.
 */
import { DurableObject } from "cloudflare:workers";
import type { SqlRequest, Statement } from "../core/neon-protocol.ts";
import { driverOutputMode, type OutputMode } from "../core/result-shape.ts";
import { type GatePurpose, migrationSkipReason } from "../core/tenant-gate.ts";
import { LessorError, type WireError } from "../errors/index.ts";
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
import { heartbeat } from "./heartbeat.ts";
import { recheckAccess } from "./kernel/access.ts";
import { refusedSql, refusedVerdict } from "./kernel/gate.ts";
import { restoreObject } from "./kernel/restore.ts";
import { installRooms, type TenantRooms } from "./rooms.ts";
import { runtimeStatus } from "./status.ts";

export class TenantObject extends DurableObject<Env> {
  private readonly rooms: TenantRooms;

  constructor(ctx: DurableObjectState, env: Env) {
    super(ctx, env);
    this.rooms = installRooms(ctx, env);
    ctx.blockConcurrencyWhile(() => restoreObject(this.rooms.rt, this.rooms.auth, this.rooms.pool));
  }

  /** The one gate: `work` runs if `purpose` may proceed, else `refused`; usage is saved soon after. */
  private async through<T>(
    purpose: GatePurpose,
    id: string,
    refused: (e: WireError) => T,
    work: () => Promise<T>,
  ) {
    const refusal = this.rooms.gate.refusal(purpose, id);
    if (refusal) return refused(refusal);
    try {
      return await work();
    } finally {
      this.rooms.rt.noteUsage();
    }
  }

  /** Installs the catalog record (provisioning, disable, keys); a late refresh (erasing, moving) is skipped. */
  async configure(record: TenantRecord): Promise<void> {
    if (this.rooms.gate.through("configure", null).kind === "skip") return;
    await this.rooms.auth.install(record);
    // Every holder is checked against the new record: a key revoked or expired, a tenant disabled.
    await recheckAccess(this.rooms.rt);
  }

  /** Pins or unpins the pool (never an eviction victim); skipped once an erase or a move owns the object. */
  async setPinned(pinned: boolean): Promise<void> {
    if (this.rooms.gate.through("pin", null).kind === "skip") return;
    await this.rooms.rt.storage.open();
    this.rooms.rt.pinned = pinned;
    this.rooms.rt.storage.write("pinned", pinned);
    await this.rooms.pool.reportToBudget();
  }

  /** Authenticates a tenant key hash for the tenant's own REST endpoints. */
  verifyKey(tenantId: string, proof: KeyProof): Promise<Verdict> {
    return this.through("query", tenantId, refusedVerdict, async () => {
      try {
        await this.rooms.auth.authenticate(tenantId, proof);
        return { ok: true };
      } catch (error) {
        return { ok: false, error: asLessorError(this.rooms.rt.tenantId, error).toWire() };
      }
    });
  }

  /** One `/sql` request under a lease; with `bearer`, as the end user whose token it is (JWT mode). */
  sql(
    tenantId: string,
    proof: KeyProof,
    request: SqlRequest,
    requiredSchemaVersion: number | null = null,
    bearer: string | null = null,
  ): Promise<SqlOutcome> {
    return this.through("query", tenantId, refusedSql, () =>
      this.rooms.queries.sql(tenantId, proof, request, requiredSchemaVersion, bearer),
    );
  }

  openSession(tenantId: string, proof: KeyProof, ttlMs: number): Promise<SessionOpened> {
    return this.through("query", tenantId, refusedVerdict, () =>
      this.rooms.sessions.open(tenantId, proof, ttlMs),
    );
  }

  sessionSql(
    tenantId: string,
    proof: KeyProof,
    token: string,
    statement: Statement,
    output: OutputMode = driverOutputMode,
  ): Promise<SqlOutcome> {
    return this.through("lease", tenantId, refusedSql, () =>
      this.rooms.sessions.sql(tenantId, proof, token, statement, output),
    );
  }

  closeSession(tenantId: string, proof: KeyProof, token: string): Promise<Verdict> {
    return this.through("lease", tenantId, refusedVerdict, () =>
      this.rooms.sessions.close(tenantId, proof, token),
    );
  }

  /** A wire connection the edge authenticated: its WebSocket, or a JSON refusal (wire.ts). */
  override async fetch(request: Request): Promise<Response> {
    const open = parseWireOpen(request.headers.get(wireOpenHeader));
    if (!open || request.headers.get("Upgrade")?.toLowerCase() !== "websocket") {
      const error = new LessorError("not_found").toWire();
      return Response.json({ error, authenticated: false }, { status: 404 });
    }
    const refused = (error: WireError) => Response.json({ error, authenticated: false }, { status: 409 });
    return this.through("query", open.tenantId, refused, () => this.rooms.wire.accept(open));
  }

  /** A CancelRequest for the wire connection with this cancel key; true if a statement was cancelled. */
  async cancelWire(pid: number, secret: number): Promise<boolean> {
    return this.rooms.gate.through("observe", null).kind === "proceed" && this.rooms.wire.cancel(pid, secret);
  }

  /** The runtime status (no secrets). */
  async status(): Promise<TenantRuntimeStatus> {
    this.rooms.gate.admit("observe", null);
    return runtimeStatus(this.rooms.rt, this.rooms);
  }

  /** Operator drain (see drain.ts); answers the status after it (a job that owns the pool: no drain). */
  async drain(force: boolean): Promise<TenantRuntimeStatus> {
    if (this.rooms.gate.through("drain", null).kind === "proceed") await this.rooms.drains.drain(force);
    return this.status();
  }

  /** Asked by the BudgetObject: stop this generation if it is idle right now. */
  evictIfIdle(generation: number): Promise<EvictOutcome> {
    return (
      this.rooms.gate.forwardTo("budget")?.evictIfIdle(generation) ??
      this.rooms.drains.evictIfIdle(generation)
    );
  }

  /** Asked by the BudgetObject: give back up to `want` idle connections of `generation` (sizing.ts). */
  shrinkIdle(generation: number, want: number): Promise<ShrinkOutcome> {
    const owner = this.rooms.gate.forwardTo("budget");
    return owner ? owner.shrinkIdle(generation, want) : this.rooms.pool.sizing.shrinkIdle(generation, want);
  }

  /** For the orphan reaper: does this object still hold connections of `generation`? */
  async holdsGeneration(generation: number): Promise<boolean> {
    const owner = this.rooms.gate.forwardTo("budget");
    return owner ? owner.holdsGeneration(generation) : this.rooms.pool.generations.holds(generation);
  }

  /** For the budget's reconcile: is `generation` still held, and the pool's own facts (drain.ts). */
  async checkGeneration(generation: number): Promise<GenerationCheck> {
    const owner = this.rooms.gate.forwardTo("budget");
    return owner ? owner.checkGeneration(generation) : this.rooms.drains.checkGeneration(generation);
  }

  /** For budget reconciliation: does this instance still hold the maintenance slot `leaseId`? */
  async holdsMaintenance(leaseId: string): Promise<boolean> {
    if (this.rooms.rt.maintenanceHeld.has(leaseId)) return true;
    return this.rooms.gate.forwardTo("budget")?.holdsMaintenance(leaseId) ?? false;
  }

  /** Rotates the tenant's database credential through overlapping generations (see rotation.ts). */
  rotateCredentials(tenantId: string): Promise<RotateOutcome> {
    return this.through("rotate", tenantId, refusedVerdict, () => this.rooms.rotation.rotate(tenantId));
  }

  /** Moves a customer's database to a credential its customer supplied (rotation.ts `supply`). */
  supplyCredential(
    tenantId: string,
    user: string | null,
    password: string,
    actor: string,
  ): Promise<RotateOutcome> {
    return this.through("rotate", tenantId, refusedVerdict, async () => {
      const record = await this.rooms.auth.resolve(tenantId).catch(() => null);
      return this.rooms.rotation.supply(tenantId, user ?? record?.roleName ?? "", password, actor);
    });
  }

  /** Migrates the database to `targetVersion` (migrate.ts); a tenant erasing, moving or moved away is skipped. */
  migrate(tenantId: string, targetVersion: number, drainTimeoutMs: number): Promise<MigrateOutcome> {
    if (this.rooms.gate.through("migrate", tenantId).kind === "skip") {
      const reason = migrationSkipReason(this.rooms.gate.stateFor(tenantId));
      return Promise.resolve({ outcome: "skipped", reason });
    }
    return this.rooms.migration.migrate(tenantId, targetVersion, drainTimeoutMs);
  }

  /** Starts erasing the tenant (or answers the erase running); the gate is closed when this answers. */
  requestErase(tenantId: string, actor: string, force: boolean): Promise<EraseAnswer> {
    return this.through("erase", tenantId, refusedVerdict, () =>
      this.rooms.erasure.request(tenantId, actor, force),
    );
  }

  /** Resumes a running erase from its progress row (the cron trigger calls this); answers its status. */
  resumeErase(tenantId: string): Promise<EraseAnswer> {
    return this.through("resume", tenantId, refusedVerdict, () => this.rooms.erasure.resume(tenantId));
  }

  /** Starts moving the tenant to region `to` (or answers the move running); the fence is closed when this answers. */
  requestMove(tenantId: string, to: string, actor: string, force: boolean): Promise<MoveAnswer> {
    return this.through("move", tenantId, refusedVerdict, () =>
      this.rooms.moves.request(tenantId, to, actor, force),
    );
  }

  /** Resumes a running move from its progress row (the cron trigger calls this); answers its status. */
  resumeMove(tenantId: string): Promise<MoveAnswer> {
    return this.through("resume", tenantId, refusedVerdict, () => this.rooms.moves.resume(tenantId));
  }

  /** Called on the new region's object at a move's `start` stage (move.ts `moveIn`). */
  async moveIn(moved: MovedIn): Promise<void> {
    this.rooms.gate.admit("move_in", moved.record.tenantId);
    await this.rooms.moves.moveIn(moved);
  }

  /** The one alarm (kernel/alarm.ts): holders whose key expired end now, idle or not; then the heartbeat. */
  override async alarm(): Promise<void> {
    await recheckAccess(this.rooms.rt);
    const { pool, sessions, drains, erasure, moves } = this.rooms;
    await heartbeat(this.rooms.rt, { pool, sessions, drain: drains, erase: erasure, move: moves });
  }
}
