import { describe, expect, it } from "vitest";
import {
  type Allocation,
  type BudgetLimits,
  evictionCandidates,
  evictionDryRun,
  notEvictableReason,
  planEviction,
} from "../../src/core/budget.ts";

const limits: BudgetLimits = { connections: 27, reserve: 2 };

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
    ...overrides,
  };
}

describe("evictionDryRun", () => {
  it("fits without evicting anything while there is room", () => {
    const report = evictionDryRun([pool("a"), pool("b")], limits, 5);
    expect(report.outcome).toBe("fits");
    expect(report.pools.filter((p) => p.verdict === "evict")).toEqual([]);
    expect(report.pools.map((p) => p.verdict)).toEqual(["eligible_not_needed", "eligible_not_needed"]);
  });

  it("names the victims in eviction order and says why every other pool is spared", () => {
    const held = [
      pool("recent", { idleSince: 9_000 }),
      pool("oldest", { idleSince: 1_000 }),
      pool("leased", { leases: 2, idleSince: null }),
      pool("pinned", { pinned: true, leases: 1 }),
      pool("migrating", { migrating: true }),
    ];
    // 25 used of 25: a pool of 5 needs one victim, the least recently used.
    const report = evictionDryRun(held, limits, 5);
    expect(report.outcome).toBe("evicts");
    expect(report.used).toBe(25);
    expect(
      report.pools.map((p) => [
        p.allocation.tenantId,
        p.verdict,
        p.verdict === "evict" ? p.order : p.verdict === "not_eligible" ? p.reason : "",
      ]),
    ).toEqual([
      ["oldest", "evict", 1],
      ["recent", "eligible_not_needed", ""],
      ["leased", "not_eligible", "leased"],
      ["pinned", "not_eligible", "pinned"],
      ["migrating", "not_eligible", "migrating"],
    ]);
  });

  it("reports saturation when evicting every eligible pool would not make room", () => {
    const held = [
      pool("starting", { phase: "reserved", idleSince: null }),
      pool("leased", { leases: 1, idleSince: null }),
      pool("busy", { idleSince: null }),
      pool("a", { size: 2 }),
      pool("pinned", { pinned: true }),
    ];
    const report = evictionDryRun(held, limits, 6);
    expect(report.outcome).toBe("saturated");
    expect(report.pools.filter((p) => p.verdict === "evict")).toEqual([]);
    expect(report.pools.find((p) => p.allocation.tenantId === "a")?.verdict).toBe("eligible_not_needed");
    const reasons = Object.fromEntries(
      report.pools.flatMap((p) => (p.verdict === "not_eligible" ? [[p.allocation.tenantId, p.reason]] : [])),
    );
    expect(reasons).toEqual({ starting: "starting", leased: "leased", busy: "not_idle", pinned: "pinned" });
  });

  it("counts draining pools as capacity on its way back, as a real admission does", () => {
    const held = [
      pool("draining", { phase: "draining", idleSince: null }),
      pool("b"),
      pool("c"),
      pool("d"),
      pool("e"),
    ];
    const report = evictionDryRun(held, limits, 5);
    expect(report.draining).toBe(5);
    expect(report.outcome).toBe("fits");
    expect(report.pools.find((p) => p.allocation.tenantId === "draining")).toMatchObject({
      verdict: "not_eligible",
      reason: "draining",
    });
  });

  it("agrees with planEviction and evictionCandidates on any ledger, and accounts for each pool once", () => {
    // A deterministic sweep over many small ledgers instead of a property-testing dependency.
    let seed = 7;
    const next = (n: number) => {
      seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648;
      return seed % n;
    };
    const phases = ["reserved", "allocated", "draining"] as const;
    for (let round = 0; round < 500; round++) {
      const allocations: Allocation[] = Array.from({ length: next(7) }, (_, i) =>
        pool(`t${i}`, {
          size: 1 + next(6),
          phase: phases[next(3)] ?? "allocated",
          leases: next(3) === 0 ? 1 : 0,
          idleSince: next(4) === 0 ? null : 1 + next(10_000),
          pinned: next(5) === 0,
          migrating: next(6) === 0,
        }),
      );
      const size = 1 + next(6);
      const report = evictionDryRun(allocations, limits, size);
      const plan = planEviction(allocations, limits, size);
      expect(report.pools.filter((p) => p.verdict === "evict").map((p) => p.allocation)).toEqual(plan ?? []);
      expect(report.outcome === "saturated").toBe(plan === null);
      expect(report.pools).toHaveLength(allocations.length);
      const eligible = new Set(evictionCandidates(allocations).map((a) => a.tenantId));
      for (const a of allocations) expect(notEvictableReason(a) === null).toBe(eligible.has(a.tenantId));
    }
  });
});
