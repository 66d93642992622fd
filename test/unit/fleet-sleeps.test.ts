/**
 * A fleet that sleeps (docs/adr/028-a-fleet-that-sleeps.md) as pure code: a host's room in tenants,
 * where a new tenant goes, which hosts one cron tick visits, and when a host's object looks at its
 * host next.
 */
import { describe, expect, it } from "vitest";
import {
  chooseHost,
  fitsTenancy,
  type HostCandidate,
  hostTenancyLimits,
  kindTenancyLimits,
  tenancyUsed,
  tenantFootprint,
  tenantsThatFit,
} from "../../src/core/host-room.ts";
import { hostSweepJitterMs, hostWorkDue, nextHostAlarmAt, sweepSlice } from "../../src/core/sweep.ts";

const plain = { databases: 1, roles: 1 };
const jwt = tenantFootprint(true);

function host(
  name: string,
  tenants: number,
  jwtTenants = 0,
  limit: number | null = 10,
  committed = 0,
): HostCandidate {
  return {
    name,
    limits: { databases: limit, roles: limit },
    used: tenancyUsed(tenants, jwtTenants),
    connections: { budget: 100, committed },
  };
}

describe("host tenancy limits", () => {
  it("Neon's kind declares its branch limits less the host's own, a plain server none", () => {
    expect(kindTenancyLimits("neon")).toEqual({ databases: 495, roles: 495 });
    expect(kindTenancyLimits("postgres")).toEqual({ databases: null, roles: null });
  });

  it("configuration lowers a kind's limit, never raises it", () => {
    expect(hostTenancyLimits("neon", { databases: 100 })).toEqual({ databases: 100, roles: 495 });
    expect(hostTenancyLimits("neon", { roles: 10_000 })).toEqual({ databases: 495, roles: 495 });
    expect(hostTenancyLimits("postgres", { roles: 40 })).toEqual({ databases: null, roles: 40 });
  });

  it("a JWT tenant takes two roles, so a Neon branch holds 247 of them and 495 plain ones", () => {
    const limits = kindTenancyLimits("neon");
    expect(tenantFootprint(false)).toEqual(plain);
    expect(jwt).toEqual({ databases: 1, roles: 2 });
    expect(tenantsThatFit(limits, tenancyUsed(0, 0), jwt)).toBe(247);
    expect(tenantsThatFit(limits, tenancyUsed(0, 0), plain)).toBe(495);
    // 300 plain tenants and 150 of them in JWT mode: 450 roles; 45 plain or 22 JWT tenants more.
    expect(tenantsThatFit(limits, tenancyUsed(300, 150), plain)).toBe(45);
    expect(tenantsThatFit(limits, tenancyUsed(300, 150), jwt)).toBe(22);
    expect(tenantsThatFit({ databases: null, roles: null }, tenancyUsed(5, 5), jwt)).toBeNull();
  });

  it("fits exactly up to the limit, and not one past it", () => {
    const limits = { databases: 3, roles: 4 };
    expect(fitsTenancy(limits, tenancyUsed(2, 1), plain)).toBe(true); // 3 dbs, 4 roles
    expect(fitsTenancy(limits, tenancyUsed(2, 1), jwt)).toBe(false); // 5 roles
    expect(fitsTenancy(limits, tenancyUsed(3, 0), plain)).toBe(false); // 4 dbs
  });
});

describe("placement by room", () => {
  it("goes to the host with the most room in tenants", () => {
    expect(chooseHost([host("a", 8), host("b", 2), host("c", 5)], plain)).toMatchObject({
      kind: "chosen",
      host: "b",
      tenantsLeft: 7,
    });
  });

  it("counts roles: a host full of JWT tenants has less room than its databases say", () => {
    // a: 4 databases, 8 roles (room 2); b: 6 databases, 6 roles (room 4).
    expect(chooseHost([host("a", 4, 4), host("b", 6)], plain)).toMatchObject({ host: "b" });
  });

  it("then the most connection budget left, then the first by name", () => {
    expect(chooseHost([host("a", 3, 0, 10, 90), host("b", 3, 0, 10, 10)], plain)).toMatchObject({
      host: "b",
      connectionsLeft: 90,
    });
    expect(chooseHost([host("z", 3), host("m", 3), host("q", 3)], plain)).toMatchObject({ host: "m" });
    // The same answer whatever order the hosts come in.
    const hosts = [host("z", 3), host("m", 3), host("q", 3), host("k", 4)];
    for (let i = 0; i < hosts.length; i++) {
      const rotated = [...hosts.slice(i), ...hosts.slice(0, i)];
      expect(chooseHost(rotated, plain)).toMatchObject({ host: "m" });
      expect(chooseHost([...rotated].reverse(), plain)).toMatchObject({ host: "m" });
    }
  });

  it("an unlimited host has the most room", () => {
    expect(chooseHost([host("a", 0), host("b", 900, 0, null)], plain)).toMatchObject({
      host: "b",
      tenantsLeft: null,
    });
  });

  it("never a full host: full when every host is", () => {
    expect(chooseHost([host("a", 10), host("b", 9, 1)], plain)).toEqual({ kind: "full", hosts: 2 });
    // b has one database and one role left: a plain tenant fits, a JWT one (two roles) does not.
    expect(chooseHost([host("a", 10), host("b", 9)], plain)).toMatchObject({ host: "b" });
    expect(chooseHost([host("a", 10), host("b", 9)], jwt)).toEqual({ kind: "full", hosts: 2 });
    expect(chooseHost([host("a", 10), host("b", 8)], jwt)).toMatchObject({ host: "b", tenantsLeft: 0 });
    expect(chooseHost([], plain)).toEqual({ kind: "full", hosts: 0 });
  });

  it("filling a region one tenant at a time spreads it, and stops at the sum of the limits", () => {
    const hosts = [host("a", 0, 0, 7), host("b", 0, 0, 5), host("c", 0, 0, 3)];
    let placed = 0;
    for (;;) {
      const choice = chooseHost(hosts, plain);
      if (choice.kind === "full") break;
      const chosen = hosts.find((h) => h.name === choice.host);
      if (!chosen) throw new Error("chose a host that is not a candidate");
      chosen.used = tenancyUsed(chosen.used.databases + 1, 0);
      placed++;
    }
    expect(placed).toBe(15);
    expect(hosts.map((h) => h.used.databases)).toEqual([7, 5, 3]);
  });
});

