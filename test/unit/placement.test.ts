/** Where objects are created (src/core/placement.ts), and how a restarted fleet comes back. */
import { describe, expect, it } from "vitest";
import { placementOptions, restartJitterMs } from "../../src/core/placement.ts";

describe("placementOptions", () => {
  it("asks for the host's region when it names one, and for nothing otherwise", () => {
    expect(placementOptions("weur")).toEqual({ locationHint: "weur" });
    expect(placementOptions(null)).toEqual({});
  });
});

describe("restartJitterMs", () => {
  it("spreads restarts over at most a quarter of the admission wait, and never more than half a second", () => {
    expect(restartJitterMs(0, 2_000)).toBe(0);
    expect(restartJitterMs(0.5, 2_000)).toBe(250);
    expect(restartJitterMs(0.999_999_9, 2_000)).toBeLessThan(500);
    expect(restartJitterMs(0.99, 60_000)).toBeLessThan(500);
    expect(restartJitterMs(0.99, 400)).toBeLessThan(100);
    // Out-of-range randomness is clamped, not trusted.
    expect(restartJitterMs(-1, 2_000)).toBe(0);
    expect(restartJitterMs(7, 2_000)).toBeLessThan(500);
  });
});
