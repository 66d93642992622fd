/**
 * What a refused start means, decided once (src/core/start-refusal.ts): the lifecycle's reason and
 * the caller's code with its retry hint, for every answer the budget can give.
 */
import { describe, expect, it } from "vitest";
import { startRefusal } from "../../src/core/start-refusal.ts";

describe("a refused start", () => {
  it("no answer from the budget (its object restarted mid-call): retry in a second, as saturation", () => {
    expect(startRefusal({ kind: "unanswered" })).toEqual({
      reason: "budget_unavailable",
      code: "capacity_saturated",
      retryAfterSeconds: 1,
    });
  });

  it("an erase's closed gate is tenant_erasing, whatever else the answer says", () => {
    expect(
      startRefusal({ kind: "refused", retryAfterMs: 200, closed: true, unfit: "createdb", tunnel: "full" }),
    ).toEqual({ reason: "tenant_erasing", code: "tenant_erasing", retryAfterSeconds: 5 });
  });

  it("an unfit host says what its admin lacks; a tunnel says its fault; the rest is saturation", () => {
    expect(startRefusal({ kind: "refused", retryAfterMs: 30_000, unfit: "event_trigger" })).toEqual({
      reason: "host_unfit",
      code: "host_unfit",
      retryAfterSeconds: 30,
      missing: "event_trigger",
    });
    for (const fault of ["full", "slow", "down"] as const) {
      expect(startRefusal({ kind: "refused", retryAfterMs: 1_500, tunnel: fault })).toEqual({
        reason: `tunnel_${fault}`,
        code: "tunnel_unavailable",
        retryAfterSeconds: 1.5,
        fault,
      });
    }
    expect(startRefusal({ kind: "refused", retryAfterMs: 250 })).toEqual({
      reason: "capacity_saturated",
      code: "capacity_saturated",
      retryAfterSeconds: 0.25,
    });
  });
});
