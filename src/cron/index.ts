/**
 * The scheduled handler: one fan-out over the jobs below, per cron tick (wrangler.toml declares
 * `* * * * *`). Cron handlers only fan out; each job lives with its feature and is idempotent.
 * To add a job, append it to `cronJobs`.
 *
 * Per-host work is not here (docs/adr/028-a-fleet-that-sleeps.md): each host's BudgetObject runs
 * its ledger reconcile, orphan reaper and hygiene from its own alarm (src/budget-object/sweep.ts),
 * and `host-sweep` only makes sure every object has an alarm, a bounded slice of hosts a tick. Jobs
 * marked `slow` run once per `LESSOR_SWEEP_MINUTES`, not every minute.
 */
import { loadConfig } from "../config/index.ts";
import { type CronJob, type JobReport, runJobs } from "./fan-out.ts";
import { auditRetentionJob } from "./jobs/audit-retention.ts";
import { credentialRotationJob } from "./jobs/credential-rotation.ts";
import { hostSweepJob } from "./jobs/host-sweep.ts";
import { campaignJob } from "./jobs/migration-campaigns.ts";
import { resealJob } from "./jobs/reseal.ts";
import { eraseResumeJob, moveResumeJob } from "./jobs/staged-resume.ts";
import { usageFoldJob } from "./jobs/usage-fold.ts";

export type { CronJob, CronTick, JobReport, JobResult } from "./fan-out.ts";

/** Every job, in no particular order: they run concurrently and independently. */
export const cronJobs: readonly CronJob[] = [
  usageFoldJob,
  hostSweepJob,
  campaignJob,
  credentialRotationJob,
  eraseResumeJob,
  moveResumeJob,
  auditRetentionJob,
  resealJob,
];

/**
 * Runs the tick's jobs, once per region (docs/adr/023-regions.md), under `ctx.waitUntil`; the
 * promise (for tests) resolves with their reports.
 */
export function runScheduled(
  controller: ScheduledController,
  env: Env,
  ctx: ExecutionContext,
  jobs: readonly CronJob[] = cronJobs,
): Promise<JobReport[]> {
  return runJobs(
    jobs,
    env,
    { cron: controller.cron, scheduledTime: controller.scheduledTime },
    [...loadConfig(env).regions.keys()],
    (promise) => ctx.waitUntil(promise),
    loadConfig(env).sweepMinutes,
  );
}
