/**
 * A fleet that sleeps (docs/adr/028-a-fleet-that-sleeps.md, issue 44): over an idle hour (sixty
 * cron ticks on a clock the test moves, and every host alarm that falls due), no host and no
 * tenant database receives a connection from Lessor, counted from the server's own log; the
 * control plane is read only by the jobs that must (counted per job, from Lessor's own counter of
 * control-plane sessions). The same tick with the per-host jobs of before (every host, every
 * minute) opens connections on every reachable host: the positive control of the count.
 */
import { createScheduledController, env, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import type { SweepRun } from "../../src/budget-object/sweep.ts";
import { budgetHooksForTests } from "../../src/budget-object/test-hooks.ts";
import { loadConfig } from "../../src/config/index.ts";
import { controlPlaneSessionsOpened } from "../../src/control-plane/index.ts";
import { isSweepTick, tickIndexOf } from "../../src/core/sweep.ts";
import { type CronJob, cronJobs, runScheduled } from "../../src/cron/index.ts";
import { budgetReconcileJob } from "../../src/cron/jobs/budget-reconcile.ts";
import { hostHygieneJob } from "../../src/cron/jobs/host-hygiene.ts";
import { sweptSubjects } from "../../src/cron/jobs/host-sweep.ts";
import { connectionsOpened } from "../../src/postgres/index.ts";
import type { TenantRuntimeStatus } from "../../src/rpc/tenant.ts";
import { admin, createTenant, pollUntil, sqlRequest, uniqueTenantId } from "./harness.ts";
import { type LogMark, markServerLog, serverLogLines } from "./server-log.ts";

const config = loadConfig(env);
const region = config.defaultRegion;

/**
 * `from`, or the first moment after the last sweep tick among the `ticks` minutes that follow it,
 * so that the `ticks` minutes from the answer hold no sweep tick (src/core/sweep.ts).
 */
function clearOfSweepTicks(from: number, ticks: number): number {
  let start = from;
  for (let tick = tickIndexOf(from); tick <= tickIndexOf(from) + ticks; tick++) {
    if (isSweepTick(tick, config.sweepMinutes)) start = (tick + 1) * 60_000 + 1_000;
  }
  return start;
}
const subjects = sweptSubjects(config, region);
const superuser = decodeURIComponent(
  new URL(env.TEST_PG_SUPERUSER_URL.replace(/^postgres:/, "http:")).username,
);

function ctx(runs: Promise<unknown>[]): ExecutionContext {
  return {
    waitUntil: (promise: Promise<unknown>) => {
      runs.push(promise);
    },
    passThroughOnException: () => undefined,
    props: {},
  } as unknown as ExecutionContext;
}

/** One cron tick of `jobs` at the current (fake) time; resolves when every run has settled. */
async function cronTick(jobs: readonly CronJob[]): Promise<void> {
  const runs: Promise<unknown>[] = [];
  const controller = createScheduledController({ cron: "* * * * *", scheduledTime: Date.now() });
  await runScheduled(controller, env, ctx(runs), jobs);
  await Promise.all(runs);
}

/** Runs every host's alarm that is due by the current (fake) time; says how many ran. */
async function runDueAlarms(): Promise<number> {
  let ran = 0;
  for (const name of subjects) {
    const stub = env.BUDGETS.getByName(name);
    const at = await runInDurableObject(stub, (_instance, state) => state.storage.getAlarm());
    if (at !== null && at <= Date.now() && (await runDurableObjectAlarm(stub))) ran++;
  }
  return ran;
}

/** Connections the server authorized between two marks, by `user@database`, not counting the superuser's. */
async function connectionsBetween(from: LogMark, to: LogMark): Promise<Record<string, number>> {
  const lines = await serverLogLines(from, to, "connection authorized:");
  const counts: Record<string, number> = {};
  for (const line of lines) {
    const user = /user=(\S+)/.exec(line)?.[1] ?? "?";
    const database = /database=(\S+)/.exec(line)?.[1] ?? "?";
    if (user === superuser) continue;
    const key = `${user}@${database}`;
    counts[key] = (counts[key] ?? 0) + 1;
  }
  return counts;
}

function sessionsDelta(before: ReadonlyMap<string, number>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [name, n] of controlPlaneSessionsOpened()) {
    const d = n - (before.get(name) ?? 0);
    if (d > 0) out[name] = d;
  }
  return out;
}

