/**
 * Cron job: one bounded hygiene pass per host (src/tenant-db/hygiene.ts): tenant databases a tenant
 * owned move to the admin, prepared transactions a tenant left are rolled back. Its admin connection
 * also refreshes the host's capability report when it is stale, so a deploy learns within a minute
 * whether each host can run Lessor. Idempotent; a pass killed half way is finished by the next.
 */
import { loadConfig } from "../../config/index.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { hostHygiene } from "../../tenant-db/hygiene.ts";
import type { CronJob } from "../fan-out.ts";

export const hostHygieneJob: CronJob = {
  name: "host-hygiene",
  timeoutMs: 45_000,
  async run(env, tick) {
    const config = loadConfig(env);
    // The region's hosts: each region looks after its own.
    const hosts = [...config.hosts.values()].filter((host) => host.region === tick.region);
    const results = await Promise.all(
      hosts.map((host) =>
        hostHygiene(env, config, host).catch((error: unknown) => {
          // A host that cannot be reached now is looked at next time.
          logEvent("warn", "host_hygiene_failed", { host: host.name, failure: describeFailure(error) });
          return { moved: 0, preparedRolledBack: 0, failed: 1 };
        }),
      ),
    );
    const moved = results.reduce((n, r) => n + r.moved, 0);
    const preparedRolledBack = results.reduce((n, r) => n + r.preparedRolledBack, 0);
    const failed = results.reduce((n, r) => n + r.failed, 0);
    return {
      summary: `${hosts.length} hosts: ${moved} tenant databases taken over, ${preparedRolledBack} prepared transactions rolled back, ${failed} failures`,
      fields: { hosts: hosts.length, moved, preparedRolledBack, failed },
      level: moved + preparedRolledBack + failed > 0 ? "warn" : "info",
      changed: moved + preparedRolledBack + failed > 0,
    };
  },
};
