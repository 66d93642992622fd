/**
 * A tenant's move to another region, run by the object of the region it leaves
 * (docs/adr/023-regions.md; the order is src/core/move.ts).
 *
 * `request` closes the fence before it answers: in this object at once (no await between the last
 * check and the close, so no request, lease or migration slips in), and in this region's catalog
 * (the tenant's row `moving`, the job's first progress row written, in one transaction). Then the
 * stages run from the alarm, each recorded in the job's row before the next:
 *
 *     drain → copy → switch → start → cleanup → commit
 *
 * One owner throughout: until `switch` this object is the only one that may serve the tenant, and
 * it serves nothing new; `drain` stops its pool and releases its budget before `copy` writes the
 * new region's rows, which serve nothing until `switch` gives them their status. From `switch` on,
 * this object holds no pool and no budget and answers every caller with where the tenant went.
 *
 * The runner is single-flight in the object, resumed by its alarm (with backoff after a failure)
 * and by the cron trigger of this region (`move-resume`) when the object lost its memory.
 */

import { eq } from "drizzle-orm";
import { loadTenantRecord, tenantRecordFromRow, withControlPlane } from "../control-plane/index.ts";
import { tenants } from "../control-plane/schema.ts";
import {
  fencedAt,
  type MoveStage,
  moveRequestDecision,
  moveRetryDelay,
  moveStageAfter,
} from "../core/move.ts";
import { LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import {
  advanceMove,
  auditMove,
  cleanupSource,
  commitMoveSource,
  loadMoveOf,
  type MoveJob,
  markMoved,
  moveStatusOf,
  openMove,
  placementRefusal,
  readTenantRows,
  recordMoveFailure,
  sequenceFloors,
  switchTarget,
  writeTenantRows,
} from "../move/store.ts";
import { type MoveStep, moveHooksForTests } from "../move/test-hooks.ts";
import { tenantObject } from "../placement/index.ts";
import type { MoveAnswer, MovedIn, MoveStatus } from "../rpc/tenant.ts";
import { asLessorError } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { holderEndError } from "./kernel/holders.ts";
import { type StagedJob, StagedJobRunner } from "./kernel/staged-job.ts";
import { flushOutboxes } from "./outbox.ts";
import type { TenantPool } from "./pool/index.ts";
import type { MoveGate, TenantRuntime } from "./runtime.ts";

/** Stages one run takes at most before it yields to the next alarm. */
const stagesPerRun = 10;
/** After forcing, how long the leases get to let go of their connections. */
const forcedEndWaitMs = 10_000;

export class TenantMove {
  private readonly runner: StagedJobRunner<MoveJob, MoveStage>;

  constructor(
    private readonly rt: TenantRuntime,
    private readonly auth: TenantAuth,
    private readonly pool: TenantPool,
  ) {
    this.runner = new StagedJobRunner(rt, this.stagedJob());
  }

  // ── The fence ──────────────────────────────────────────────────────────────────────────────────

  /** Starts moving the tenant to `to` (or answers the move running); the fence is closed when this answers. */
  async request(tenantId: string, to: string, actor: string, force: boolean): Promise<MoveAnswer> {
    try {
      return { ok: true, status: await this.open(tenantId, to, actor, force) };
    } catch (error) {
      return { ok: false, error: asLessorError(tenantId, error).toWire() };
    }
  }

  private async open(tenantId: string, to: string, actor: string, force: boolean): Promise<MoveStatus> {
    const rt = this.rt;
    const gate = rt.move?.tenantId === tenantId ? rt.move : null;
    // The gate (purpose `move`) refused a tenant erasing, erased or moved away before this ran.
    if (gate?.state === "moving") return this.statusAndKick(tenantId);
    const record = await this.auth.resolve(tenantId);
    // Not servable here: unknown, or moving while this object forgot it (its catalog row says so).
    const [row] = await this.onControlPlane(rt.region, (db) =>
      db.select({ status: tenants.status }).from(tenants).where(eq(tenants.id, tenantId)).limit(1),
    );
    // Placement rules hold for every operation that changes placement (core/tenant-data.ts `refuse`).
    const placement = await this.onControlPlane(rt.region, (db) => placementRefusal(db, tenantId));
    const targetKnown = rt.config.regions.has(to);
    const [taken] =
      targetKnown && to !== rt.region
        ? await this.onControlPlane(to, (db) =>
            db.select({ status: tenants.status }).from(tenants).where(eq(tenants.id, tenantId)).limit(1),
          )
        : [];
    const decision = moveRequestDecision({
      from: rt.region,
      to,
      targetKnown,
      status: row?.status ?? null,
      takenInTarget: taken !== undefined && taken.status !== "moving" && taken.status !== "moved",
      pinned: rt.pinned,
      migrating: rt.lifecycle.migrating,
      force,
      attached: placement === "tenant_attached",
    });
    if (decision.kind === "refuse") {
      throw new LessorError(decision.code, {
        ...(decision.code === "tenant_pinned"
          ? {
              publicMessage:
                "The tenant is pinned; pass force: true to move it anyway (its pool is drained).",
            }
          : {}),
        ...(decision.code === "tenant_migrating" ? { retryAfterSeconds: 5 } : {}),
      });
    }
    if (decision.kind === "running" || !record) {
      const job = await this.onControlPlane(rt.region, (db) => loadMoveOf(db, tenantId));
      if (job?.state !== "moving") throw new LessorError("tenant_not_found");
      if (job.toRegion !== to) throw new LessorError("tenant_moving", { retryAfterSeconds: 5 });
      this.adopt(job);
      await this.kick();
      return moveStatusOf(job);
    }
    // The fence closes here, before any await: a request, lease or migration that comes in while
    // the catalog is written is refused already.
    rt.move = { tenantId, jobId: 0, to, state: "moving", startedAt: Date.now() };
    // Stored before the catalog hears of it: a killed instance comes back fenced, and its runner
    // lifts a fence the catalog never recorded (no job row: `run`).
    await rt.storage.open();
    rt.storage.write("move", rt.move);
    let opened: Awaited<ReturnType<typeof openMove>>;
    try {
      opened = await this.onControlPlane(rt.region, (db) =>
        openMove(db, { tenantId, from: rt.region, to, actor, generation: rt.lifecycle.generation }),
      );
    } catch (error) {
      this.lift();
      throw error;
    }
    if (opened.kind === "refused") {
      this.lift();
      throw new LessorError(opened.code);
    }
    this.adopt(opened.job);
    if (opened.kind === "started") {
      logEvent("info", "move_started", { tenant: tenantId, from: rt.region, to, actor });
    }
    await this.step(tenantId, { point: "fence", stage: null });
    await this.kick();
    return moveStatusOf(opened.job);
  }

  private async statusAndKick(tenantId: string): Promise<MoveStatus> {
    const job = await this.onControlPlane(this.rt.region, (db) => loadMoveOf(db, tenantId));
    if (!job) throw new LessorError("move_not_found");
    if (job.state === "moving") await this.kick();
    return moveStatusOf(job);
  }

  /** Lifts a fence that no job row backs (the catalog refused it, or never heard of it). */
  private lift(): void {
    this.rt.move = null;
    if (this.rt.storage.isOpen) this.rt.storage.forget("move");
  }

  /** Takes the job's fence into this object (memory, and storage). */
  private adopt(job: MoveJob): void {
    const gate: MoveGate = {
      tenantId: job.tenantId,
      jobId: job.id,
      to: job.toRegion,
      // Once the switch is recorded, this object is a pointer.
      state: job.state === "moved" || !fencedAt(job.stage) ? "moved" : "moving",
      startedAt: job.startedAt.getTime(),
      committed: job.state === "moved",
    };
    this.rt.move = gate;
    if (this.rt.storage.isOpen) this.rt.storage.write("move", gate);
  }

  /** Runs the stages soon, from the alarm (so the request is answered first). */
  private async kick(): Promise<void> {
    await this.rt.alarms.rearm(this.runner.retryAt);
  }

  /**
   * On the new region's object at a move's `start` stage: the record, and the sequence numbers its
   * outboxes go on from. A pointer this object held (the tenant lived here before and moved away)
   * is dropped: it is the owner again.
   */
  async moveIn(moved: MovedIn): Promise<void> {
    if (this.rt.move !== null) {
      this.rt.move = null;
      if (this.rt.storage.isOpen) this.rt.storage.forget("move");
    }
    await this.auth.install(moved.record);
    this.rt.storage.raiseSequences(moved.eventSeq, moved.usageSeq);
  }

  // ── The runner ─────────────────────────────────────────────────────────────────────────────────

  /** Resumes the move from its progress row (the alarm and the cron call this); answers its status. */
  async resume(tenantId: string): Promise<MoveAnswer> {
    try {
      await this.runner.resume(tenantId);
      const job = await this.onControlPlane(this.rt.region, (db) => loadMoveOf(db, tenantId));
      if (!job) throw new LessorError("move_not_found");
      return { ok: true, status: moveStatusOf(job) };
    } catch (error) {
      return { ok: false, error: asLessorError(tenantId, error).toWire() };
    }
  }

  /** The alarm's part: resume a running move whose retry is due, or re-arm for when it is. */
  async tick(): Promise<void> {
    const gate = this.rt.move;
    if (gate && !gate.committed) await this.runner.tick(gate.tenantId);
  }

  /** The move as a staged job (kernel/staged-job.ts): its row, its stages, how it moves on. */
  private stagedJob(): StagedJob<MoveJob, MoveStage> {
    const rt = this.rt;
    return {
      name: "move",
      stagesPerRun,
      retryDelay: moveRetryDelay,
      load: (tenantId) => this.onControlPlane(rt.region, (db) => loadMoveOf(db, tenantId)),
      next: async (tenantId, job) => {
        if (!job) {
          // A fence stored here that never reached the catalog (killed in between): nothing moves.
          if (rt.move?.tenantId === tenantId && rt.move.jobId === 0) this.lift();
          return null;
        }
        if (job.state === "moved") {
          this.adopt(job);
          return null;
        }
        if (rt.move?.tenantId !== tenantId || rt.move.jobId !== job.id) this.adopt(job);
        return job.stage;
      },
      run: async (job, stage) => ({ kind: "done", counts: await this.runStage(job, stage) }),
      advance: async (job, stage, counts) => {
        const next = moveStageAfter(stage);
        if (next === null) return false;
        await this.onControlPlane(rt.region, (db) => advanceMove(db, job.id, stage, next, counts));
        return true;
      },
      idOf: (job) => job.id,
      heldId: () => rt.move?.jobId ?? null,
      recordFailure: (id, failures, message, delayMs) =>
        this.onControlPlane(rt.region, (db) => recordMoveFailure(db, id, failures, message, delayMs)),
      fields: (job) => ({ to: job.toRegion }),
      step: (tenantId, step) => this.step(tenantId, step),
    };
  }

  private async step(tenantId: string, step: MoveStep): Promise<void> {
    const hook = moveHooksForTests.onStep;
    if (!hook) return;
    await hook({ tenantId, step, abortObject: (reason) => this.rt.ctx.abort(reason) });
  }

  private onControlPlane<T>(region: string, work: Parameters<typeof withControlPlane<T>>[3]): Promise<T> {
    return withControlPlane(this.rt.config, this.rt.env, region, work, "lessor-move");
  }

  // ── The stages ─────────────────────────────────────────────────────────────────────────────────

  private runStage(job: MoveJob, stage: MoveStage): Promise<Record<string, number>> {
    switch (stage) {
      case "drain":
        return this.drain(job);
      case "copy":
        return this.copy(job);
      case "switch":
        return this.switchOver(job);
      case "start":
        return this.start(job);
      case "cleanup":
        return this.cleanup(job);
      case "commit":
        return this.commit(job);
    }
  }

  /**
   * `drain`: waits up to `LESSOR_ERASE_LEASE_WAIT_MS` for running statements and session leases to
   * end, then ends them; stops the pool (its connections closed, its budget released), ends any
   * backend a killed instance left on the host, and flushes the outboxes to this region's control
   * plane, so the copy that follows carries every event and count.
   */
  private async drain(job: MoveJob): Promise<Record<string, number>> {
    const rt = this.rt;
    const record =
      rt.record ?? (await this.onControlPlane(rt.region, (db) => recordOf(db, rt, job.tenantId)));
    const started = Date.now();
    const held = this.pool.leases;
    let ended = await this.pool.waitForNoLeases(rt.config.eraseLeaseWaitMs);
    let forcedSessions = 0;
    if (!ended) {
      // Every holder of a connection lets go (kernel/holders.ts): session leases, wire connections
      // of both modes; flights are waited for.
      forcedSessions = rt.holders.apply("move_drain").ended;
      ended = await this.pool.waitForNoLeases(forcedEndWaitMs);
      if (!ended) throw new Error(`${this.pool.leases} lease(s) would not end`);
    }
    await this.pool.settleStart();
    const generation = rt.lifecycle.generation;
    await this.pool.stop("move");
    // Whatever a killed instance of this object left on the host ends here: the new owner starts alone.
    const backendsEnded = record ? await this.pool.credentials.fence(record, "move") : 0;
    if (rt.fencePending) rt.clearFence();
    const released = await rt.budget(job.host).releaseTenant(job.host, job.tenantId);
    if (rt.storage.isOpen) await flushOutboxes(rt);
    return {
      leasesHeld: held,
      waitedMs: Date.now() - started,
      forcedSessions,
      backendsEnded,
      allocationsReleased: released,
      generation,
    };
  }

  /** `copy`: the tenant's rows, read from this region's control plane, written into the new one's. */
  private async copy(job: MoveJob): Promise<Record<string, number>> {
    const rows = await this.onControlPlane(this.rt.region, (db) => readTenantRows(db, job.tenantId));
    return this.onControlPlane(job.toRegion, (db) => writeTenantRows(db, rows));
  }

  /**
   * `switch`: the new region's row takes its status back (it serves from now on), this region's
   * row becomes the `moved` stub, and this object becomes a pointer to the new region.
   */
  private async switchOver(job: MoveJob): Promise<Record<string, number>> {
    const switched = await this.onControlPlane(job.toRegion, (db) =>
      switchTarget(db, job.tenantId, job.tenantStatus),
    );
    const stubbed = await this.onControlPlane(this.rt.region, (db) => markMoved(db, job.tenantId));
    const gate: MoveGate = {
      tenantId: job.tenantId,
      jobId: job.id,
      to: job.toRegion,
      state: "moved",
      startedAt: job.startedAt.getTime(),
    };
    this.rt.move = gate;
    await this.rt.storage.open();
    this.rt.storage.write("move", gate);
    // Whatever still holds the tenant here ends with a FATAL its driver answers by reconnecting,
    // which now reaches the new owner (kernel/holders.ts).
    const holdersEnded = this.rt.holders.apply("move_switch", {
      errorFor: (code) => (code === "tenant_moved" ? movedError(job.toRegion) : holderEndError(code)),
    }).ended;
    return { switched, stubbed, holdersEnded };
  }

  /**
   * `start`: the new region's object gets its record, and numbers its outboxes on from where this
   * region's left off; its first pool start takes a generation above every one the ledger (copied
   * with the tenant) holds.
   */
  private async start(job: MoveJob): Promise<Record<string, number>> {
    const { record, floors } = await this.onControlPlane(job.toRegion, async (db) => ({
      record: await loadTenantRecord(db, this.rt.config, job.tenantId),
      floors: await sequenceFloors(db, job.tenantId),
    }));
    if (!record) throw new Error("the new region's catalog does not serve the tenant yet");
    await tenantObject(this.rt.env, job.toRegion, job.tenantId).moveIn({
      record,
      eventSeq: floors.events,
      usageSeq: floors.usage,
    });
    return { generationFloor: floors.generation, eventSeq: floors.events, usageSeq: floors.usage };
  }

  /**
   * `cleanup`: every row of the tenant goes from this region's control plane but its `moved` stub,
   * and everything this object holds goes but its pointer (in one storage transaction).
   */
  private async cleanup(job: MoveJob): Promise<Record<string, number>> {
    const rt = this.rt;
    const counts = await this.onControlPlane(rt.region, (db) => cleanupSource(db, job.tenantId));
    await rt.storage.open();
    const wiped = rt.storage.wipeExcept(["move"]);
    rt.record = null;
    rt.pinned = false;
    rt.discardUsage();
    rt.keyUses.clear();
    return { ...counts, outboxRows: wiped.outbox + wiped.usageOutbox, sessionTokens: wiped.sessionTokens };
  }

  /** `commit`: the job is done; the new region's audit log gets its `tenant.move` row. */
  private async commit(job: MoveJob): Promise<Record<string, number>> {
    await this.onControlPlane(job.toRegion, (db) => auditMove(db, job));
    const done = await this.onControlPlane(this.rt.region, (db) => commitMoveSource(db, job.id));
    if (done) this.adopt(done);
    await this.rt.alarms.cancel();
    logEvent("info", "move_committed", { tenant: job.tenantId, from: job.fromRegion, to: job.toRegion });
    return { committed: done ? 1 : 0 };
  }
}

/** The tenant's record from its `moving` row (which a catalog read does not hand out), for the drain's fence. */
async function recordOf(db: Parameters<typeof loadTenantRecord>[0], rt: TenantRuntime, tenantId: string) {
  const [row] = await db.select().from(tenants).where(eq(tenants.id, tenantId)).limit(1);
  return row ? tenantRecordFromRow({ ...row, status: "active" }, [], rt.config) : null;
}

/** `409 tenant_moved`, naming where the tenant went. */
export function movedError(to: string): LessorError {
  return new LessorError("tenant_moved", {
    publicMessage: `The tenant moved to region ${to}; ask that region (?region=${to}).`,
    details: { region: to },
  });
}

/** `503 tenant_moving`: retry once the move has switched over. */
export function movingError(): LessorError {
  return new LessorError("tenant_moving", { retryAfterSeconds: 1 });
}
