/**
 * The cron fan-out: runs a list of named, independent jobs for one tick. Each job is guarded (a
 * job that throws or hangs is reported and logged; the others run on regardless). A run logs a
 * `cron_job` line when it changed something, failed, timed out or warns; a run that found nothing
 * due and changed nothing (`changed: false`) is reported to the caller and logs nothing, so the
 * logs say what the cron did, not that it ran (nine jobs a minute per region said "nothing due").
 * Jobs must be idempotent: a tick can be delivered twice, and a run can be killed half way.
 */
import { isSweepTick, tickIndexOf } from "../core/sweep.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";

/** The tick a job runs for. */
export interface CronTick {
  /** The cron expression that fired (as in wrangler.toml). */
  cron: string;
  /** The tick's scheduled time, epoch milliseconds: the same on a redelivery of the same tick. */
  scheduledTime: number;
  /**
   * The region this run is for (docs/adr/023-regions.md): every job runs once per region, reads and
   * writes only that region's control plane and hosts, and fails or times out on its own.
   */
  region: string;
}

/** What a job reports when it finishes. */
export interface JobResult {
  /** One line for operators, e.g. "folded 120 rows". */
  summary: string;
  /** Extra structured log fields (counts, kinds): what metrics are built from. Never secrets. */
  fields?: Record<string, unknown>;
  /** Log level of a successful run (default info). */
  level?: "info" | "warn";
  /**
   * `false` when the run found nothing due and changed nothing: it writes no log line (a `warn`
   * run still does). Absent counts as changed, so a job that does not say is always logged.
   */
  changed?: boolean;
}

export interface CronJob {
  /** Stable name, used in logs. */
  readonly name: string;
  /** Cron expressions this job runs on; every tick when absent. */
  readonly crons?: readonly string[];
  /**
   * A run still going after this long is reported as timed out and no longer waited for; the
   * runtime may then end it at any point, which an idempotent job survives.
   */
  readonly timeoutMs?: number;
  /**
   * Runs once per fleet sweep (`LESSOR_SWEEP_MINUTES`), on the ticks whose minute is a multiple of
   * it, instead of every tick: work that reads the control plane and is never urgent, so an idle
   * control plane is not woken every minute for it (docs/adr/028-a-fleet-that-sleeps.md).
   */
  readonly slow?: boolean;
  run(env: Env, tick: CronTick): Promise<JobResult>;
}

export interface JobReport {
  job: string;
  /** The region the run was for. */
  region: string;
  status: "ok" | "failed" | "timed_out";
  summary: string;
  durationMs: number;
}

/** Comfortably inside a one-minute cron, and above every job's own bound. */
export const defaultJobTimeoutMs = 50_000;

/** Whether `job` runs on `tick` (`sweepTicks`: the fleet sweep's length in ticks, for `slow` jobs). */
export function isDue(job: CronJob, tick: CronTick, sweepTicks = 1): boolean {
  if (job.slow && !isSweepTick(tickIndexOf(tick.scheduledTime), sweepTicks)) return false;
  return job.crons === undefined || job.crons.includes(tick.cron);
}

/** Runs one job, never throwing: every way it can end becomes a report and a log line. */
export async function runGuarded(job: CronJob, env: Env, tick: CronTick): Promise<JobReport> {
  const started = Date.now();
  const base = {
    job: job.name,
    region: tick.region,
    cron: tick.cron,
    scheduledAt: new Date(tick.scheduledTime).toISOString(),
  };
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeoutMs = job.timeoutMs ?? defaultJobTimeoutMs;
  const timedOut = new Promise<"timed_out">((resolve) => {
    timer = setTimeout(() => resolve("timed_out"), timeoutMs);
  });
  try {
    // A job that throws synchronously is still this job's failure, not the fan-out's.
    const result = await Promise.race([Promise.resolve().then(() => job.run(env, tick)), timedOut]);
    const durationMs = Date.now() - started;
    if (result === "timed_out") {
      const summary = `still running after ${timeoutMs} ms`;
      logEvent("error", "cron_job", { ...base, status: "timed_out", summary, durationMs });
      return { job: job.name, region: tick.region, status: "timed_out", summary, durationMs };
    }
    const level = result.level ?? "info";
    if (result.changed !== false || level !== "info") {
      logEvent(level, "cron_job", {
        ...base,
        status: "ok",
        summary: result.summary,
        durationMs,
        ...result.fields,
      });
    }
    return { job: job.name, region: tick.region, status: "ok", summary: result.summary, durationMs };
  } catch (error) {
    const durationMs = Date.now() - started;
    const failure = describeFailure(error);
    logEvent("error", "cron_job", { ...base, status: "failed", failure, durationMs });
    return { job: job.name, region: tick.region, status: "failed", summary: failure, durationMs };
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Starts every job due on `tick` at once, once per region in `regions`, hands each run to
 * `waitUntil` (so the Worker stays alive until all of them settle), and resolves with their
 * reports. Never rejects. A region whose control plane is down fails its own runs only.
 */
export function runJobs(
  jobs: readonly CronJob[],
  env: Env,
  tick: Omit<CronTick, "region">,
  regions: readonly string[],
  waitUntil: (promise: Promise<unknown>) => void,
  sweepTicks = 1,
): Promise<JobReport[]> {
  const runs = regions.flatMap((region) =>
    jobs
      .filter((job) => isDue(job, { ...tick, region }, sweepTicks))
      .map((job) => runGuarded(job, env, { ...tick, region })),
  );
  for (const run of runs) waitUntil(run);
  return Promise.all(runs);
}
