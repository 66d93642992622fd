/**
 * The one runner of the tenant object's staged jobs: erase and move (docs/adr/026-tenant-object-kernel.md).
 *
 * A staged job is a list of stages, each idempotent, each recorded in the job's progress row in the
 * control plane before the next one starts. What every such job needs, and none may get wrong on
 * its own, is here once:
 * - single flight in the object (a second caller joins the run in progress);
 * - a bound on the stages one run takes, after which it yields to the next alarm (a re-check that
 *   keeps sending the job back cannot spin);
 * - backoff after a failure, kept across runs of this instance, with the alarm re-armed for it;
 * - a failure the control plane could not hear of (it was down) is kept here and recorded with the
 *   next attempt that reaches it;
 * - the test hooks at each step (`started`, `worked`, `recorded`, `failed`), where a test's
 *   `InterruptedForTests` stops the run as if the isolate had died (nothing recorded or re-armed).
 *
 * A job says what is its own (`StagedJob`): how its row is read, which stage it runs next, what a
 * stage does, how the row moves on. A third job is a new `StagedJob`, not a copy of a runner; the
 * cron's resume job for it is one line (src/cron/jobs/staged-resume.ts).
 */
import { InterruptedForTests } from "../../erase/test-hooks.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import type { TenantRuntime } from "../runtime.ts";

/** Where the runner is, as the job's test hook sees it. */
export type StagePoint<S extends string> =
  | { point: "started" | "worked" | "recorded"; stage: S }
  | { point: "failed"; stage: S | null; message: string };

/** What one stage's run came to. */
export type StageResult =
  /** Its work is done: the runner records `counts` and the row moves to the stage after. */
  | { kind: "done"; counts: Record<string, number> }
  /** The row changed under the stage (a re-check sent the job back): read it again and go on. */
  | { kind: "again" }
  /** The stage finished the job (its commit is recorded); `settle` then runs between the hooks. */
  | { kind: "finished"; settle: () => Promise<void> };

export interface StagedJob<J, S extends string> {
  /** The job's name in log events: `<name>_stage_done`, `<name>_stage_failed`. */
  readonly name: string;
  /** Stages one run takes at most before it yields to the next alarm. */
  readonly stagesPerRun: number;
  /** Milliseconds to wait after the `failures`-th consecutive failure (`random` in [0, 1), jitter). */
  retryDelay(failures: number, random: number): number;
  /** The job's progress row, or null if there is none. */
  load(tenantId: string): Promise<J | null>;
  /**
   * The stage the loaded job runs next, having taken its gate into the object; null when there is
   * nothing to run (the job finished, or has no row: the job tidies its own gate up).
   */
  next(tenantId: string, job: J | null): Promise<S | null>;
  /** Runs one stage of the job. */
  run(job: J, stage: S): Promise<StageResult>;
  /** Records `stage` done with its counts; answers false when it was the last stage. */
  advance(job: J, stage: S, counts: Record<string, number>): Promise<boolean>;
  /** The job's id in its table. */
  idOf(job: J): number;
  /** The id of the job whose gate this object holds (a failure before any row was read), or null. */
  heldId(): number | null;
  /** Records `failures` failed attempts on job `id`, the last with `message`, the next in `delayMs`. */
  recordFailure(id: number, failures: number, message: string, delayMs: number): Promise<void>;
  /** Fields every log event of the job carries besides the tenant (the move's target region). */
  fields(job: J): Record<string, unknown>;
  /** The test hook (tests set it; in production it costs one property read). */
  step(tenantId: string, step: StagePoint<S>): Promise<void>;
}

export class StagedJobRunner<J, S extends string> {
  private running: Promise<void> | null = null;
  /** Consecutive failed attempts in this instance (the backoff). */
  private failures = 0;
  /** Failed attempts the control plane has not heard of yet (it could not be reached). */
  private unrecorded: { failures: number; message: string } | null = null;
  /** Epoch ms before which the runner does not try again after a failure. */
  private retryAtMs = 0;

