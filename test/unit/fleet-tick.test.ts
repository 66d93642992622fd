/**
 * One cron tick of a 1,000-host fleet (docs/adr/028-a-fleet-that-sleeps.md, issue 44), simulated
 * by bench/fleet-tick.ts: every Durable Object call is a subrequest and counted. The tick's
 * subrequests stay bounded whatever the fleet's size; the cron of before grew with it (its per-host
 * jobs called each host's object twice or more, and connected to each host). Counts, never times.
 */
import { describe, expect, it } from "vitest";
import { cronJobs } from "../../src/cron/index.ts";
import { maxHostsPerTick } from "../../src/cron/jobs/host-sweep.ts";
import { fleetTickTable, jobsBefore, simulateTick } from "./fleet-tick-simulation.ts";

/** Cloudflare's subrequest limit per invocation on the paid plan (a Durable Object call counts). */
const subrequestLimit = 10_000;

describe("a 1,000-host tick", () => {
  it("costs a bounded number of subrequests, the same for 10, 100 and 1,000 hosts but the sweep's slice", async () => {
    const ticks = await Promise.all([10, 100, 1_000].map((hosts) => simulateTick(hosts, cronJobs)));
    for (const tick of ticks) {
      // The sweep visits at most its slice of hosts (one call each); no tenant's object is called.
      expect(tick.budgets).toBeLessThanOrEqual(maxHostsPerTick);
      expect(tick.tenants).toBe(0);
    }
    // 1,000 hosts over a 360-minute sweep: 3 a tick.
    expect(ticks.map((t) => t.budgets)).toEqual([1, 1, 3]);
    // The control plane's calls do not depend on the hosts at all.
    expect(new Set(ticks.map((t) => t.controlPlane)).size).toBe(1);
    const big = ticks[2];
    expect(big?.total).toBeLessThan(100);
    expect(big?.reports.map((r) => r.job).sort()).toEqual(
      [
        "credential-rotation",
        "erase-resume",
        "host-sweep",
        "migration-campaigns",
        "move-resume",
        "reseal",
        "usage-fold",
      ].sort(),
    );
  });

  it("the cron of before called every host's object on every tick (the count's control)", async () => {
    const before = await simulateTick(1_000, jobsBefore);
    // Reconcile, then the reaper's and hygiene's maintenance slots: three calls a host at least.
    expect(before.budgets).toBeGreaterThanOrEqual(3_000);
    const after = await simulateTick(1_000, cronJobs);
    expect(after.total * 30).toBeLessThan(before.total);
    expect(before.total).toBeLessThan(subrequestLimit);
  });

  it("prints the table for npm run bench:fleet-tick (-t table)", async () => {
    const rows = await fleetTickTable();
    expect(rows).toHaveLength(6);
    if (process.env.LESSOR_BENCH_FLEET_TICK === "1")
      process.stdout.write(`${JSON.stringify(rows, null, 1)}\n`);
  });
});
