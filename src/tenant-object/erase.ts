/**
 * Tenant erase, run by the tenant's own object (docs/adr/011-erase-stage-order.md).
 *
 * `request` closes the gate before it answers: in this object at once (no await between the checks
 * and the close, so no lease or migration slips in), in the catalog (the tenant row is `erasing`,
 * the job's first progress row written, in one transaction), and in the host's budget (no pool of
 * the tenant is admitted). Then the stages run, each idempotent, each recorded in the job's
 * progress row (control plane) before the next one starts:
 *
 *     keys → leases → pool → campaigns → database → credentials → usage → events → object → commit
 *
 * The runner is single-flight in the object. It is started by the request (through the alarm), and
 * resumed by the alarm with backoff after a failure, and by the cron trigger (`erase-resume`) when
 * the object lost its memory (killed, or wiped by the `object` stage itself). A stage that fails
 * records why (`lastError`) and when it may be tried again; one the runner cannot even record (the
 * control plane is down) is kept here and recorded with the next attempt.
 */
import { withControlPlane } from "../control-plane/index.ts";
import {
  addCounts,
  type EraseStage,
  eraseRequestDecision,
  eraseRetryDelay,
  stageAfter,
} from "../core/erase.ts";
import { tablesErasedAt } from "../core/tenant-data.ts";
import {
  type DatabaseRemoval,
  localPostgresProvider,
  type TenantDatabaseProvider,
} from "../erase/database-provider.ts";
import {
  advanceErase,
  commitErase,
  type EraseJob,
  eraseStageRows,
  eraseStatusOf,
  loadEraseOf,
  openErase,
  recordEraseFailure,
} from "../erase/store.ts";
import { type EraseStep, eraseHooksForTests } from "../erase/test-hooks.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import type { EraseAnswer, EraseStatus } from "../rpc/tenant.ts";
import { asLessorError } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { type StagedJob, StagedJobRunner, type StageResult } from "./kernel/staged-job.ts";
import type { TenantPool } from "./pool/index.ts";
import type { EraseGate, TenantRuntime } from "./runtime.ts";

/** Claims older than this are dead, as the campaign runner presumes (core/campaign.ts). */
const campaignClaimTimeoutMs = 10 * 60_000;
/** Stages one run takes at most before it yields to the next alarm (a re-check loop cannot spin). */
const stagesPerRun = 40;
/** After forcing, how long the leases get to let go of their connections. */
const forcedEndWaitMs = 10_000;

export class TenantErase {
  private opening: Promise<unknown> | null = null;
  private readonly runner: StagedJobRunner<EraseJob, EraseStage>;
  private readonly provider: TenantDatabaseProvider;

  constructor(
    private readonly rt: TenantRuntime,
    private readonly auth: TenantAuth,
    private readonly pool: TenantPool,
  ) {
    this.provider = localPostgresProvider(rt.env, rt.config);
    this.runner = new StagedJobRunner(rt, this.stagedJob());
  }

  // ── The gate ───────────────────────────────────────────────────────────────────────────────────

  /**
   * Starts the erase, or answers the one already running (concurrent requests share the gate).
   * Answers only once the gate is closed.
   */
  async request(tenantId: string, actor: string, force: boolean): Promise<EraseAnswer> {
    try {
      // Requests one after the other: the second finds the gate the first closed.
      for (let waited = 0; this.opening && waited < 10; waited++) await this.opening.catch(() => undefined);
      const opened = this.open(tenantId, actor, force);
      this.opening = opened;
      try {
        return { ok: true, status: await opened };
      } finally {
        if (this.opening === opened) this.opening = null;
      }
    } catch (error) {
      return { ok: false, error: asLessorError(tenantId, error).toWire() };
    }
  }