  constructor(
    private readonly rt: TenantRuntime,
    private readonly job: StagedJob<J, S>,
  ) {}

  /** When the job may run next: now, or after its backoff. */
  get retryAt(): number {
    return Math.max(Date.now(), this.retryAtMs);
  }

  /** Runs the job from its progress row until it finishes, fails or yields; joins a run in progress. */
  resume(tenantId: string): Promise<void> {
    this.running ??= this.runFrom(tenantId).finally(() => {
      this.running = null;
    });
    return this.running;
  }

  /** The alarm's part: resume the job if its retry is due, or re-arm the alarm for when it is. */
  async tick(tenantId: string): Promise<void> {
    if (Date.now() < this.retryAtMs) {
      await this.rt.alarms.rearm(this.retryAtMs);
      return;
    }
    await this.resume(tenantId);
  }

  /** The job is over (finished here or elsewhere): no backoff is left. */
  reset(): void {
    this.failures = 0;
    this.retryAtMs = 0;
    this.unrecorded = null;
  }

  private async runFrom(tenantId: string): Promise<void> {
    const job = this.job;
    for (let taken = 0; taken < job.stagesPerRun; taken++) {
      let current: J | null;
      let stage: S | null;
      try {
        current = await job.load(tenantId);
        stage = await job.next(tenantId, current);
        if (stage !== null && current !== null && this.unrecorded) {
          // A failure the control plane could not hear of when it happened is recorded now.
          await job.recordFailure(job.idOf(current), this.unrecorded.failures, this.unrecorded.message, 0);
          this.unrecorded = null;
        }
      } catch (error) {
        await this.failed(tenantId, null, null, error);
        return;
      }
      if (stage === null || current === null) {
        this.reset();
        return;
      }
      const loaded: J = current;
      try {
        await job.step(tenantId, { point: "started", stage });
        const result = await job.run(loaded, stage);
        if (result.kind === "again") continue;
        await job.step(tenantId, { point: "worked", stage });
        if (result.kind === "finished") {
          await result.settle();
          this.reset();
          await job.step(tenantId, { point: "recorded", stage });
          return;
        }
        const more = await job.advance(loaded, stage, result.counts);
        this.failures = 0;
        this.retryAtMs = 0;
        logEvent("info", `${job.name}_stage_done`, {
          tenant: tenantId,
          stage,
          ...job.fields(loaded),
          ...result.counts,
        });
        await job.step(tenantId, { point: "recorded", stage });
        if (!more) return;
      } catch (error) {
        if (error instanceof InterruptedForTests) return;
        await this.failed(tenantId, stage, job.idOf(loaded), error);
        return;
      }
    }
    // A run that keeps being sent back yields; the alarm takes it up again.
    await this.rt.alarms.rearm(Date.now() + 1_000);
  }

  /** Records a failed attempt (here, and in the control plane if it answers) and arms the retry. */
  private async failed(tenantId: string, stage: S | null, id: number | null, error: unknown): Promise<void> {
    this.failures++;
    const delay = this.job.retryDelay(this.failures, Math.random());
    this.retryAtMs = Date.now() + delay;
    const message = `${stage ?? "load"}: ${describeFailure(error)}`;
    logEvent("warn", `${this.job.name}_stage_failed`, {
      tenant: tenantId,
      stage,
      attempt: this.failures,
      failure: message,
    });
    await this.job.step(tenantId, { point: "failed", stage, message }).catch(() => undefined);
    const pending = { failures: (this.unrecorded?.failures ?? 0) + 1, message };
    const target = id ?? this.job.heldId();
    try {
      if (target === null || target === 0) throw new Error("no job to record the failure on");
      await this.job.recordFailure(target, pending.failures, message, delay);
      this.unrecorded = null;
    } catch {
      this.unrecorded = pending;
    }
    await this.rt.alarms.rearm(this.retryAtMs);
  }
}
