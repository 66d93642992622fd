/**
 * The bound on an object's connections opening at once (src/postgres/opening-gate.ts): never more
 * than its limit inside, places handed on in order, each given back once, whatever the order in
 * which opens finish or fail.
 */
import { describe, expect, it } from "vitest";
import { maxOpeningAtOnce, OpeningGate } from "../../src/postgres/opening-gate.ts";

describe("the opening gate", () => {
  it("is the platform's six by default", () => {
    expect(maxOpeningAtOnce).toBe(6);
    expect(new OpeningGate()).toMatchObject({ peak: 0, size: 0 });
  });

  it("lets in at most its limit; the next waits in order and enters when one leaves", async () => {
    const gate = new OpeningGate(2);
    const a = await gate.enter();
    const b = await gate.enter();
    const order: string[] = [];
    const entered = (name: string) =>
      gate.enter().then((leave) => {
        order.push(name);
        return leave;
      });
    const c = entered("c");
    const d = entered("d");
    await Promise.resolve();
    expect(order).toEqual([]);
    expect(gate.size).toBe(2);
    b();
    b(); // a second leave changes nothing
    const leaveC = await c;
    expect(order).toEqual(["c"]);
    expect(gate.size).toBe(2);
    a();
    const leaveD = await d;
    expect(order).toEqual(["c", "d"]);
    leaveC();
    leaveD();
    expect(gate.size).toBe(0);
    expect(gate.peak).toBe(2);
  });

  it("24 opens that finish in any order never have more than six inside", async () => {
    const gate = new OpeningGate();
    let inside = 0;
    let most = 0;
    const opens = Array.from({ length: 24 }, async (_, i) => {
      const leave = await gate.enter();
      inside++;
      most = Math.max(most, inside);
      await new Promise((resolve) => setTimeout(resolve, (i * 7) % 5));
      inside--;
      leave();
    });
    await Promise.all(opens);
    expect(most).toBe(6);
    expect(gate.peak).toBe(6);
    expect(gate.size).toBe(0);
  });
});
