/**
 * One cron tick of a large fleet, simulated (docs/adr/028-a-fleet-that-sleeps.md): the Worker's
 * scheduled fan-out runs its real jobs against a configuration of N hosts whose objects are
 * counting fakes (every Durable Object RPC call is a subrequest, and counted) and a control plane
 * that answers every statement with no rows (an idle fleet: nothing due). No host is reached: a
 * maintenance slot is refused, so a job that would connect to a host stops at the slot, after the
 * calls that count. `npm run bench:fleet-tick` prints the subrequests and the CPU of the tick,
 * before (the per-host jobs of every minute) and after (the sweep), for 10, 100 and 1,000 hosts.
 *
 * It runs under vitest (test/unit/fleet-tick.test.ts, which asserts the counts; the CPU is
 * reported only, it depends on the machine): Node's own TypeScript stripping cannot load all of
 * src/ (parameter properties), vitest's transform can. So it lives with the unit tests, not in
 * bench/.
 */

import { runJobs } from "../../src/cron/fan-out.ts";
import { type CronJob, cronJobs, type JobReport } from "../../src/cron/index.ts";
import { budgetReconcileJob } from "../../src/cron/jobs/budget-reconcile.ts";
import { hostHygieneJob } from "../../src/cron/jobs/host-hygiene.ts";

/** Subrequests one tick made, by the namespace they went to. */
export interface TickCount {
  hosts: number;
  budgets: number;
  tenants: number;
  controlPlane: number;
  total: number;
  /** Process CPU of the tick, microseconds (a figure for the report, never asserted). */
  cpuMicros: number;
  reports: JobReport[];
}

type Answer = (method: string, args: unknown[]) => unknown;

function countingNamespace(counter: { n: number }, answer: Answer) {
  const namespace = {
    getByName(_name: string, _options?: unknown) {
      return new Proxy(
        {},
        {
          get(_target, method) {
            if (method === "then") return undefined;
            return (...args: unknown[]) => {
              counter.n++;
              try {
                return Promise.resolve(answer(String(method), args));
              } catch (error) {
                return Promise.reject(error);
              }
            };
          },
        },
      );
    },
    jurisdiction() {
      return namespace;
    },
  };
  return namespace;
}

/** An env of `hosts` hosts in one region, its objects counting fakes. */
export function simulatedEnv(hosts: number): {
  env: Env;
  counts: { budgets: { n: number }; tenants: { n: number }; controlPlane: { n: number } };
} {
  const counts = { budgets: { n: 0 }, tenants: { n: 0 }, controlPlane: { n: 0 } };
  const hostUrls: Record<string, string> = {};
  for (let i = 0; i < hosts; i++) {
    hostUrls[`h-${String(i).padStart(4, "0")}`] =
      `postgres://admin:pw@10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}:5432/postgres`;
  }
  const env = {
    LESSOR_POOL_SIZES: JSON.stringify({ free: 2, standard: 5 }),
    LESSOR_BUDGETS: JSON.stringify({ "*": { connections: 100 } }),
    LESSOR_HOSTS: JSON.stringify(hostUrls),
    LESSOR_CONTROL_PLANE_URL: "postgres://cp:pw@10.255.0.1:5432/lessor",
    LESSOR_ADMIN_KEY: "bench-admin",
    LESSOR_SEAL_KEY: "bench-seal",
    LESSOR_KEY_MAC_KEYS: btoa(String.fromCharCode(...new Uint8Array(32).fill(7))),
    BUDGETS: countingNamespace(counts.budgets, (method) => {
      if (method === "ensureSweep") return Date.now() + 3_600_000;
      if (method === "reconcile") return { checked: 0, released: 0, corrected: 0, maintenanceExpired: 0 };
      if (method === "acquireMaintenance") return { granted: false, retryAfterMs: 1_000 };
      return undefined;
    }),
    TENANTS: countingNamespace(counts.tenants, () => ({ ok: false })),
    CONTROL_PLANE: countingNamespace(counts.controlPlane, (method) => {
      if (method === "open") return { ok: true, value: "session" };
      if (method === "query")
        return { ok: true, value: { command: "SELECT", rowCount: 0, fields: [], rows: [] } };
      return undefined;
    }),
  } as unknown as Env;
  return { env, counts };
}

/** Runs one tick of `jobs` for `hosts` hosts and counts its subrequests. */
export async function simulateTick(
  hosts: number,
  jobs: readonly CronJob[],
  scheduledTime = Date.parse("2026-12-03T12:01:00Z"),
): Promise<TickCount> {
  const { env, counts } = simulatedEnv(hosts);
  const quiet = { log: console.log, warn: console.warn, error: console.error };
  console.log = console.warn = console.error = () => undefined;
  const started = process.cpuUsage();
  let reports: JobReport[];
  try {
    reports = await runJobs(
      jobs,
      env,
      { cron: "* * * * *", scheduledTime },
      ["default"],
      () => undefined,
      360,
    );
  } finally {
    Object.assign(console, quiet);
  }
  const cpu = process.cpuUsage(started);
  const total = counts.budgets.n + counts.tenants.n + counts.controlPlane.n;
  return {
    hosts,
    budgets: counts.budgets.n,
    tenants: counts.tenants.n,
    controlPlane: counts.controlPlane.n,
    total,
    cpuMicros: cpu.user + cpu.system,
    reports,
  };
}

/** The cron of before: the per-host jobs ran on every tick, for every host. */
export const jobsBefore: readonly CronJob[] = [
  ...cronJobs.filter((job) => job.name !== "host-sweep"),
  budgetReconcileJob,
  hostHygieneJob,
];

/** The table `npm run bench:fleet-tick` prints: subrequests and CPU per tick, before and after. */
export async function fleetTickTable(): Promise<Record<string, unknown>[]> {
  const rows: Record<string, unknown>[] = [];
  for (const hosts of [10, 100, 1_000]) {
    for (const [label, jobs] of [
      ["before", jobsBefore],
      ["after", cronJobs],
    ] as const) {
      // One warm-up tick (module and JIT), then the counted one.
      await simulateTick(hosts, jobs);
      const tick = await simulateTick(hosts, jobs);
      rows.push({
        hosts,
        cron: label,
        subrequests: tick.total,
        budgetObjectCalls: tick.budgets,
        tenantObjectCalls: tick.tenants,
        controlPlaneCalls: tick.controlPlane,
        cpuMs: Math.round(tick.cpuMicros / 100) / 10,
      });
    }
  }
  return rows;
}
