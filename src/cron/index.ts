/**
 * The scheduled handler: one fan-out over the jobs below, per cron tick (wrangler.toml declares
 * `* * * * *`). Cron handlers only fan out; each job lives with its feature and is idempotent.
 * To add a job, append it to `cronJobs`.
 */
import { loadConfig } from "../config/index.ts";
import { type CronJob, type JobReport, runJobs } from "./fan-out.ts";
import { auditRetentionJob } from "./jobs/audit-retention.ts";
import { budgetReconcileJob } from "./jobs/budget-reconcile.ts";
import { credentialRotationJob } from "./jobs/credential-rotation.ts";
import { eraseResumeJob } from "./jobs/erase-resume.ts";
import { hostHygieneJob } from "./jobs/host-hygiene.ts";
import { campaignJob } from "./jobs/migration-campaigns.ts";
import { moveResumeJob } from "./jobs/move-resume.ts";
import { resealJob } from "./jobs/reseal.ts";
import { usageFoldJob } from "./jobs/usage-fold.ts";

export type { CronJob, CronTick, JobReport, JobResult } from "./fan-out.ts";

/** Every job, in no particular order: they run concurrently and independently. */
export const cronJobs: readonly CronJob[] = [
  usageFoldJob,
  budgetReconcileJob,
  campaignJob,
  credentialRotationJob,
  eraseResumeJob,
  moveResumeJob,
  auditRetentionJob,
  resealJob,
  hostHygieneJob,
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
  );
}
