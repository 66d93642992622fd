import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import {
  lowestSize,
  newUsageRecord,
  type ObservedUse,
  observe,
  recordInUse,
  recordRefusal,
  recordWait,
  restartObservation,
  type SizeInput,
  targetSize,
  usageBuckets,
} from "../../src/core/adaptive.ts";
import {
  type Allocation,
  type BudgetLimits,
  evictionDryRun,
  planReclaim,
  poolCapacity,
  shrinkableConnections,
  usedConnections,
} from "../../src/core/budget.ts";
import { LessorError } from "../../src/errors/index.ts";

const windowMs = 60_000;

describe("the usage record", () => {
  it("keeps the windowed peak, the mean, waits and refusals", () => {
    const record = newUsageRecord(windowMs, 0);
    recordInUse(record, 1_000, 3);
    recordInUse(record, 11_000, 1); // 3 leases for 10 s, then 1
    recordWait(record, 5_000, 40);
    recordWait(record, 6_000, 10);
    recordRefusal(record, 7_000);
    const seen = observe(record, 21_000); // 1 lease for another 10 s
    expect(seen.peak).toBe(3);
    expect(seen.mean).toBeCloseTo((3 * 10_000 + 1 * 10_000) / 21_000, 5);
    expect(seen.waits).toBe(2);
    expect(seen.maxWaitMs).toBe(40);
    expect(seen.meanWaitMs).toBe(25);
    expect(seen.refusals).toBe(1);
    expect(seen.coveredMs).toBe(21_000);
    expect(seen.inUse).toBe(1);
  });

  it("forgets what is older than the window", () => {
    const record = newUsageRecord(windowMs, 0);
    recordInUse(record, 1_000, 5);
    recordInUse(record, 2_000, 0);
    recordWait(record, 1_500, 100);
    const later = observe(record, 2_000 + windowMs + record.bucketMs);
    expect(later.peak).toBe(0);
    expect(later.waits).toBe(0);
    expect(later.coveredMs).toBe(windowMs);
    expect(later.mean).toBe(0);
  });

  it("counts a level held across the whole window in its peak and mean", () => {
    const record = newUsageRecord(windowMs, 0);
    recordInUse(record, 0, 2);
    const seen = observe(record, 10 * windowMs);
    expect(seen.peak).toBe(2);
    expect(seen.recentPeak).toBe(2);
    expect(seen.mean).toBeCloseTo(2, 5);
  });

  it("starts a new window on restart, at the level in use", () => {
    const record = newUsageRecord(windowMs, 0);
    recordInUse(record, 0, 4);
    recordInUse(record, 1_000, 1);
    restartObservation(record, 2_000);
    const seen = observe(record, 3_000);
    expect(seen.peak).toBe(1);
    expect(seen.coveredMs).toBe(1_000);
  });

  it("stays bounded, and its peak is the most in use within the window, whatever the traffic", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            dt: fc.integer({ min: 0, max: 40_000 }),
            inUse: fc.integer({ min: 0, max: 64 }),
            wait: fc.option(fc.integer({ min: 0, max: 10_000 })),
          }),
          { maxLength: 200 },
        ),
        (events) => {
          const record = newUsageRecord(windowMs, 0);
          let now = 0;
          const levels: { at: number; inUse: number }[] = [{ at: 0, inUse: 0 }];
          for (const e of events) {
            now += e.dt;
            recordInUse(record, now, e.inUse);
            levels.push({ at: now, inUse: e.inUse });
            if (e.wait !== null) recordWait(record, now, e.wait);
            expect(record.buckets.length).toBeLessThanOrEqual(usageBuckets + 2);
          }
          const seen = observe(record, now);
          // The peak covers at least every level set within the window, and never more than any level seen.
          const windowStart = now - windowMs;
          const inWindow = levels.filter((l) => l.at >= windowStart).map((l) => l.inUse);
          const heldInto = levels.filter((l) => l.at < windowStart).at(-1)?.inUse ?? 0;
          expect(seen.peak).toBeGreaterThanOrEqual(Math.max(0, ...inWindow, heldInto));
          expect(seen.peak).toBeLessThanOrEqual(Math.max(0, ...levels.map((l) => l.inUse)));
          expect(seen.mean).toBeGreaterThanOrEqual(0);
          expect(seen.mean).toBeLessThanOrEqual(seen.peak + 1e-9);
          expect(seen.recentPeak).toBeLessThanOrEqual(seen.peak);
        },
      ),
    );
  });
});

