/**
 * Cron job: the fleet sweep's visit to a bounded slice of the region's hosts and tunnels
 * (docs/adr/028-a-fleet-that-sleeps.md). Each host's periodic work (the ledger reconcile, orphaned
 * backends, hygiene, the capability probe) runs in its BudgetObject's alarm; this job only makes
 * sure each object has one, so a host whose object was never called (a new host, an object whose
 * last alarm failed before it set the next) is still looked after. A visit is one call to the
 * object: no query to the host or the control plane, no tenant's object woken. Every host is
 * visited once per `LESSOR_SWEEP_MINUTES`, at most `maxHostsPerTick` a tick, so a tick's
 * subrequests do not grow with the fleet (past 50 × the sweep's minutes, a sweep takes longer).
 * Idempotent.
 */
import { type LessorConfig, loadConfig } from "../../config/index.ts";
import { sweepSlice, tickIndexOf } from "../../core/sweep.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { budgetObject } from "../../placement/index.ts";
import type { CronJob } from "../fan-out.ts";

/** Hosts one tick visits at most: its subrequests, whatever the fleet's size. */
export const maxHostsPerTick = 50;

/** The region's hosts and (in the default region) tunnels' budgets, in a stable order. */
export function sweptSubjects(config: LessorConfig, region: string): string[] {
  const hosts = [...config.hosts.values()].filter((h) => h.region === region).map((h) => h.name);
  const tunnels =
    region === config.defaultRegion ? [...config.tunnels.values()].map((t) => t.budgetName) : [];
  return [...hosts, ...tunnels].sort();
}

/** The subjects this tick visits. */
export function hostsThisTick(config: LessorConfig, region: string, scheduledTime: number): string[] {
  const subjects = sweptSubjects(config, region);
  const { start, end } = sweepSlice(
    subjects.length,
    tickIndexOf(scheduledTime),
    config.sweepMinutes,
    maxHostsPerTick,
  );
  return subjects.slice(start, end);
}

export const hostSweepJob: CronJob = {
  name: "host-sweep",
  timeoutMs: 30_000,
  async run(env, tick) {
    const config = loadConfig(env);
    const visit = hostsThisTick(config, tick.region, tick.scheduledTime);
    let failed = 0;
    await Promise.all(
      visit.map((name) =>
        budgetObject(env, name)
          .ensureSweep(name)
          .catch((error: unknown) => {
            failed++;
            logEvent("warn", "host_sweep_visit_failed", { host: name, failure: describeFailure(error) });
          }),
      ),
    );
    return {
      summary: `${visit.length} host(s) of ${sweptSubjects(config, tick.region).length} visited (their alarms set), ${failed} failed`,
      fields: { visited: visit.length, failed },
      level: failed > 0 ? "warn" : "info",
      changed: false,
    };
  },
};
