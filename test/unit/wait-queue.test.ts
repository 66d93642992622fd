import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { WaitQueue } from "../../src/budget-object/wait-queue.ts";

describe("WaitQueue: the bounded FIFO behind the budget's admissions, rotations and maintenance slots", () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("serves in arrival order and stops at the first head that does not fit, so nobody overtakes it", async () => {
    const queue = new WaitQueue<{ name: string; size: number }, string>(10);
    const answers = ["a", "b", "c"].map((name, i) =>
      queue.wait({ name, size: [1, 5, 1][i] ?? 1 }, 1_000, () => `${name}:timeout`),
    );
    let room = 3;
    const served = queue.serveWhile((item) => {
      if (item.size > room) return null;
      room -= item.size;
      return `${item.name}:granted`;
    });
    expect(served).toBe(1);
    // "c" (size 1) would fit, but "b" (size 5) is first in line.
    expect(queue.length).toBe(2);
    expect(queue.head()).toEqual({ name: "b", size: 5 });
    room = 10;
    expect(queue.serveWhile((item) => `${item.name}:granted`)).toBe(2);
    expect(await Promise.all(answers)).toEqual(["a:granted", "b:granted", "c:granted"]);
  });

  it("a waiter past its own deadline gets the timeout answer and leaves the line; the others stay", async () => {
    const queue = new WaitQueue<string, string>(10);
    const short = queue.wait("short", 100, () => "short:timeout");
    const long = queue.wait("long", 5_000, () => "long:timeout");
    await vi.advanceTimersByTimeAsync(150);
    expect(await short).toBe("short:timeout");
    expect(queue.length).toBe(1);
    expect(queue.head()).toBe("long");
    expect(queue.serveWhile(() => "granted")).toBe(1);
    expect(await long).toBe("granted");
    // Served before its deadline: its timer no longer fires an answer.
    await vi.advanceTimersByTimeAsync(10_000);
    expect(queue.length).toBe(0);
  });

  it("is bounded: full at capacity, and room again once a waiter leaves", async () => {
    const queue = new WaitQueue<number, string>(2);
    expect(queue.full).toBe(false);
    const first = queue.wait(1, 100, () => "timeout");
    void queue.wait(2, 10_000, () => "timeout");
    expect(queue.full).toBe(true);
    await vi.advanceTimersByTimeAsync(100);
    expect(await first).toBe("timeout");
    expect(queue.full).toBe(false);
  });

  it("settleWhere answers matching waiters wherever they stand, and leaves the rest in order", async () => {
    const queue = new WaitQueue<{ tenant: string; n: number }, string>(10);
    const answers = [
      ["t1", 1],
      ["t2", 2],
      ["t1", 3],
      ["t3", 4],
    ].map(([tenant, n]) => queue.wait({ tenant: String(tenant), n: Number(n) }, 1_000, () => "timeout"));
    expect(queue.settleWhere((item) => item.tenant === "t1", "closed")).toBe(2);
    expect(queue.settleWhere((item) => item.tenant === "nobody", "closed")).toBe(0);
    expect(queue.head()).toEqual({ tenant: "t2", n: 2 });
    queue.serveWhile((item) => `granted:${item.n}`);
    expect(await Promise.all(answers)).toEqual(["closed", "granted:2", "closed", "granted:4"]);
  });
});