  private async open(tenantId: string, actor: string, force: boolean): Promise<EraseStatus> {
    const rt = this.rt;
    if (rt.erase?.tenantId === tenantId) {
      if (rt.erase.state === "erased" && !rt.record) throw erasedError(rt.erase.erasedAt);
      if (rt.erase.state === "erasing") return this.statusOrGate(tenantId);
    }
    const record = await this.auth.resolve(tenantId);
    if (!record) {
      // Unknown; or erased; or erasing while this object has forgotten it (restarted after its
      // storage was wiped): the control plane says which.
      const job = await withControlPlane(rt.config, rt.env, rt.region, (db) => loadEraseOf(db, tenantId));
      if (!job) throw new LessorError("tenant_not_found");
      if (job.state === "erased") throw erasedError(job.erasedAt?.getTime() ?? null);
      this.adopt(job);
      await this.kick();
      return eraseStatusOf(job);
    }
    const decision = eraseRequestDecision({
      pinned: rt.pinned,
      force,
      migrating: rt.lifecycle.migrating,
      claimedByCampaign: false,
    });
    if (decision.kind === "refuse") throw new LessorError(decision.code);
    // The gate closes here, before any await: a request, lease or migration that comes in while
    // the catalog is written is refused already.
    rt.erase = {
      tenantId,
      ordinal: 0,
      state: "erasing",
      keyIds: record.keys.map((key) => key.keyId),
      startedAt: Date.now(),
      erasedAt: null,
    };
    let outcome: Awaited<ReturnType<typeof openErase>>;
    try {
      outcome = await withControlPlane(rt.config, rt.env, rt.region, (db) =>
        openErase(db, { tenantId, actor, forced: force, claimTimeoutMs: campaignClaimTimeoutMs }),
      );
    } catch (error) {
      rt.erase = null;
      throw error;
    }
    if (outcome.kind === "refused" || outcome.kind === "not_found") {
      rt.erase = null;
      throw new LessorError(outcome.kind === "refused" ? outcome.code : "tenant_not_found");
    }
    this.adopt(outcome.job);
    await rt
      .budget(outcome.job.host)
      .closeTenant(tenantId)
      .catch((error: unknown) =>
        // The `pool` stage closes it again; until then this object's gate refuses every start.
        logEvent("warn", "erase_budget_close_failed", { tenant: tenantId, failure: describeFailure(error) }),
      );
    if (outcome.kind === "started") {
      logEvent("info", "erase_started", {
        tenant: tenantId,
        ordinal: outcome.job.ordinal,
        actor,
        forced: force,
      });
    }
    await this.step(tenantId, { point: "gate", stage: null });
    await this.kick();
    return eraseStatusOf(outcome.job);
  }

  /** The job's status from the control plane (what a repeated request answers). */
  private async statusOrGate(tenantId: string): Promise<EraseStatus> {
    const job = await withControlPlane(this.rt.config, this.rt.env, this.rt.region, (db) =>
      loadEraseOf(db, tenantId),
    );
    if (!job) throw new LessorError("tenant_not_found");
    if (job.state === "erased") throw erasedError(job.erasedAt?.getTime() ?? null);
    await this.kick();
    return eraseStatusOf(job);
  }

  /** Takes the job's gate into this object (memory, and storage while it still exists). */
  private adopt(job: EraseJob): void {
    const gate: EraseGate = {
      tenantId: job.tenantId,
      ordinal: job.ordinal,
      state: "erasing",
      keyIds: job.keyIds,
      startedAt: job.startedAt.getTime(),
      erasedAt: null,
    };
    this.rt.erase = gate;
    if (this.rt.storage.isOpen) this.rt.storage.write("erase", gate);
  }

  /** Runs the stages soon, from the alarm (so the request is answered first). */
  private async kick(): Promise<void> {
    if (this.rt.erasing) await this.rt.alarms.rearm(this.runner.retryAt);
  }

  // ── The runner ─────────────────────────────────────────────────────────────────────────────────

  /**
   * Runs the job from its progress row until it commits, fails (then the alarm retries, with
   * backoff) or yields (kernel/staged-job.ts). A second caller joins the run in progress. Answers
   * the job's status afterwards.
   */
  async resume(tenantId: string): Promise<EraseAnswer> {
    try {
      await this.runner.resume(tenantId);
      return { ok: true, status: await this.currentStatus(tenantId) };
    } catch (error) {
      return { ok: false, error: asLessorError(tenantId, error).toWire() };
    }
  }

  /** The alarm's part: resume a running erase whose retry is due, or re-arm for when it is. */
  async tick(): Promise<void> {
    const gate = this.rt.erase;
    if (gate?.state === "erasing") await this.runner.tick(gate.tenantId);
  }

  private async currentStatus(tenantId: string): Promise<EraseStatus> {
    const gate = this.rt.erase;
    if (gate?.state === "erased")
      return { state: "erased", erasedAt: new Date(gate.erasedAt ?? 0).toISOString() };
    const job = await withControlPlane(this.rt.config, this.rt.env, this.rt.region, (db) =>
      loadEraseOf(db, tenantId),
    );
    if (!job) throw new LessorError("erase_not_found");
    return eraseStatusOf(job);
  }

