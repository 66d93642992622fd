import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import {
  type Allocation,
  type BudgetLimits,
  evictionCandidates,
  fits,
  planEviction,
  poolCapacity,
  usedConnections,
  validateLimits,
} from "../../src/core/budget.ts";
import { LessorError } from "../../src/errors/index.ts";

const limits: BudgetLimits = { connections: 12, reserve: 2 };

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

describe("fits", () => {
  it("counts every phase and keeps the reserve out of reach", () => {
    expect(poolCapacity(limits)).toBe(10);
    expect(fits([], limits, 10)).toBe(true);
    expect(fits([], limits, 11)).toBe(false);
    const held = [pool("a", { phase: "reserved" }), pool("b", { phase: "draining", size: 2 })];
    expect(usedConnections(held)).toBe(7);
    expect(fits(held, limits, 3)).toBe(true);
    expect(fits(held, limits, 4)).toBe(false);
  });

  it("refuses anything once the pools fill the budget exactly", () => {
    const full = [pool("a"), pool("b")];
    expect(fits(full, limits, 1)).toBe(false);
    expect(fits(full, limits, 0)).toBe(true);
  });
});

describe("evictionCandidates", () => {
  it("orders idle pools least recently used first", () => {
    const candidates = evictionCandidates([
      pool("recent", { idleSince: 3_000 }),
      pool("oldest", { idleSince: 1_000 }),
      pool("middle", { idleSince: 2_000 }),
    ]);
    expect(candidates.map((a) => a.tenantId)).toEqual(["oldest", "middle", "recent"]);
  });

  it("never offers a leased, pinned, migrating, reserved or draining pool, nor one with no idle time", () => {
    const never = [
      pool("leased", { leases: 1, idleSince: 1 }),
      pool("pinned", { pinned: true, idleSince: 1 }),
      pool("migrating", { migrating: true, idleSince: 1 }),
      pool("reserved", { phase: "reserved", idleSince: 1 }),
      pool("draining", { phase: "draining", idleSince: 1 }),
      pool("busy", { idleSince: null }),
    ];
    expect(evictionCandidates(never)).toEqual([]);
    const idle = pool("idle", { idleSince: 9_999 });
    expect(evictionCandidates([...never, idle])).toEqual([idle]);
  });

  it("never offers the tenant that is asking for room", () => {
    const all = [pool("asker", { idleSince: 1 }), pool("other", { idleSince: 2 })];
    expect(evictionCandidates(all, "asker").map((a) => a.tenantId)).toEqual(["other"]);
  });

  it("does not reorder or change its input", () => {
    const input = [pool("b", { idleSince: 2 }), pool("a", { idleSince: 1 })];
    const copy = structuredClone(input);
    evictionCandidates(input);
    expect(input).toEqual(copy);
  });
});

describe("planEviction", () => {
  it("evicts nothing when the pool fits", () => {
    expect(planEviction([pool("a")], limits, 5)).toEqual([]);
    expect(planEviction([], limits, 10)).toEqual([]);
  });

  it("takes the fewest least recently used pools that make room", () => {
    const allocations = [
      pool("c", { size: 2, idleSince: 3 }),
      pool("a", { size: 2, idleSince: 1 }),
      pool("b", { size: 2, idleSince: 2 }),
      pool("d", { size: 2, idleSince: 4 }),
      pool("e", { size: 2, idleSince: 5 }),
    ];
    // 10 of 10 used: a pool of 3 needs two pools of 2, the two oldest.
    expect(planEviction(allocations, limits, 3)?.map((a) => a.tenantId)).toEqual(["a", "b"]);
    expect(planEviction(allocations, limits, 2)?.map((a) => a.tenantId)).toEqual(["a"]);
    expect(planEviction(allocations, limits, 10)?.map((a) => a.tenantId)).toEqual(["a", "b", "c", "d", "e"]);
  });

  it("skips pools that may not be evicted, even when they are the oldest", () => {
    const allocations = [
      pool("leased", { idleSince: 1, leases: 2 }),
      pool("pinned", { size: 1, idleSince: 1, pinned: true }),
      pool("migrating", { size: 1, idleSince: 1, migrating: true }),
      pool("idle", { size: 3, idleSince: 50 }),
    ];
    expect(planEviction(allocations, limits, 3)?.map((a) => a.tenantId)).toEqual(["idle"]);
  });

  it("is null when even every candidate would not make room", () => {
    const allocations = [pool("leased", { leases: 1 }), pool("idle", { size: 4, idleSince: 1 })];
    // 9 of 10 used, 1 free: a pool of 6 needs 5 back, the only candidate gives 4.
    expect(planEviction(allocations, limits, 6)).toBeNull();
    expect(planEviction([pool("a", { pinned: true }), pool("b", { migrating: true })], limits, 1)).toBeNull();
  });

  it("counts draining pools as capacity already on its way back", () => {
    const allocations = [pool("draining", { phase: "draining" }), pool("idle", { idleSince: 1 })];
    expect(planEviction(allocations, limits, 5)).toEqual([]);
    expect(planEviction(allocations, limits, 6)?.map((a) => a.tenantId)).toEqual(["idle"]);
  });

  it("never plans to evict the asking tenant's own older generation", () => {
    const allocations = [pool("asker", { idleSince: 1 }), pool("other", { idleSince: 2 })];
    expect(planEviction(allocations, limits, 5, "asker")?.map((a) => a.tenantId)).toEqual(["other"]);
    expect(
      planEviction([pool("asker", { idleSince: 1 }), pool("x", { leases: 1 })], limits, 5, "asker"),
    ).toBeNull();
  });
});