describe("an idle hour", () => {
  const sweeps: SweepRun[] = [];
  beforeAll(() => {
    budgetHooksForTests.sweep = undefined;
    budgetHooksForTests.onSweep = (run) => {
      sweeps.push(run);
    };
  });
  afterAll(() => {
    budgetHooksForTests.sweep = "off";
    budgetHooksForTests.onSweep = undefined;
    vi.useRealTimers();
  });

  it("reaches no host and no tenant database; the control plane only from the jobs that must", async () => {
    // Two tenants that were busy, then stopped: each pool's stop asks for a look at its host.
    const tenants = [await createTenant(uniqueTenantId("idle")), await createTenant(uniqueTenantId("idle"))];
    for (const tenant of tenants) {
      expect((await sqlRequest(tenant.connectionString, { query: "SELECT 1" })).status).toBe(200);
    }
    for (const tenant of tenants) {
      const drained = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
      expect(drained.status).toBe(202);
    }
    const stopped = await pollUntil(
      () =>
        runInDurableObject(env.BUDGETS.getByName("local"), (_i, state) =>
          state.storage.kv.get("sweep:look-at"),
        ),
      (reasons) => Array.isArray(reasons) && reasons.includes("pool_stopped"),
      { attempts: 100, intervalMs: 50 },
    );
    expect(stopped).toContain("pool_stopped");
    // Each tenant's object flushes its events and usage to the control plane and is left with no
    // alarm: nothing of a tenant wakes in the hour. Its alarms are run here until then (left to
    // workerd, a flush due in the hour's real seconds would be counted against whichever job ran
    // then).
    for (const tenant of tenants) {
      const stub = env.TENANTS.getByName(tenant.id);
      const quiet = await pollUntil(
        async () => {
          await runDurableObjectAlarm(stub);
          return runInDurableObject(stub, async (instance, state) => {
            const status = await (instance as unknown as { status(): Promise<TenantRuntimeStatus> }).status();
            return {
              state: status.state,
              pending: status.pendingEvents,
              alarm: await state.storage.getAlarm(),
            };
          });
        },
        (seen) => seen.state === "stopped" && seen.pending === 0 && seen.alarm === null,
        { attempts: 100, intervalMs: 50 },
      );
      expect(quiet).toEqual({ state: "stopped", pending: 0, alarm: null });
    }

    vi.useFakeTimers({ toFake: ["Date"] });
    // The settle and the hour span about 75 ticks from here. A job on the slow cadence runs on the
    // fleet sweep's ticks (every LESSOR_SWEEP_MINUTES, at fixed times of the wall clock): if one falls
    // in them, the run starts just after it, so that what is counted never depends on the hour the
    // suite happens to run at (CI at 22:41 UTC counted midnight's audit-retention run).
    vi.setSystemTime(clearOfSweepTicks(Date.now() + 60_000, 80));
    // Settle: every host's object has an alarm (what the sweep's visits make sure of over a sweep),
    // and whatever is due now (the stopped pools' look, every host's first visit) runs.
    for (const name of subjects) await env.BUDGETS.getByName(name).ensureSweep(name);
    for (let minute = 0; minute < 10; minute++) {
      vi.setSystemTime(Date.now() + 60_000);
      await runDueAlarms();
    }
    const looked = sweeps.find((run) => run.host === "local" && run.visited);
    expect(looked?.failed).toEqual([]);
    // Every host was visited once, and none failed (a failing host is retried later each time).
    expect(new Set(sweeps.filter((run) => run.visited).map((run) => run.host))).toEqual(new Set(subjects));
    expect(sweeps.filter((run) => run.failed.length > 0)).toEqual([]);

    // The idle hour.
    sweeps.length = 0;
    const from = await markServerLog();
    const sessionsBefore = controlPlaneSessionsOpened();
    const openedBefore = connectionsOpened();
    const perJob: Record<string, Record<string, number>> = {};
    let alarms = 0;
    for (let minute = 0; minute < 60; minute++) {
      vi.setSystemTime(Date.now() + 60_000);
      for (const job of cronJobs) {
        const before = controlPlaneSessionsOpened();
        await cronTick([job]);
        for (const [name, n] of Object.entries(sessionsDelta(before))) {
          const mine = perJob[job.name] ?? {};
          mine[name] = (mine[name] ?? 0) + n;
          perJob[job.name] = mine;
        }
      }
      alarms += await runDueAlarms();
    }
    const to = await markServerLog();
    const opened = connectionsOpened();
    const connections = await connectionsBetween(from, to);

    // No host's alarm fell due in the hour, so no host work ran.
    expect(alarms).toBe(0);
    expect(sweeps).toEqual([]);
    // From the server's log: no connection to any host's maintenance database or to any tenant's
    // database; only the control plane's own pool renewing a few of its connections.
    expect(Object.keys(connections).filter((key) => !key.endsWith("@lessor"))).toEqual([]);
    expect(opened.host_admin - openedBefore.host_admin).toBe(0);
    expect(opened.tenant - openedBefore.tenant).toBe(0);
    // The control plane: only the jobs that must look every minute, one session each a tick.
    expect(perJob).toEqual({
      "usage-fold": { "lessor-fold": 60 },
      "migration-campaigns": { "lessor-control-plane": 60 },
      "erase-resume": { "lessor-control-plane": 60 },
      "move-resume": { "lessor-control-plane": 60 },
    });
    expect(sessionsDelta(sessionsBefore)).toEqual({ "lessor-fold": 60, "lessor-control-plane": 180 });
  });

  it("the per-host jobs of before reach every reachable host on one tick (the count's control)", async () => {
    const from = await markServerLog();
    vi.setSystemTime(Date.now() + 60_000);
    await cronTick([budgetReconcileJob, hostHygieneJob]);
    const to = await markServerLog();
    const connections = await connectionsBetween(from, to);
    // The hosts that share the test cluster's own admin each opened their reaper's and hygiene's.
    const sharedAdminHosts = [...config.hosts.values()].filter(
      (host) =>
        host.region === region &&
        new URL(host.adminUrl.replace(/^postgres:/, "http:")).username === "lessor_admin",
    );
    expect(connections["lessor_admin@postgres"] ?? 0).toBeGreaterThanOrEqual(2 * sharedAdminHosts.length);
  });
});
