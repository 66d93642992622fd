/**
 * Cron job: reconcile every host's budget with the truth. In the ledger, an allocation whose tenant
 * no longer confirms its generation (an object that died, a start that never finished) is released,
 * and a maintenance slot whose holder outlived its deadline is freed. On the host, a pooled backend
 * whose generation no object confirms is terminated (src/tenant-db/orphans.ts). Idempotent.
 */
import { loadConfig } from "../../config/index.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { budgetObject } from "../../placement/index.ts";
import { reapOrphanBackends } from "../../tenant-db/orphans.ts";
import type { CronJob } from "../fan-out.ts";

export const budgetReconcileJob: CronJob = {
  name: "budget-reconcile",
  timeoutMs: 30_000,
  async run(env, tick) {
    const config = loadConfig(env);
    // The region's hosts: each region reconciles its own (docs/adr/023-regions.md).
    const hosts = [...config.hosts.values()].filter((host) => host.region === tick.region);
    const results: {
      checked: number;
      released: number;
      maintenanceExpired: number;
      orphans: { terminated: number };
    }[] = await Promise.all(
      hosts.map(async (host) => {
        const budget = budgetObject(env, host.name);
        const ledger = await budget.reconcile(host.name);
        const orphans = await reapOrphanBackends(env, config, host).catch((error: unknown) => {
          // A host that cannot be reached now is looked at next time.
          logEvent("warn", "orphan_reap_failed", { host: host.name, failure: describeFailure(error) });
          return { checked: 0, terminated: 0 };
        });
        if (orphans.terminated > 0) await budget.recordReconcile(orphans.terminated);
        return { ...ledger, orphans };
      }),
    );
    // Customers' tunnels: the ledger only (Lessor has no admin on a customer's server; a killed
    // object's connections through a tunnel die with its sockets, and their backends with them).
    // Tunnels are the default region's (ADR 023: they name no region).
    const tunnels = tick.region === config.defaultRegion ? [...config.tunnels.values()] : [];
    for (const tunnel of tunnels) {
      const ledger = await budgetObject(env, tunnel.budgetName)
        .reconcile(tunnel.budgetName)
        .catch((error: unknown) => {
          logEvent("warn", "tunnel_reconcile_failed", {
            tunnel: tunnel.name,
            failure: describeFailure(error),
          });
          return { checked: 0, released: 0, maintenanceExpired: 0 };
        });
      results.push({
        checked: ledger.checked,
        released: ledger.released,
        maintenanceExpired: ledger.maintenanceExpired,
        orphans: { terminated: 0 },
      });
    }
    const sum = (pick: (r: (typeof results)[number]) => number) => results.reduce((n, r) => n + pick(r), 0);
    const checked = sum((r) => r.checked);
    const released = sum((r) => r.released);
    const maintenanceExpired = sum((r) => r.maintenanceExpired);
    const orphansTerminated = sum((r) => r.orphans.terminated);
    return {
      summary: `checked ${checked} allocations on ${hosts.length} hosts${tunnels.length > 0 ? ` and ${tunnels.length} tunnels` : ""}, released ${released}; freed ${maintenanceExpired} expired maintenance slots; terminated ${orphansTerminated} orphaned backends`,
      fields: { hosts: hosts.length, checked, released, maintenanceExpired, orphansTerminated },
      level: released + maintenanceExpired + orphansTerminated > 0 ? "warn" : "info",
      changed: released + maintenanceExpired + orphansTerminated > 0,
    };
  },
};