describe("validateLimits", () => {
  it("accepts a budget that holds the largest pool exactly", () => {
    expect(validateLimits({ connections: 12, reserve: 2 }, 10)).toBeNull();
    expect(validateLimits({ connections: 7, reserve: 1 }, 6)).toBeNull();
  });

  it("refuses a budget smaller than one pool, saying by how much", () => {
    expect(validateLimits({ connections: 12, reserve: 8 }, 5)).toBe(
      "connections minus reserve (4) is smaller than the largest pool (5)",
    );
    expect(validateLimits({ connections: 5, reserve: 1 }, 5)).toMatch(/smaller than the largest pool/);
  });

  it("refuses connections and reserves that are not whole, or out of range", () => {
    for (const connections of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(validateLimits({ connections, reserve: 1 }, 1)).toBe("connections must be a positive integer");
    }
    // No reserve at all is refused too: migrations and provisioning would have nowhere to run.
    for (const reserve of [-1, 0, 0.5, Number.NaN]) {
      expect(validateLimits({ connections: 10, reserve }, 1)).toMatch(/^reserve must be a positive integer/);
    }
  });
});

describe("loadConfig and the budget", () => {
  function fakeEnv(budgets: unknown, poolSizes: unknown = { free: 2, standard: 5, pro: 6 }): Env {
    const vars = {
      LESSOR_POOL_SIZES: JSON.stringify(poolSizes),
      LESSOR_BUDGETS: JSON.stringify(budgets),
      LESSOR_HOSTS: JSON.stringify({ main: "postgres://admin:s3cret-pw@127.0.0.1:5432/postgres" }),
      LESSOR_ADMIN_KEY: "unit-admin",
      LESSOR_SEAL_KEY: "unit-seal",
      LESSOR_KEY_MAC_KEYS: btoa(String.fromCharCode(...new Uint8Array(32).fill(5))),
    };
    // Only the settings loadConfig reads; the bindings it never touches stay absent.
    return vars as unknown as Env;
  }

  function refusal(env: Env): LessorError {
    try {
      loadConfig(env);
    } catch (error) {
      if (error instanceof LessorError) return error;
      throw error;
    }
    throw new Error("loadConfig accepted the configuration");
  }

  it("refuses a budget smaller than one pool at configuration time, naming LESSOR_BUDGETS", () => {
    // The largest pool is 6 (pro); 8 connections minus a reserve of 4 leaves room for 4.
    const error = refusal(fakeEnv({ main: { connections: 8, reserve: 4 } }));
    expect(error.code).toBe("misconfigured");
    expect(error.message).toContain("LESSOR_BUDGETS");
    expect(error.message).toContain("main");
    expect(error.message).toMatch(/smaller than the largest pool \(6\)/);
    // The setting is named, its secrets are not.
    expect(error.message).not.toContain("s3cret-pw");
  });

  it("applies the `*` default to hosts without a budget of their own, and refuses it too", () => {
    expect(refusal(fakeEnv({ "*": { connections: 5 } })).message).toContain("LESSOR_BUDGETS");
    expect(refusal(fakeEnv({ other: { connections: 50 } })).message).toMatch(/LESSOR_BUDGETS.*no budget/);
  });

  it("refuses a malformed budget with the same code", () => {
    expect(refusal(fakeEnv({ main: { connections: "lots" } })).code).toBe("misconfigured");
    expect(refusal(fakeEnv({ main: { connections: 20, reserve: -1 } })).message).toContain("LESSOR_BUDGETS");
  });

  it("accepts a budget that holds exactly one largest pool", () => {
    const config = loadConfig(fakeEnv({ main: { connections: 8, reserve: 2 } }));
    expect(config.hosts.get("main")?.budget).toEqual({ connections: 8, reserve: 2 });
    // A smaller tier set shrinks the largest pool: the same budget is then fine.
    // No reserve named: the default reserve of 2 is kept back.
    const small = loadConfig(fakeEnv({ "*": { connections: 7 } }, { free: 2, standard: 5 }));
    expect(small.hosts.get("main")?.budget).toEqual({ connections: 7, reserve: 2 });
  });
});