const observedArb: fc.Arbitrary<ObservedUse> = fc
  .record({
    peak: fc.integer({ min: 0, max: 64 }),
    recentFraction: fc.double({ min: 0, max: 1, noNaN: true }),
    inUse: fc.integer({ min: 0, max: 64 }),
    coveredMs: fc.integer({ min: 0, max: windowMs }),
    waits: fc.integer({ min: 0, max: 5 }),
    refusals: fc.integer({ min: 0, max: 5 }),
  })
  .map((o) => {
    const peak = Math.max(o.peak, o.inUse);
    const recentPeak = Math.max(o.inUse, Math.floor(peak * o.recentFraction));
    return {
      windowMs,
      coveredMs: o.coveredMs,
      peak,
      recentPeak,
      mean: peak / 2,
      waits: o.waits,
      meanWaitMs: 0,
      maxWaitMs: 0,
      refusals: o.refusals,
      inUse: o.inUse,
    };
  });

const inputArb: fc.Arbitrary<SizeInput> = fc
  .record({
    max: fc.integer({ min: 1, max: 6 }),
    floor: fc.integer({ min: 1, max: 6 }),
    step: fc.integer({ min: 1, max: 6 }),
    sizeOffset: fc.integer({ min: 0, max: 5 }),
    waiting: fc.integer({ min: 0, max: 3 }),
    pressure: fc.integer({ min: 0, max: 3 }),
    observed: observedArb,
  })
  .map((r) => ({
    size: Math.min(r.max, Math.min(r.floor, r.max) + r.sizeOffset),
    waiting: r.waiting,
    observed: r.observed,
    floor: r.floor,
    max: r.max,
    growthStep: r.step,
    pressure: { waiting: r.pressure },
  }));

describe("targetSize (the size policy)", () => {
  it("never leaves [floor, max], never goes below the leases in use, grows by at most one step", () => {
    fc.assert(
      fc.property(inputArb, (input) => {
        const { target } = targetSize(input);
        expect(target).toBeLessThanOrEqual(input.max);
        expect(target).toBeGreaterThanOrEqual(Math.min(input.floor, input.max));
        expect(target).toBeGreaterThanOrEqual(Math.min(input.observed.inUse, input.size));
        expect(target).toBeLessThanOrEqual(input.size + input.growthStep);
        expect(target).toBeGreaterThanOrEqual(
          lowestSize(input.size, input.observed.inUse, input.floor, input.max),
        );
      }),
    );
  });

  it("never grows while starts wait on the host, nor without a waiting checkout", () => {
    fc.assert(
      fc.property(inputArb, (input) => {
        const { target } = targetSize(input);
        if (input.pressure.waiting > 0 || input.waiting === 0) expect(target).toBeLessThanOrEqual(input.size);
      }),
    );
  });

  it("never shrinks while checkouts wait", () => {
    fc.assert(
      fc.property(inputArb, (input) => {
        if (input.waiting > 0) expect(targetSize(input).target).toBeGreaterThanOrEqual(input.size);
      }),
    );
  });

  it("without pressure, shrinks only after a whole window with no wait, to that window's peak", () => {
    fc.assert(
      fc.property(inputArb, (input) => {
        const calm = { ...input, pressure: { waiting: 0 } };
        const decision = targetSize(calm);
        if (decision.target < calm.size) {
          expect(decision.reason).toBe("shrink_idle");
          expect(calm.observed.coveredMs).toBe(calm.observed.windowMs);
          expect(calm.observed.waits).toBe(0);
          expect(decision.target).toBeGreaterThanOrEqual(Math.min(calm.observed.peak, calm.size));
        }
      }),
    );
  });

  it("under pressure, gives back what the last bucket did not use", () => {
    const observed = { ...idle(), coveredMs: 1_000, peak: 4, recentPeak: 1, inUse: 1 };
    const input = {
      size: 5,
      waiting: 0,
      observed,
      floor: 1,
      max: 6,
      growthStep: 1,
      pressure: { waiting: 1 },
    };
    expect(targetSize(input)).toEqual({ target: 1, reason: "shrink_pressure" });
    expect(targetSize({ ...input, pressure: { waiting: 0 } })).toEqual({ target: 5, reason: "hold" });
  });

  it("grows one step at a time up to the tier's maximum", () => {
    let size = 1;
    const sizes = [];
    for (let i = 0; i < 8; i++) {
      size = targetSize({
        size,
        waiting: 3,
        observed: { ...idle(), peak: size, inUse: size },
        floor: 1,
        max: 4,
        growthStep: 1,
        pressure: { waiting: 0 },
      }).target;
      sizes.push(size);
    }
    expect(sizes).toEqual([2, 3, 4, 4, 4, 4, 4, 4]);
  });

  it("clamps a pool above a lowered maximum, and lifts one below its floor", () => {
    const base = { waiting: 0, observed: idle(), floor: 2, growthStep: 1, pressure: { waiting: 0 } };
    expect(targetSize({ ...base, size: 6, max: 4 })).toEqual({ target: 4, reason: "clamp" });
    expect(targetSize({ ...base, size: 1, max: 4 })).toEqual({ target: 2, reason: "clamp" });
    expect(targetSize({ ...base, size: 1, max: 1 }).target).toBe(1);
  });
});