describe("the fleet sweep", () => {
  it("visits every host once per sweep, a bounded slice per tick", () => {
    const hosts = 1_000;
    const sweepTicks = 360;
    const seen = new Map<number, number>();
    let most = 0;
    for (let tick = 0; tick < sweepTicks; tick++) {
      const { start, end } = sweepSlice(hosts, tick, sweepTicks, 50);
      most = Math.max(most, end - start);
      for (let i = start; i < end; i++) seen.set(i, (seen.get(i) ?? 0) + 1);
    }
    expect(most).toBe(3);
    expect(seen.size).toBe(hosts);
    expect(Math.min(...seen.values())).toBeGreaterThanOrEqual(1);
  });

  it("a slice never passes its bound, however many hosts (the sweep takes longer instead)", () => {
    for (const hosts of [0, 1, 7, 1_000, 100_000]) {
      for (const tick of [0, 1, 359, 360, 123_456]) {
        const { start, end } = sweepSlice(hosts, tick, 360, 50);
        expect(end - start).toBeLessThanOrEqual(50);
        expect(start).toBeGreaterThanOrEqual(0);
        expect(end).toBeLessThanOrEqual(hosts);
      }
    }
    expect(sweepSlice(0, 5, 360, 50)).toEqual({ start: 0, end: 0 });
  });

  it("jitter is stable per host and inside a tenth of the sweep", () => {
    const sweepMs = 6 * 3_600_000;
    const a = hostSweepJitterMs("host-a", sweepMs);
    expect(hostSweepJitterMs("host-a", sweepMs)).toBe(a);
    const spread = new Set(Array.from({ length: 50 }, (_, i) => hostSweepJitterMs(`h${i}`, sweepMs)));
    expect(spread.size).toBeGreaterThan(40);
    for (const value of spread) {
      expect(value).toBeGreaterThanOrEqual(0);
      expect(value).toBeLessThan(sweepMs / 10);
    }
  });
});

describe("a host's own work", () => {
  const sweepMs = 6 * 3_600_000;
  const now = Date.parse("2026-12-03T12:00:00Z");
  const quiet = { allocations: 0, lookAt: [] as string[], lastHostVisitAt: now - 60_000, jitterMs: 1_000 };

  it("an idle host with nothing to look at receives nothing until its slow visit", () => {
    expect(hostWorkDue(quiet, now, sweepMs)).toEqual({ ledger: false, host: false });
    expect(nextHostAlarmAt(quiet, now, sweepMs)).toBe(now - 60_000 + sweepMs + 1_000);
    const due = { ...quiet, lastHostVisitAt: now - sweepMs - 1_000 };
    expect(hostWorkDue(due, now, sweepMs)).toEqual({ ledger: false, host: true });
  });

  it("a pool that stopped, a failed start or a restart with pools is looked at on the host", () => {
    expect(hostWorkDue({ ...quiet, lookAt: ["pool_stopped"] }, now, sweepMs)).toEqual({
      ledger: false,
      host: true,
    });
    expect(nextHostAlarmAt({ ...quiet, lookAt: ["start_failed"] }, now, sweepMs)).toBe(now + 60_000);
  });

  it("live pools are reconciled in the ledger every minute, without a query to the host", () => {
    const busy = { ...quiet, allocations: 3 };
    expect(hostWorkDue(busy, now, sweepMs)).toEqual({ ledger: true, host: false });
    expect(nextHostAlarmAt(busy, now, sweepMs)).toBe(now + 60_000);
  });

  it("a host never visited is visited at once", () => {
    expect(hostWorkDue({ ...quiet, lastHostVisitAt: null }, now, sweepMs)).toEqual({
      ledger: false,
      host: true,
    });
  });
});

describe("the price of what idles (bench/price.ts)", () => {
  it("an idle host pays for its slow visits only; before, every compute was awake all month", async () => {
    const { hostingMonth, prices } = await import("../../bench/price.ts");
    const idle = hostingMonth({
      name: "idle",
      hosts: 200,
      regions: 1,
      busyShare: 0,
      poolStopsPerHost: 0,
      egressGb: 50,
      hostCu: 0.25,
    });
    const monthHours = 730.5;
    // Four visits a day of 5 minutes each: 121.75 visits, 10.15 hours.
    expect(idle.hostAwakeHours).toBeCloseTo(((monthHours * 60) / 360) * (5 / 60), 6);
    expect(idle.hosts).toBeCloseTo(200 * idle.hostAwakeHours * 0.25 * prices.neonCuHour, 6);
    expect(idle.controlPlanes).toBeCloseTo(monthHours * 0.25 * 0.106, 6);
    expect(idle.egress).toBe(0); // 50 GB: inside the 100 included
    // Before: 200 computes at 0.25 CU all month, the issue's $3,900.
    expect(idle.before.hosts).toBeCloseTo(200 * monthHours * 0.25 * 0.106, 6);
    expect(Math.round(idle.before.total)).toBe(3891);
    const egress = hostingMonth({ ...idle.scenario, egressGb: 600 });
    expect(egress.egress).toBeCloseTo(50, 6);
  });
});
