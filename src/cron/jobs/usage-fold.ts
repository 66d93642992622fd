/** The fold as a cron job: one bounded run per tick (src/cron). */
import { loadConfig } from "../../config/index.ts";
import { foldOnce } from "../../folds/index.ts";
import { foldOptionsFromVars } from "../../folds/options.ts";
import { describeFoldOutcome } from "../../folds/outcome.ts";
import type { CronJob } from "../fan-out.ts";

export const usageFoldJob: CronJob = {
  name: "usage-fold",
  async run(env, tick) {
    const run = await foldOnce(
      loadConfig(env),
      env,
      tick.region,
      foldOptionsFromVars(env),
      tick.scheduledTime,
    );
    const { outcome } = run;
    const folded = outcome.kind === "folded" ? outcome : null;
    const changedRows = folded
      ? folded.foldedRows +
        folded.replayedRows +
        folded.trimmedGenerations +
        folded.trimmedEvents +
        folded.trimmedOutcomes
      : 0;
    return {
      summary: describeFoldOutcome(outcome),
      // A pin is worth an operator's look; one skipped tick is not an error.
      level: outcome.kind === "skipped_pinned" || run.unobservableBackends > 0 ? "warn" : "info",
      // Nothing to fold, or another fold holding the lock, is nothing to report; a failure is.
      changed: changedRows > 0 || outcome.kind === "failed",
      fields: {
        outcome: outcome.kind,
        outcomeId: run.id,
        foldDurationMs: outcome.durationMs,
        ...(outcome.kind === "folded"
          ? {
              foldedRows: outcome.foldedRows,
              replayedRows: outcome.replayedRows,
              backlogRemains: outcome.backlogRemains,
              trimmedGenerations: outcome.trimmedGenerations,
              trimmedEvents: outcome.trimmedEvents,
            }
          : {}),
        ...(outcome.kind === "skipped_pinned"
          ? { pinKind: outcome.pin.kind, pinSeconds: outcome.pin.seconds }
          : {}),
        ...(run.unobservableBackends > 0 ? { unobservableBackends: run.unobservableBackends } : {}),
      },
    };
  },
};
