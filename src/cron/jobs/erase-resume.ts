/**
 * Cron job: resume tenant erases whose next attempt is due (src/tenant-object/erase.ts). The job
 * only fans out: each erase runs in its tenant's object, which runs it single-flight from the
 * progress row, so a tick that finds an erase already running just joins it. Idempotent.
 */
import { loadConfig } from "../../config/index.ts";
import { withControlPlane } from "../../control-plane/index.ts";
import { dueErases } from "../../erase/store.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { tenantObject } from "../../placement/index.ts";
import type { CronJob } from "../fan-out.ts";

/** Erases one tick resumes at most (the rest are due again next minute). */
const maxPerTick = 20;

export const eraseResumeJob: CronJob = {
  name: "erase-resume",
  timeoutMs: 45_000,
  async run(env, tick) {
    const due = await withControlPlane(loadConfig(env), env, tick.region, (db) => dueErases(db, maxPerTick));
    let erased = 0;
    let running = 0;
    let failed = 0;
    await Promise.all(
      due.map(async ({ tenantId }) => {
        try {
          const answer = await tenantObject(env, tick.region, tenantId).resumeErase(tenantId);
          if (answer.ok && answer.status.state === "erased") erased++;
          else running++;
        } catch (error) {
          failed++;
          logEvent("warn", "erase_resume_failed", { tenant: tenantId, failure: describeFailure(error) });
        }
      }),
    );
    return {
      summary:
        due.length === 0
          ? "no erase due"
          : `${due.length} erase(s) resumed: ${erased} committed, ${running} still running`,
      level: failed > 0 ? "warn" : "info",
      fields: { due: due.length, erased, running, failed },
      changed: due.length > 0,
    };
  },
};
