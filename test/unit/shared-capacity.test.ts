/**
 * The shared capacity of a generation's two kinds of connection (src/core/shared-capacity.ts):
 * each decision on its own, then a model of the two driver pools driven through long random
 * sequences of checkouts, releases and give-backs (seeded, bounded), with the promises checked after
 * every step: never more connections than the maximum, never a leased connection closed, every
 * lease released exactly once.
 */
import { describe, expect, it } from "vitest";
import {
  checkoutStep,
  freeIdle,
  giveBackAmount,
  giveBackFrom,
  keptAfterGiveBack,
  type SideCounts,
} from "../../src/core/shared-capacity.ts";
import { seededRandom as random } from "./seeded-random.ts";

const side = (total: number, idle: number, claimed = 0): SideCounts => ({ total, idle, claimed });

describe("the decisions", () => {
  it("takes a free idle connection of its own kind, or opens one while the two kinds are under the maximum", () => {
    expect(checkoutStep(side(3, 1), side(2, 0), 0, 6)).toBe("take");
    expect(checkoutStep(side(3, 0), side(2, 0), 0, 6)).toBe("take");
    // At the maximum, counting a connection being closed.
    expect(checkoutStep(side(3, 0), side(2, 0), 1, 6)).toBe("wait");
  });

  it("closes an idle connection of the other kind to make room, never a leased one", () => {
    expect(checkoutStep(side(3, 0), side(3, 1), 0, 6)).toBe("close_other");
    // The other kind's idle connection is claimed by its own checkout: nothing to close.
    expect(checkoutStep(side(3, 0), side(3, 1, 1), 0, 6)).toBe("wait");
    expect(checkoutStep(side(4, 0), side(2, 0), 0, 6)).toBe("wait");
  });

  it("never counts twice on one idle connection: a claimed one makes the next checkout wait, not open", () => {
    expect(freeIdle(side(5, 1, 1))).toBe(0);
    expect(checkoutStep(side(5, 1, 1), side(0, 0), 0, 6)).toBe("wait");
  });

  it("gives back up to what is asked, never below the floor, and keeps what was checked out meanwhile", () => {
    expect(giveBackAmount(3, 6, 2)).toBe(3);
    expect(giveBackAmount(5, 6, 2)).toBe(4);
    expect(giveBackAmount(1, 2, 2)).toBe(0);
    expect(giveBackAmount(1, 1, 2)).toBe(0);
    expect(giveBackFrom(side(3, 1), side(2, 1))).toBe("tenant");
    expect(giveBackFrom(side(3, 1, 1), side(2, 1))).toBe("jwt");
    expect(giveBackFrom(side(3, 0), null)).toBeNull();
    // Lowered by 3 to 3; 5 are still open (2 checked out meanwhile): 2 of the 3 are kept.
    expect(keptAfterGiveBack(3, 5, 3)).toBe(2);
    expect(keptAfterGiveBack(3, 3, 3)).toBe(0);
    expect(keptAfterGiveBack(1, 9, 3)).toBe(1);
  });
});

type Kind = "tenant" | "jwt";

/** Two driver pools as counts, with the leases each holds; the model the decisions drive. */
class Model {
  readonly leased: Record<Kind, number[]> = { tenant: [], jwt: [] };
  readonly idle: Record<Kind, number> = { tenant: 0, jwt: 0 };
  private nextLease = 1;
  readonly released = new Set<number>();
  waits = 0;

  constructor(public max: number) {}

  counts(kind: Kind): SideCounts {
    return { total: this.leased[kind].length + this.idle[kind], idle: this.idle[kind], claimed: 0 };
  }

  open(): number {
    return this.counts("tenant").total + this.counts("jwt").total;
  }

  checkout(kind: Kind): void {
    const other: Kind = kind === "tenant" ? "jwt" : "tenant";
    // Bounded as the pool's loop is: each pass takes, closes one, or waits.
    for (let pass = 0; pass < 2 * this.max + 2; pass++) {
      const step = checkoutStep(this.counts(kind), this.counts(other), 0, this.max);
      if (step === "take") {
        if (this.idle[kind] > 0) this.idle[kind]--;
        this.leased[kind].push(this.nextLease++);
        return;
      }
      if (step === "close_other") {
        expect(this.idle[other], "closes only an idle connection").toBeGreaterThan(0);
        this.idle[other]--;
        continue;
      }
      this.waits++;
      return;
    }
    throw new Error("checkout did not settle");
  }

  release(kind: Kind, pick: number): void {
    const leases = this.leased[kind];
    if (leases.length === 0) return;
    const [lease] = leases.splice(Math.floor(pick * leases.length), 1);
    if (lease === undefined) return;
    expect(this.released.has(lease), `lease ${lease} released twice`).toBe(false);
    this.released.add(lease);
    this.idle[kind]++;
  }

  giveBack(want: number, lowest: number): void {
    const lowered = giveBackAmount(want, this.max, lowest);
    if (lowered === 0) return;
    this.max -= lowered;
    for (let pass = 0; pass < lowered + 12 && this.open() > this.max; pass++) {
      const from = giveBackFrom(this.counts("tenant"), this.counts("jwt"));
      if (from === null) break;
      this.idle[from]--;
    }
    // What is still open past the lowered maximum is leased: the maximum keeps it.
    this.max += keptAfterGiveBack(lowered, this.open(), this.max);
  }

  grow(by: number, ceiling: number): void {
    this.max = Math.min(ceiling, this.max + by);
  }
}

describe("the two kinds under random traffic", () => {
  it("never hold more than the maximum, never close a leased connection, release every lease once", () => {
    for (let seed = 1; seed <= 200; seed++) {
      const next = random(seed);
      const model = new Model(1 + Math.floor(next() * 6));
      for (let step = 0; step < 400; step++) {
        const kind: Kind = next() < 0.5 ? "tenant" : "jwt";
        const roll = next();
        if (roll < 0.45) model.checkout(kind);
        else if (roll < 0.9) model.release(kind, next());
        else if (roll < 0.95) model.giveBack(1 + Math.floor(next() * 3), 1);
        else model.grow(1, 6);
        const leased = model.leased.tenant.length + model.leased.jwt.length;
        expect(model.open(), `seed ${seed}, step ${step}`).toBeLessThanOrEqual(Math.max(model.max, leased));
        if (model.max >= leased) expect(model.open()).toBeLessThanOrEqual(model.max);
        expect(model.idle.tenant).toBeGreaterThanOrEqual(0);
        expect(model.idle.jwt).toBeGreaterThanOrEqual(0);
      }
    }
  });

  it("a checkout waits only when every connection of the maximum is leased (no room left unused)", () => {
    for (let seed = 1; seed <= 100; seed++) {
      const next = random(seed);
      const model = new Model(2 + Math.floor(next() * 5));
      for (let step = 0; step < 200; step++) {
        const kind: Kind = next() < 0.5 ? "tenant" : "jwt";
        if (next() < 0.6) {
          const waitsBefore = model.waits;
          const leasedBefore = model.leased.tenant.length + model.leased.jwt.length;
          model.checkout(kind);
          if (model.waits > waitsBefore)
            expect(leasedBefore, `seed ${seed}`).toBeGreaterThanOrEqual(model.max);
        } else {
          model.release(kind, next());
        }
      }
    }
  });
});