function idle(): ObservedUse {
  return {
    windowMs,
    coveredMs: windowMs,
    peak: 0,
    recentPeak: 0,
    mean: 0,
    waits: 0,
    meanWaitMs: 0,
    maxWaitMs: 0,
    refusals: 0,
    inUse: 0,
  };
}

const limits: BudgetLimits = { connections: 22, reserve: 2 };

function pool(tenantId: string, overrides: Partial<Allocation> = {}): Allocation {
  return {
    tenantId,
    generation: 1,
    size: 5,
    phase: "allocated",
    idleSince: 1_000,
    leases: 0,
    pinned: false,
    migrating: false,
    floor: 1,
    recentPeak: 0,
    ...overrides,
  };
}

describe("shrinkableConnections and planReclaim", () => {
  it("a fixed pool, a starting, draining, pinned or migrating one gives back nothing", () => {
    for (const a of [
      pool("fixed", { floor: null }),
      pool("old-ledger", { floor: undefined }),
      pool("starting", { phase: "reserved" }),
      pool("draining", { phase: "draining" }),
      pool("pinned", { pinned: true }),
      pool("migrating", { migrating: true }),
    ]) {
      expect(shrinkableConnections(a), a.tenantId).toBe(0);
    }
    expect(shrinkableConnections(pool("a", { leases: 2, recentPeak: 3 }))).toBe(2);
    expect(shrinkableConnections(pool("b", { floor: 2 }))).toBe(3);
  });

  it("shrinks the most idle pools before it evicts, and evicts only when allowed", () => {
    const full = [
      pool("busy", { leases: 4, recentPeak: 5, idleSince: null }),
      pool("some", { leases: 1, recentPeak: 2, idleSince: null }),
      pool("idle", { idleSince: 500 }),
      pool("fixed", { floor: null, idleSince: 100 }),
    ];
    expect(usedConnections(full)).toBe(poolCapacity(limits));
    const plan = planReclaim(full, limits, 5, { allowEviction: true });
    expect(plan?.map((s) => [s.kind, s.allocation.tenantId, s.kind === "shrink" ? s.take : null])).toEqual([
      ["shrink", "idle", 4],
      ["shrink", "some", 1],
    ]);
    // More than shrinking gives: the least recently used idle pool is evicted, after every shrink.
    const bigger = planReclaim(full, limits, 8, { allowEviction: true });
    expect(bigger?.map((s) => `${s.kind}:${s.allocation.tenantId}`)).toEqual([
      "shrink:idle",
      "shrink:some",
      "evict:fixed",
    ]);
    // An eviction of a pool planned to shrink frees only the rest of it.
    const most = planReclaim(full, limits, 13, { allowEviction: true });
    expect(most?.map((s) => `${s.kind}:${s.allocation.tenantId}`)).toEqual([
      "shrink:some",
      "evict:fixed",
      "evict:idle",
    ]);
    expect(planReclaim(full, limits, 8, { allowEviction: false })).toBeNull();
  });

  it("never plans to take a lease in use, never below a floor, and frees what it promises", () => {
    const allocationArb = fc.record({
      size: fc.integer({ min: 1, max: 6 }),
      floor: fc.option(fc.integer({ min: 1, max: 6 })),
      leases: fc.integer({ min: 0, max: 8 }),
      recentPeak: fc.integer({ min: 0, max: 8 }),
      idleSince: fc.option(fc.integer({ min: 0, max: 10_000 })),
      phase: fc.constantFrom<Allocation["phase"]>("allocated", "allocated", "reserved", "draining"),
      pinned: fc.boolean(),
    });
    fc.assert(
      fc.property(
        fc.array(allocationArb, { maxLength: 8 }),
        fc.integer({ min: 1, max: 6 }),
        fc.boolean(),
        (raw, size, allowEviction) => {
          const allocations = raw.map((r, i) =>
            pool(`t${i}`, { ...r, floor: r.floor === null ? null : Math.min(r.floor, r.size) }),
          );
          const budget = { connections: usedConnections(allocations) + 2, reserve: 2 };
          const plan = planReclaim(allocations, budget, size, { allowEviction });
          if (plan === null) return;
          let freed = 0;
          for (const step of plan) {
            const a = step.allocation;
            if (step.kind === "shrink") {
              expect(step.take).toBeGreaterThan(0);
              expect(a.size - step.take).toBeGreaterThanOrEqual(Math.max(a.floor ?? a.size, a.leases));
              freed += step.take;
            } else {
              expect(allowEviction).toBe(true);
              expect(a.leases).toBe(0);
              expect(a.pinned).toBe(false);
              freed += a.size;
            }
          }
          const draining = allocations.filter((a) => a.phase === "draining").reduce((n, a) => n + a.size, 0);
          expect(freed + draining).toBeGreaterThanOrEqual(size);
        },
      ),
    );
  });
});

