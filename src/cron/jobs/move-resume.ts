/**
 * Cron job: resume the moves out of this tick's region whose next attempt is due
 * (src/tenant-object/move.ts). It only fans out: each move runs in the tenant's object of the region
 * it leaves, single-flight from its progress row, so a tick that finds a move running joins it.
 * Idempotent.
 */
import { loadConfig } from "../../config/index.ts";
import { withControlPlane } from "../../control-plane/index.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { dueMoves } from "../../move/store.ts";
import { tenantObject } from "../../placement/index.ts";
import type { CronJob } from "../fan-out.ts";

/** Moves one tick resumes at most (the rest are due again next minute). */
const maxPerTick = 10;

export const moveResumeJob: CronJob = {
  name: "move-resume",
  timeoutMs: 45_000,
  async run(env, tick) {
    const due = await withControlPlane(loadConfig(env), env, tick.region, (db) => dueMoves(db, maxPerTick));
    let moved = 0;
    let running = 0;
    let failed = 0;
    await Promise.all(
      due.map(async ({ tenantId }) => {
        try {
          const answer = await tenantObject(env, tick.region, tenantId).resumeMove(tenantId);
          if (answer.ok && answer.status.state === "moved") moved++;
          else running++;
        } catch (error) {
          failed++;
          logEvent("warn", "move_resume_failed", { tenant: tenantId, failure: describeFailure(error) });
        }
      }),
    );
    return {
      summary:
        due.length === 0
          ? "no move due"
          : `${due.length} move(s) resumed: ${moved} done, ${running} still running`,
      level: failed > 0 ? "warn" : "info",
      fields: { due: due.length, moved, running, failed },
      changed: due.length > 0,
    };
  },
};
