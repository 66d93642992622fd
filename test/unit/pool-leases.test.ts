/**
 * The pool's lease book (src/tenant-object/pool/leases.ts): each promise on its own, then a model
 * driven through long random sequences of takes, releases (repeated and forged ones among them),
 * sweeps and rotation switches (seeded, bounded), checked after every step against a plain record
 * of what is held: the count is exactly the leases taken and not yet released or reclaimed, a
 * lease is reclaimed only once overdue and only once, no id is given twice, and a wait for no
 * lease settles true exactly when the current generation holds none.
 */
import { describe, expect, it } from "vitest";
import { LeaseBook, type LeaseKind } from "../../src/tenant-object/pool/leases.ts";
import { seededRandom as random } from "./seeded-random.ts";

describe("the lease book", () => {
  it("counts each lease once: a second release, or an id never given, changes nothing", () => {
    const book = new LeaseBook();
    const a = book.take("sql", 1, 0, 1_000);
    const b = book.take("session", 1, 0, 1_000);
    expect(a).not.toBe(b);
    expect(book.size).toBe(2);
    expect(book.release(a)).toBe("current");
    expect(book.release(a)).toBeNull();
    expect(book.release(999)).toBeNull();
    expect(book.size).toBe(1);
  });

  it("reclaims only what is overdue, and calls what ends its work", () => {
    const book = new LeaseBook();
    const early = book.take("sql", 1, 0, 100);
    const late = book.take("session", 1, 0, 10_000);
    let abandoned = 0;
    book.onAbandon(early, () => abandoned++);
    expect(book.sweep(99).reclaimed).toEqual([]);
    const swept = book.sweep(100);
    expect(swept.reclaimed.map((l) => l.id)).toEqual([early]);
    expect(swept.currentEmptied).toBe(false);
    swept.reclaimed[0]?.abandon?.();
    expect(abandoned).toBe(1);
    // Reclaimed once: a late release of it changes nothing.
    expect(book.release(early)).toBeNull();
    expect(book.sweep(10_000)).toMatchObject({ currentEmptied: true });
    expect(book.release(late)).toBeNull();
    expect(book.size).toBe(0);
  });

  it("at a rotation's switch, the leases held finish on the retiring generation; new ones count on the new", async () => {
    const book = new LeaseBook();
    const old = book.take("session", 1, 0, 1_000);
    const waiting = book.waitForNone(60_000);
    expect(book.retireCurrent()).toBe(1);
    // Whoever waited for no lease now watches the new generation, which holds none.
    await expect(waiting).resolves.toBe(true);
    expect(book.size).toBe(0);
    const fresh = book.take("sql", 2, 0, 1_000);
    expect(book.retiringSize).toBe(1);
    expect(book.release(old)).toBe("retiring");
    expect(book.retiringSize).toBe(0);
    book.endRetiring();
    expect(book.retiringSize).toBeNull();
    expect(book.release(fresh)).toBe("current");
  });

  it("a wait for no lease settles at the last release, or says false at its bound", async () => {
    const book = new LeaseBook();
    const id = book.take("sql", 1, 0, 1_000);
    const released = book.waitForNone(60_000);
    book.release(id);
    await expect(released).resolves.toBe(true);
    book.take("sql", 1, 0, 1_000);
    await expect(book.waitForNone(5)).resolves.toBe(false);
  });
});

interface ModelLease {
  overdueAt: number;
  where: "current" | "retiring";
}

describe("the lease book against a model, through random sequences", () => {
  for (const seed of [1, 7, 42, 1_337, 2_026, 65_537]) {
    it(`seed ${seed}: the count, the reclaims and the waits agree with the model at every step`, async () => {
      const next = random(seed);
      const book = new LeaseBook();
      const model = new Map<number, ModelLease>();
      const given = new Set<number>();
      const everGiven: number[] = [];
      let retiring = false;
      let now = 0;
      let generation = 1;
      const waits: { promise: Promise<boolean>; settled: boolean | null }[] = [];
      const count = (where: ModelLease["where"]) =>
        [...model.values()].filter((l) => l.where === where).length;
      for (let step = 0; step < 2_000; step++) {
        now += Math.floor(next() * 50);
        const roll = next();
        if (roll < 0.4) {
          const kind: LeaseKind = next() < 0.5 ? "sql" : "session";
          const bound = 20 + Math.floor(next() * 400);
          const id = book.take(kind, generation, now, bound);
          expect(given.has(id)).toBe(false);
          given.add(id);
          everGiven.push(id);
          model.set(id, { overdueAt: now + bound, where: "current" });
        } else if (roll < 0.75) {
          // A release of a held lease, a repeated one, or one never given.
          const pick = next();
          const id =
            pick < 0.8 && everGiven.length > 0
              ? (everGiven[Math.floor(next() * everGiven.length)] as number)
              : 1_000_000 + step;
          const expected = model.get(id)?.where ?? null;
          expect(book.release(id)).toBe(expected);
          model.delete(id);
        } else if (roll < 0.9) {
          const swept = book.sweep(now);
          const due = [...model.entries()].filter(([, l]) => l.overdueAt <= now).map(([id]) => id);
          expect(swept.reclaimed.map((l) => l.id).sort((a, b) => a - b)).toEqual(due.sort((a, b) => a - b));
          for (const lease of swept.reclaimed) expect(lease.overdueAt).toBeLessThanOrEqual(now);
          const currentBefore = count("current");
          for (const id of due) model.delete(id);
          expect(swept.currentEmptied).toBe(currentBefore > 0 && count("current") === 0);
          if (retiring) expect(swept.retiringEmpty).toBe(count("retiring") === 0);
        } else if (roll < 0.95) {
          // A rotation's switch; the previous retiring generation must have ended first.
          if (retiring) {
            for (const [id, lease] of model) if (lease.where === "retiring") model.delete(id);
            book.endRetiring();
          }
          expect(book.retireCurrent()).toBe(count("current"));
          for (const lease of model.values()) lease.where = "retiring";
          retiring = true;
          generation++;
        } else {
          const wait = { promise: book.waitForNone(60_000), settled: null as boolean | null };
          wait.promise.then((value) => {
            wait.settled = value;
          });
          waits.push(wait);
        }
        expect(book.size).toBe(count("current"));
        expect(book.retiringSize).toBe(retiring ? count("retiring") : null);
        await Promise.resolve();
        await Promise.resolve();
        // A wait settles once, true, and only when the current generation held none.
        for (const wait of waits.splice(0)) {
          if (wait.settled === null) {
            expect(count("current")).toBeGreaterThan(0);
            waits.push(wait);
          } else expect(wait.settled).toBe(true);
        }
      }
    });
  }
});
