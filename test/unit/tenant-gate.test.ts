/** The tenant object's one gate as a table (src/core/tenant-gate.ts, issue 41). */
import { describe, expect, it } from "vitest";
import {
  gateDecision,
  gatePurposes,
  gateTable,
  migrationSkipReason,
  tenantStateOf,
  tenantStates,
} from "../../src/core/tenant-gate.ts";

describe("the gate table", () => {
  it("answers every purpose in every state", () => {
    for (const purpose of gatePurposes) {
      expect(Object.keys(gateTable[purpose]).sort()).toEqual([...tenantStates].sort());
    }
  });

  it("serves everything while serving, and refuses new work with tenant_moved once moved (never tenant_moving)", () => {
    for (const purpose of gatePurposes) expect(gateDecision(purpose, "serving")).toEqual({ kind: "proceed" });
    for (const purpose of ["query", "lease", "rotate", "erase", "move"] as const) {
      expect(gateDecision(purpose, "moved")).toEqual({ kind: "refuse", code: "tenant_moved" });
    }
    expect(gateDecision("budget", "moved")).toEqual({ kind: "forward" });
  });

  it("lets a lease opened before a move's fence finish, and refuses new work behind it", () => {
    expect(gateDecision("lease", "moving")).toEqual({ kind: "proceed" });
    expect(gateDecision("query", "moving")).toEqual({ kind: "refuse", code: "tenant_moving" });
  });

  it("refuses a credential change while erasing, erased, moving or moved (the customer's credential too)", () => {
    expect(gateDecision("rotate", "erasing")).toEqual({ kind: "refuse", code: "tenant_erasing" });
    expect(gateDecision("rotate", "erased")).toEqual({ kind: "refuse", code: "tenant_erased" });
    expect(gateDecision("rotate", "moving")).toEqual({ kind: "refuse", code: "tenant_moving" });
  });

  it("reads the state from the object's gates, a move's only for its own tenant", () => {
    const move = { tenantId: "a", state: "moved" as const };
    expect(tenantStateOf({ move, erase: null }, "a")).toBe("moved");
    expect(tenantStateOf({ move, erase: null }, "b")).toBe("serving");
    expect(tenantStateOf({ move, erase: null }, null)).toBe("moved");
    expect(tenantStateOf({ move: null, erase: { tenantId: "a", state: "erasing" } }, "a")).toBe("erasing");
  });
  it("lets a staged job's runner resume in every state, and a status or cancel through: the job decides", () => {
    for (const state of tenantStates) {
      expect(gateDecision("resume", state)).toEqual({ kind: "proceed" });
      expect(gateDecision("observe", state)).toEqual({ kind: "proceed" });
    }
  });

  it("takes a moved tenant in over a pointer or an erased id, never into a running erase or move", () => {
    expect(gateDecision("move_in", "moved")).toEqual({ kind: "proceed" });
    expect(gateDecision("move_in", "erased")).toEqual({ kind: "proceed" });
    expect(gateDecision("move_in", "erasing")).toEqual({ kind: "refuse", code: "tenant_erasing" });
    expect(gateDecision("move_in", "moving")).toEqual({ kind: "refuse", code: "tenant_moving" });
  });

  it("skips a campaign's migration and a late catalog refresh once an erase closed the gate, saying why", () => {
    expect(gateDecision("migrate", "erasing")).toEqual({ kind: "skip" });
    expect(gateDecision("configure", "erasing")).toEqual({ kind: "skip" });
    // An id created again after its erase committed is a new tenant: it is migrated and configured.
    expect(gateDecision("migrate", "erased")).toEqual({ kind: "proceed" });
    expect(gateDecision("configure", "erased")).toEqual({ kind: "proceed" });
    expect(migrationSkipReason("erasing")).toBe("tenant_erasing");
    expect(migrationSkipReason("moving")).toBe("tenant_moving");
    expect(migrationSkipReason("moved")).toBe("tenant_unknown");
  });

  it("skips an operator drain once an erase or a move owns the pool", () => {
    for (const state of ["erasing", "erased", "moving", "moved"] as const) {
      expect(gateDecision("drain", state)).toEqual({ kind: "skip" });
    }
  });
});