describe("configuration of adaptive admission", () => {
  function fakeEnv(budgets: unknown, poolSizes: unknown = { free: 2, standard: 5 }): Env {
    const vars = {
      LESSOR_POOL_SIZES: JSON.stringify(poolSizes),
      LESSOR_BUDGETS: JSON.stringify(budgets),
      LESSOR_HOSTS: JSON.stringify({ main: "postgres://admin:s3cret-pw@127.0.0.1:5432/postgres" }),
      LESSOR_ADMIN_KEY: "unit-admin",
      LESSOR_SEAL_KEY: "unit-seal",
      LESSOR_KEY_MAC_KEYS: btoa(String.fromCharCode(...new Uint8Array(32).fill(5))),
    };
    return vars as unknown as Env;
  }

  function refusal(env: Env): string {
    try {
      loadConfig(env);
    } catch (error) {
      if (error instanceof LessorError) {
        expect(error.code).toBe("misconfigured");
        return error.message;
      }
      throw error;
    }
    throw new Error("loadConfig accepted the configuration");
  }

  it("is off unless a host's budget turns it on, with the defaults or its own settings", () => {
    const off = loadConfig(fakeEnv({ main: { connections: 20 } }));
    expect(off.hosts.get("main")?.adaptive).toBeNull();
    const defaults = loadConfig(fakeEnv({ main: { connections: 20, adaptive: true } }));
    expect(defaults.hosts.get("main")?.adaptive).toEqual({ floor: 1, growthStep: 1, windowMs: 60_000 });
    const own = loadConfig(fakeEnv({ "*": { connections: 20, adaptive: { floor: 2, windowMs: 5_000 } } }));
    expect(own.hosts.get("main")?.adaptive).toEqual({ floor: 2, growthStep: 1, windowMs: 5_000 });
    expect(
      loadConfig(fakeEnv({ main: { connections: 20, adaptive: false } })).hosts.get("main")?.adaptive,
    ).toBeNull();
  });

  it("reads a tier as a size, or as a size and a maximum", () => {
    const config = loadConfig(
      fakeEnv({ main: { connections: 20 } }, { free: 2, elastic: { size: 1, max: 6 } }),
    );
    expect(config.poolSizes.get("free")).toBe(2);
    expect(config.poolStartSizes.get("free")).toBe(2);
    expect(config.poolSizes.get("elastic")).toBe(6);
    expect(config.poolStartSizes.get("elastic")).toBe(1);
    // `max` defaults to `size`.
    const same = loadConfig(fakeEnv({ main: { connections: 20 } }, { standard: { size: 3 } }));
    expect(same.poolSizes.get("standard")).toBe(3);
  });

  it("refuses bad settings with a message that names the setting and the problem", () => {
    const budget = (adaptive: unknown) => fakeEnv({ main: { connections: 20, adaptive } });
    expect(refusal(budget("yes"))).toMatch(/LESSOR_BUDGETS: host main: adaptive must be true, false, or/);
    expect(refusal(budget({ floor: 0 }))).toMatch(/adaptive\.floor must be a whole number from 1 to 32/);
    expect(refusal(budget({ floor: 33 }))).toMatch(/adaptive\.floor must be a whole number from 1 to 32/);
    expect(refusal(budget({ growthStep: 1.5 }))).toMatch(/adaptive\.growthStep must be a whole number/);
    expect(refusal(budget({ windowMs: 10 }))).toMatch(/adaptive\.windowMs must be a whole number from 1000/);
    expect(refusal(budget({ window: 1000 }))).toMatch(/adaptive has an unknown field \(window\)/);
    expect(refusal(fakeEnv({ main: { connections: 20, adaptiv: true } }))).toMatch(
      /LESSOR_BUDGETS: host main has unknown fields \(adaptiv\)/,
    );
    const tiers = (poolSizes: unknown) => fakeEnv({ main: { connections: 20 } }, poolSizes);
    expect(refusal(tiers({ a: "big" }))).toMatch(/LESSOR_POOL_SIZES: tier a must be a pool size, or/);
    expect(refusal(tiers({ a: { size: 3, max: 2 } }))).toMatch(
      /tier a: max \(2\) is smaller than size \(3\)/,
    );
    expect(refusal(tiers({ a: { size: 1, max: 33 } }))).toMatch(
      /tier a: max must be a whole number from 1 to 32/,
    );
    expect(refusal(tiers({ a: { max: 4 } }))).toMatch(/tier a: size must be a whole number/);
    expect(refusal(tiers({ a: { size: 1, maximum: 4 } }))).toMatch(/tier a has unknown fields \(maximum\)/);
    // A budget must still hold the largest tier's maximum.
    expect(refusal(fakeEnv({ main: { connections: 6, reserve: 2 } }, { a: { size: 1, max: 6 } }))).toMatch(
      /smaller than the largest pool \(6\)/,
    );
  });
});

describe("the eviction dry run on an adaptive host", () => {
  it("reports the shrinks a real admission would make before any eviction", () => {
    const held = [
      pool("idle", { size: 6, idleSince: 500 }),
      pool("busy", { size: 5, leases: 5, recentPeak: 5, idleSince: null }),
      pool("fixed", { size: 5, floor: null, idleSince: 100 }),
    ];
    const budget = { connections: usedConnections(held) + 2, reserve: 2 };
    const small = evictionDryRun(held, budget, 3);
    expect(small.outcome).toBe("shrinks");
    expect(small.pools[0]).toMatchObject({
      verdict: "shrink",
      order: 1,
      take: 3,
      allocation: { tenantId: "idle" },
    });
    expect(small.pools.filter((p) => p.verdict === "evict")).toEqual([]);
    const big = evictionDryRun(held, budget, 8);
    expect(big.outcome).toBe("evicts");
    expect(
      big.pools.filter((p) => p.verdict === "shrink" || p.verdict === "evict").map((p) => p.verdict),
    ).toEqual(["shrink", "evict"]);
    expect(evictionDryRun(held, budget, 20).outcome).toBe("saturated");
  });
});