  /** The erase as a staged job: its row, its stages, how it moves on. */
  private stagedJob(): StagedJob<EraseJob, EraseStage> {
    const rt = this.rt;
    const onControlPlane = <T>(work: Parameters<typeof withControlPlane<T>>[3]) =>
      withControlPlane(rt.config, rt.env, rt.region, work);
    return {
      name: "erase",
      stagesPerRun,
      retryDelay: eraseRetryDelay,
      load: (tenantId) => onControlPlane((db) => loadEraseOf(db, tenantId)),
      next: async (_tenantId, job) => {
        if (!job) return null;
        if (job.state === "erased") {
          await this.finished(job.keyIds, job.erasedAt?.getTime() ?? Date.now());
          return null;
        }
        this.adopt(job);
        return job.stage;
      },
      run: (job, stage) => (stage === "commit" ? this.commit(job) : this.runStage(job, stage)),
      advance: async (job, stage, counts) => {
        const next = stageAfter(stage) ?? "commit";
        // A stage the re-check sent the job back to adds what it removed this time.
        const total = addCounts(job.counts[stage] ?? {}, counts);
        await onControlPlane((db) => advanceErase(db, job.ordinal, stage, next, total));
        return true;
      },
      idOf: (job) => job.ordinal,
      heldId: () => rt.erase?.ordinal ?? null,
      recordFailure: (id, failures, message, delayMs) =>
        onControlPlane((db) => recordEraseFailure(db, id, failures, message, delayMs)),
      fields: () => ({}),
      step: (tenantId, step) => this.step(tenantId, step),
    };
  }

  /**
   * `commit`: the control plane re-checks that nothing of the tenant is left and marks it erased.
   * A re-check that finds something sends the job back to the stage that removes it.
   */
  private async commit(job: EraseJob): Promise<StageResult> {
    const tenantId = job.tenantId;
    const outcome = await withControlPlane(this.rt.config, this.rt.env, this.rt.region, (db) =>
      commitErase(db, job),
    );
    if (outcome.kind === "recheck_failed") {
      // The stage the re-check named removes what was written meanwhile; run on from there.
      logEvent("warn", "erase_recheck_failed", { tenant: tenantId, summary: outcome.verdict.summary });
      return { kind: "again" };
    }
    if (outcome.kind === "moved") return { kind: "again" };
    return {
      kind: "finished",
      settle: async () => {
        await this.finished(job.keyIds, outcome.erasedAt.getTime());
        logEvent("info", "erase_committed", { tenant: tenantId, ordinal: job.ordinal });
      },
    };
  }

  /** The commit happened: the object answers `410` for the erased keys, and holds nothing else. */
  private async finished(keyIds: string[], erasedAt: number): Promise<void> {
    const gate = this.rt.erase;
    this.rt.erase = {
      tenantId: gate?.tenantId ?? "",
      ordinal: gate?.ordinal ?? 0,
      state: "erased",
      keyIds,
      startedAt: gate?.startedAt ?? erasedAt,
      erasedAt,
    };
    this.auth.rememberErased(keyIds, erasedAt);
    this.runner.reset();
    await this.rt.alarms.cancel();
  }

  private async step(tenantId: string, step: EraseStep): Promise<void> {
    const hook = eraseHooksForTests.onStep;
    if (!hook) return;
    await hook({ tenantId, step, abortObject: (reason) => this.rt.ctx.abort(reason) });
  }

  // ── The stages ─────────────────────────────────────────────────────────────────────────────────

  private async runStage(job: EraseJob, stage: Exclude<EraseStage, "commit">): Promise<StageResult> {
    return { kind: "done", counts: await this.stageWork(job, stage) };
  }

  /**
   * A stage's work in the object (and on the database host), then the control-plane rows the
   * declaration says it deletes (core/tenant-data.ts: no table is erased by hand here).
   */
  private async stageWork(
    job: EraseJob,
    stage: Exclude<EraseStage, "commit">,
  ): Promise<Record<string, number>> {
    const inObject = await this.objectWork(job, stage);
    if (tablesErasedAt(stage).length === 0) return inObject;
    const rows = await this.onControlPlane((db) => eraseStageRows(db, job, stage));
    return { ...inObject, ...rows };
  }

  private objectWork(job: EraseJob, stage: Exclude<EraseStage, "commit">): Promise<Record<string, number>> {
    switch (stage) {
      case "keys":
        return this.keys();
      case "leases":
        return this.leases();
      case "pool":
        return this.stopPool(job);
      case "database":
        return this.database(job);
      case "usage":
        this.rt.discardUsage();
        return Promise.resolve({});
      case "campaigns":
      case "credentials":
      case "events":
        return Promise.resolve({});
      case "object":
        return this.wipeObject(job);
    }
  }

