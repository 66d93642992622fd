/**
 * Cron job: reconcile every host's budget ledger. An allocation whose tenant no longer confirms its
 * generation (an object that died, a start that never finished) is released. Idempotent.
 */
import { loadConfig } from "../../config/index.ts";
import type { CronJob } from "../fan-out.ts";

export const budgetReconcileJob: CronJob = {
  name: "budget-reconcile",
  timeoutMs: 30_000,
  async run(env) {
    const hosts = [...loadConfig(env).hosts.keys()];
    const results = await Promise.all(hosts.map((host) => env.BUDGETS.getByName(host).reconcile(host)));
    const checked = results.reduce((n, r) => n + r.checked, 0);
    const released = results.reduce((n, r) => n + r.released, 0);
    return {
      summary: `checked ${checked} allocations on ${hosts.length} hosts, released ${released}`,
      fields: { hosts: hosts.length, checked, released },
      level: released > 0 ? "warn" : "info",
    };
  },
};
