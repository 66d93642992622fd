/** The move between regions as pure decisions (src/core/move.ts, docs/adr/023-regions.md). */
import { describe, expect, it } from "vitest";
import {
  fencedAt,
  type MoveRequestFacts,
  moveRequestDecision,
  moveRetryDelay,
  moveStageAfter,
  moveStages,
} from "../../src/core/move.ts";

const facts: MoveRequestFacts = {
  from: "us",
  to: "eu",
  targetKnown: true,
  status: "active",
  takenInTarget: false,
  pinned: false,
  migrating: false,
  force: false,
};

describe("the move's order", () => {
  it("drains before it copies, copies before it switches, and the old object is fenced until the switch is recorded", () => {
    expect([...moveStages]).toEqual(["drain", "copy", "switch", "start", "cleanup", "commit"]);
    expect(moveStageAfter("drain")).toBe("copy");
    expect(moveStageAfter("cleanup")).toBe("commit");
    expect(moveStageAfter("commit")).toBeNull();
    expect(moveStages.filter(fencedAt)).toEqual(["drain", "copy", "switch"]);
  });
});

describe("whether a move may start", () => {
  it("starts an active or disabled tenant's move, and answers a running one", () => {
    expect(moveRequestDecision(facts)).toEqual({ kind: "start" });
    expect(moveRequestDecision({ ...facts, status: "disabled" })).toEqual({ kind: "start" });
    expect(moveRequestDecision({ ...facts, status: "moving" })).toEqual({ kind: "running" });
  });

  it("refuses each case with its own code", () => {
    const refuse = (code: string) => ({ kind: "refuse", code });
    expect(moveRequestDecision({ ...facts, targetKnown: false })).toEqual(refuse("region_unknown"));
    expect(moveRequestDecision({ ...facts, to: "us" })).toEqual(refuse("move_same_region"));
    expect(moveRequestDecision({ ...facts, status: null })).toEqual(refuse("tenant_not_found"));
    expect(moveRequestDecision({ ...facts, status: "provisioning" })).toEqual(refuse("tenant_not_found"));
    expect(moveRequestDecision({ ...facts, status: "erasing" })).toEqual(refuse("tenant_erasing"));
    expect(moveRequestDecision({ ...facts, status: "moved" })).toEqual(refuse("tenant_moved"));
    expect(moveRequestDecision({ ...facts, takenInTarget: true })).toEqual(refuse("tenant_exists"));
    expect(moveRequestDecision({ ...facts, pinned: true })).toEqual(refuse("tenant_pinned"));
    expect(moveRequestDecision({ ...facts, pinned: true, force: true })).toEqual({ kind: "start" });
    expect(moveRequestDecision({ ...facts, migrating: true })).toEqual(refuse("tenant_migrating"));
  });

  it("backs off from half a second, doubling to five minutes at most", () => {
    expect(moveRetryDelay(1, 0)).toBe(500);
    expect(moveRetryDelay(1, 0.999)).toBeLessThanOrEqual(1_000);
    expect(moveRetryDelay(4, 0.999)).toBeLessThanOrEqual(8_000);
    expect(moveRetryDelay(40, 1)).toBe(300_000);
  });
});