  private onControlPlane<T extends Record<string, number>>(
    work: Parameters<typeof withControlPlane<T>>[3],
  ): Promise<T> {
    return withControlPlane(this.rt.config, this.rt.env, this.rt.region, work);
  }

  /**
   * `keys`: the object keeps only the keys that opened a live session lease, so their owners can
   * finish (the next stage ends those leases); every key's hash then goes from the catalog (the
   * declared rows), so no request can authenticate again anywhere.
   */
  private async keys(): Promise<Record<string, number>> {
    const record = this.rt.record;
    if (record) {
      const held = this.rt.holders.keyIds();
      this.rt.record = { ...record, keys: record.keys.filter((key) => held.has(key.keyId)) };
      if (this.rt.storage.isOpen) this.rt.storage.write("record", this.rt.record);
    }
    return {};
  }

  /**
   * `leases`: waits up to `LESSOR_ERASE_LEASE_WAIT_MS` for running statements and session leases to
   * end; then ends them (session leases' connections closed, their transactions rolled back; a
   * statement still running has its backend terminated) and records how many.
   */
  private async leases(): Promise<Record<string, number>> {
    const rt = this.rt;
    const started = Date.now();
    const held = this.pool.leases;
    let ended = await this.pool.waitForNoLeases(rt.config.eraseLeaseWaitMs);
    let forcedSessions = 0;
    let backendsEnded = 0;
    if (!ended) {
      // Every holder the erase ends, of every kind (kernel/holders.ts); flights are waited for.
      forcedSessions = rt.holders.apply("erase").ended;
      ended = await this.pool.waitForNoLeases(1_000);
      if (!ended && rt.record) {
        backendsEnded = await this.pool.credentials.fence(rt.record, "erase");
        ended = await this.pool.waitForNoLeases(forcedEndWaitMs);
      }
      if (!ended) throw new Error(`${this.pool.leases} lease(s) would not end`);
      logEvent("warn", "erase_leases_forced", { tenant: rt.tenantId, forcedSessions, backendsEnded });
    }
    // Holders between transactions hold no lease, but they end with the tenant too.
    rt.holders.apply("erase");
    return { leasesHeld: held, waitedMs: Date.now() - started, forcedSessions, backendsEnded };
  }

  /**
   * `pool`: stops the pool (every connection of the generation closes, then its budget goes), and
   * leaves nothing of the tenant in the budget's ledger, whatever generation a restart left there.
   */
  private async stopPool(job: EraseJob): Promise<Record<string, number>> {
    const rt = this.rt;
    await this.pool.settleStart();
    const generation = rt.lifecycle.generation;
    const wasOpen = this.pool.isOpen;
    await this.pool.stop("erase");
    const budget = rt.budget(job.host);
    await budget.closeTenant(job.tenantId);
    const released = await budget.releaseTenant(job.host, job.tenantId);
    return { generation, poolsStopped: wasOpen ? 1 : 0, allocationsReleased: released };
  }

  /**
   * `database`: the provider removes the database and the role (idempotent). A customer's database
   * is detached instead: Lessor never connects there to drop anything; where it is goes from the
   * catalog (the declared row, audited as a detach), and its credential at the next stage.
   */
  private async database(job: EraseJob): Promise<Record<string, number>> {
    if (job.detached || job.databaseName === null || job.roleName === null) return { databases: 0, roles: 0 };
    const removed: DatabaseRemoval = await this.provider.remove({
      tenantId: job.tenantId,
      host: job.host,
      databaseName: job.databaseName,
      roleName: job.roleName,
    });
    return { ...removed };
  }

  /**
   * `object`: the object's own storage (record, lifecycle, outboxes, lease tokens, alarm) is
   * deleted, and its memory of the tenant with it; the budget forgets the tenant was closed. Only
   * the gate stays, in memory, until the commit.
   */
  private async wipeObject(job: EraseJob): Promise<Record<string, number>> {
    const rt = this.rt;
    const rows = rt.storage.rowCounts();
    await rt.alarms.cancel();
    await rt.wipe();
    await rt.budget(job.host).reopenTenant(job.tenantId);
    return { outboxRows: rows.outbox + rows.usageOutbox, sessionTokens: rows.sessionTokens };
  }
}

function erasedError(erasedAt: number | null): LessorError {
  return new LessorError("tenant_erased", {
    details: erasedAt === null ? {} : { erasedAt: new Date(erasedAt).toISOString() },
  });
}
