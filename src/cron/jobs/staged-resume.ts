/**
 * Cron jobs that resume the tenant object's staged jobs whose next attempt is due (erase, move:
 * src/tenant-object/kernel/staged-job.ts). A resume job only fans out: each job runs in its tenant's
 * object, single-flight from its progress row, so a tick that finds a job running just joins it.
 * Idempotent. This is the cron's resume for every staged job; a new job adds one entry.
 */
import { loadConfig } from "../../config/index.ts";
import { type ControlPlane, withControlPlane } from "../../control-plane/index.ts";
import { dueErases } from "../../erase/store.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { dueMoves } from "../../move/store.ts";
import { tenantObject } from "../../placement/index.ts";
import type { CronJob } from "../fan-out.ts";

interface StagedResume {
  /** The cron job's name (`erase-resume`); its log events are `<noun>_resume_failed`. */
  name: string;
  noun: string;
  /** Jobs one tick resumes at most (the rest are due again next minute). */
  maxPerTick: number;
  /** The jobs of this region whose next attempt is due. */
  due(db: ControlPlane, limit: number): Promise<{ tenantId: string }[]>;
  /** Resumes one in its tenant's object; answers whether the job is over (committed, moved). */
  resume(env: Env, region: string, tenantId: string): Promise<boolean>;
  /** The word for a job that is over, in the summary. */
  over: string;
}

function stagedResumeJob(job: StagedResume): CronJob {
  return {
    name: job.name,
    timeoutMs: 45_000,
    async run(env, tick) {
      const due = await withControlPlane(loadConfig(env), env, tick.region, (db) =>
        job.due(db, job.maxPerTick),
      );
      let over = 0;
      let running = 0;
      let failed = 0;
      await Promise.all(
        due.map(async ({ tenantId }) => {
          try {
            if (await job.resume(env, tick.region, tenantId)) over++;
            else running++;
          } catch (error) {
            failed++;
            logEvent("warn", `${job.noun}_resume_failed`, {
              tenant: tenantId,
              failure: describeFailure(error),
            });
          }
        }),
      );
      return {
        summary:
          due.length === 0
            ? `no ${job.noun} due`
            : `${due.length} ${job.noun}(s) resumed: ${over} ${job.over}, ${running} still running`,
        level: failed > 0 ? "warn" : "info",
        fields: { due: due.length, [job.over]: over, running, failed },
        changed: due.length > 0,
      };
    },
  };
}

export const eraseResumeJob = stagedResumeJob({
  name: "erase-resume",
  noun: "erase",
  maxPerTick: 20,
  due: dueErases,
  async resume(env, region, tenantId) {
    const answer = await tenantObject(env, region, tenantId).resumeErase(tenantId);
    return answer.ok && answer.status.state === "erased";
  },
  over: "erased",
});

export const moveResumeJob = stagedResumeJob({
  name: "move-resume",
  noun: "move",
  maxPerTick: 10,
  due: dueMoves,
  async resume(env, region, tenantId) {
    const answer = await tenantObject(env, region, tenantId).resumeMove(tenantId);
    return answer.ok && answer.status.state === "moved";
  },
  over: "moved",
});
