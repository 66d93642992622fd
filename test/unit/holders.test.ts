/**
 * The holders policy and the access check as pure functions (src/core/holders.ts, issue 41). The
 * live matrix is test/integration/holders.test.ts (and test/regions/holders-move.test.ts for moves).
 */
import { describe, expect, it } from "vitest";
import {
  accessRefusal,
  holderKinds,
  holderOperations,
  holderOutcome,
  holderPolicy,
  operationOfRefusal,
} from "../../src/core/holders.ts";

describe("the holders policy (invariant 17)", () => {
  it("has a decision for every operation × kind, and never ends a flight", () => {
    for (const operation of holderOperations) {
      expect(Object.keys(holderPolicy[operation]).sort()).toEqual([...holderKinds].sort());
      expect(["wait", "block", "keep"]).toContain(holderOutcome(operation, "flight").do);
    }
  });

  it("ends every connection holder on erase, disable, revocation, expiry and a move's switch", () => {
    for (const [operation, code] of [
      ["erase", "tenant_erasing"],
      ["disable", "tenant_disabled"],
      ["key_revoked", "key_revoked"],
      ["key_expired", "key_expired"],
      ["move_switch", "tenant_moved"],
      ["drain_forced", "stale_generation"],
    ] as const) {
      for (const kind of ["session_lease", "wire_transaction", "wire_session"] as const) {
        expect(holderOutcome(operation, kind), `${operation} × ${kind}`).toMatchObject({ do: "end", code });
      }
    }
  });

  it("at a move's drain, ends what holds a connection and leaves an idle transaction-mode connection for the switch", () => {
    expect(holderOutcome("move_drain", "wire_session")).toEqual({ do: "end", code: "tenant_moving" });
    expect(holderOutcome("move_drain", "session_lease")).toEqual({ do: "end", code: "tenant_moving" });
    expect(holderOutcome("move_drain", "wire_transaction")).toEqual({
      do: "end",
      code: "tenant_moving",
      leasedOnly: true,
    });
  });

  it("keeps every holder through a rotation, and blocks an eviction while one holds a connection", () => {
    for (const kind of holderKinds) expect(holderOutcome("rotate", kind)).toEqual({ do: "keep" });
    expect(holderOutcome("evict", "session_lease")).toEqual({ do: "block" });
    expect(holderOutcome("evict", "wire_session")).toEqual({ do: "block" });
  });
});

describe("the access check", () => {
  const record = {
    status: "active",
    keys: [
      { keyId: "k_1", expiresAt: null },
      { keyId: "k_2", expiresAt: 1_000 },
    ],
  };

  it("refuses a key the record no longer holds, one past its expiry, and any key of a disabled tenant", () => {
    expect(accessRefusal(record, "k_1", 5_000)).toBeNull();
    expect(accessRefusal(record, "k_2", 999)).toBeNull();
    expect(accessRefusal(record, "k_2", 1_000)).toBe("key_expired");
    expect(accessRefusal(record, "k_3", 0)).toBe("key_revoked");
    expect(accessRefusal(null, "k_1", 0)).toBe("key_revoked");
    expect(accessRefusal({ ...record, status: "disabled" }, "k_1", 0)).toBe("tenant_disabled");
  });

  it("maps each refusal to the operation whose policy applies", () => {
    expect(operationOfRefusal("key_revoked")).toBe("key_revoked");
    expect(operationOfRefusal("key_expired")).toBe("key_expired");
    expect(operationOfRefusal("tenant_disabled")).toBe("disable");
  });
});
