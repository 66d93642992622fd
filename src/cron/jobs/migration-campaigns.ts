/** The campaign runner as a cron job: one bounded tick per cron tick (src/cron). */

import { runCampaignTick } from "../../campaigns/runner.ts";
import type { CronJob } from "../fan-out.ts";

export const campaignJob: CronJob = {
  name: "migration-campaigns",
  // The tick bounds itself at 30 s; a migration still running then is left to its TenantObject.
  timeoutMs: 45_000,
  async run(env, tick) {
    const report = await runCampaignTick(env, { region: tick.region });
    const sum = (pick: (c: (typeof report.campaigns)[number]) => number) =>
      report.campaigns.reduce((n, c) => n + pick(c), 0);
    const moved = report.campaigns.filter((c) => c.from !== c.to).map((c) => `${c.id} ${c.from}→${c.to}`);
    const blocked = report.campaigns.filter((c) => c.blocked !== null).length;
    const work = sum((c) => c.claimed + c.succeeded + c.failed + c.skipped + c.abandoned);
    return {
      summary:
        report.campaigns.length === 0
          ? "no active campaign"
          : `${report.campaigns.length} campaign(s): ${sum((c) => c.succeeded)} migrated, ${sum((c) => c.failed)} failed, ${sum((c) => c.skipped)} skipped${moved.length > 0 ? `; ${moved.join(", ")}` : ""}`,
      level: sum((c) => c.failed) > 0 || blocked > 0 ? "warn" : "info",
      // A campaign waiting on a running migration, with nothing claimed or finished, changed nothing.
      changed: work > 0 || moved.length > 0,
      fields: {
        campaigns: report.campaigns.length,
        claimed: sum((c) => c.claimed),
        migrated: sum((c) => c.succeeded),
        failed: sum((c) => c.failed),
        skipped: sum((c) => c.skipped),
        abandoned: sum((c) => c.abandoned),
        blocked,
      },
    };
  },
};
