import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Deadlines } from "../../src/tenant-object/deadlines.ts";

describe("Deadlines: one timer for every statement's bound", () => {
  beforeEach(() => {
    vi.useFakeTimers({ now: 1_000_000 });
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it("arms one timer however many later deadlines are watched, and watching costs no timer", () => {
    const deadlines = new Deadlines();
    const setTimeoutSpy = vi.spyOn(globalThis, "setTimeout");
    const cancels = Array.from({ length: 100 }, (_, i) =>
      deadlines.watch(Date.now() + 30_000 + i, () => undefined),
    );
    expect(setTimeoutSpy).toHaveBeenCalledTimes(1);
    for (const cancel of cancels) cancel();
    expect(deadlines.size).toBe(0);
    // Unwatching clears nothing: the armed timer fires later and finds nothing to do.
    expect(deadlines.armed).toBe(true);
    vi.advanceTimersByTime(31_000);
    expect(deadlines.armed).toBe(false);
    setTimeoutSpy.mockRestore();
  });

  it("calls each expired deadline once, at its time, and none that was unwatched", () => {
    const deadlines = new Deadlines();
    const fired: string[] = [];
    deadlines.watch(Date.now() + 1_000, () => fired.push("a"));
    const cancelB = deadlines.watch(Date.now() + 2_000, () => fired.push("b"));
    deadlines.watch(Date.now() + 3_000, () => fired.push("c"));
    vi.advanceTimersByTime(999);
    expect(fired).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(fired).toEqual(["a"]);
    cancelB();
    vi.advanceTimersByTime(2_000);
    expect(fired).toEqual(["a", "c"]);
    expect(deadlines.armed).toBe(false);
  });

  it("re-arms earlier for a deadline earlier than the armed one", () => {
    const deadlines = new Deadlines();
    const fired: string[] = [];
    deadlines.watch(Date.now() + 10_000, () => fired.push("late"));
    deadlines.watch(Date.now() + 1_000, () => fired.push("early"));
    vi.advanceTimersByTime(1_000);
    expect(fired).toEqual(["early"]);
    vi.advanceTimersByTime(9_000);
    expect(fired).toEqual(["early", "late"]);
  });

  it("quiesce clears the timer only when nothing is watched", () => {
    const deadlines = new Deadlines();
    const cancel = deadlines.watch(Date.now() + 5_000, () => undefined);
    deadlines.quiesce();
    expect(deadlines.armed).toBe(true);
    cancel();
    deadlines.quiesce();
    expect(deadlines.armed).toBe(false);
  });
});
