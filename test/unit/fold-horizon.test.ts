import { describe, expect, it } from "vitest";
import {
  type BackendActivity,
  decideHorizon,
  defaultHorizonPolicy,
  describePin,
  findPins,
  type HorizonObservation,
  type PreparedTransaction,
  type ReplicationSlot,
} from "../../src/folds/horizon.ts";

const now = Date.parse("2026-11-29T12:00:00Z");
const ownPid = 100;
const threshold = defaultHorizonPolicy.pinThresholdMs;

function observe(parts: Partial<HorizonObservation> = {}): HorizonObservation {
  return { now, ownPid, database: "lessor", backends: [], prepared: [], slots: [], ...parts };
}

function backend(parts: Partial<BackendActivity> = {}): BackendActivity {
  return {
    pid: 200,
    database: "lessor",
    state: "active",
    backendXid: null,
    backendXmin: "1000",
    xactStart: now - 10,
    ...parts,
  };
}

function prepared(parts: Partial<PreparedTransaction> = {}): PreparedTransaction {
  return { gid: "tx-1", database: "lessor", prepared: now - 2_000, ...parts };
}

function slot(parts: Partial<ReplicationSlot> = {}): ReplicationSlot {
  return {
    slot: "standby",
    active: true,
    xmin: "900",
    catalogXmin: null,
    xminAge: 50,
    inactiveSince: null,
    ...parts,
  };
}

describe("horizon gate: nothing pins", () => {
  it("an empty cluster", () => {
    expect(decideHorizon(observe())).toEqual({ pinned: false });
  });

  it("ordinary short statements, however many", () => {
    const backends = Array.from({ length: 10_000 }, (_, i) =>
      backend({
        pid: 1_000 + i,
        state: "active",
        backendXmin: String(5_000 + i),
        // Half of them are writing, all of them are young.
        backendXid: i % 2 === 0 ? String(6_000 + i) : null,
        xactStart: now - (i % threshold),
      }),
    );
    expect(decideHorizon(observe({ backends }))).toEqual({ pinned: false });
  });

  it("a young REPEATABLE READ reader idle between its statements (snapshot, no xid)", () => {
    const reader = backend({ state: "idle in transaction", backendXid: null, xactStart: now - 1_000 });
    expect(decideHorizon(observe({ backends: [reader] }))).toEqual({ pinned: false });
  });

  it("an old READ COMMITTED transaction idle with neither an xid nor a snapshot", () => {
    const idle = backend({
      state: "idle in transaction",
      backendXid: null,
      backendXmin: null,
      xactStart: now - 3_600_000,
    });
    expect(decideHorizon(observe({ backends: [idle] }))).toEqual({ pinned: false });
  });

  it("an aborted transaction left idle (it holds nothing)", () => {
    const aborted = backend({
      state: "idle in transaction (aborted)",
      backendXid: null,
      backendXmin: null,
      xactStart: now - 3_600_000,
    });
    expect(decideHorizon(observe({ backends: [aborted] }))).toEqual({ pinned: false });
  });

  it("idle sessions outside any transaction", () => {
    const idle = backend({ state: "idle", backendXid: null, backendXmin: null, xactStart: null });
    expect(decideHorizon(observe({ backends: [idle] }))).toEqual({ pinned: false });
  });

  it("a transaction exactly at the threshold (the threshold is exclusive)", () => {
    const edge = backend({ xactStart: now - threshold });
    expect(decideHorizon(observe({ backends: [edge] }))).toEqual({ pinned: false });
  });

  it("the fold's own backend, however old its transaction", () => {
    const own = backend({
      pid: ownPid,
      state: "idle in transaction",
      backendXid: "7",
      xactStart: now - 600_000,
    });
    expect(decideHorizon(observe({ backends: [own] }))).toEqual({ pinned: false });
  });

  it("backends of other databases (they do not hold back this database's tables)", () => {
    const elsewhere = [
      backend({ database: "tenant_a", state: "idle in transaction", backendXid: "9" }),
      backend({ database: "tenant_b", xactStart: now - 600_000 }),
    ];
    expect(decideHorizon(observe({ backends: elsewhere }))).toEqual({ pinned: false });
  });

  it("prepared transactions of other databases", () => {
    expect(decideHorizon(observe({ prepared: [prepared({ database: "tenant_a" })] }))).toEqual({
      pinned: false,
    });
  });

  it("a backend whose transaction start is not visible (no age to judge)", () => {
    const walsender = backend({ database: null, state: "active", xactStart: null });
    const hidden = backend({ state: null, backendXmin: "5", xactStart: null });
    expect(decideHorizon(observe({ backends: [walsender, hidden] }))).toEqual({ pinned: false });
  });

  it("a long lazy autovacuum (Postgres leaves it out of every horizon)", () => {
    const vacuum = backend({ state: "active", lazyVacuum: true, xactStart: now - 600_000 });
    expect(decideHorizon(observe({ backends: [vacuum] }))).toEqual({ pinned: false });
  });

  it("a logical slot holding only catalog_xmin (catalogs only)", () => {
    const logical = slot({ xmin: null, catalogXmin: "800", xminAge: null, active: false });
    expect(decideHorizon(observe({ slots: [logical] }))).toEqual({ pinned: false });
  });

  it("an active slot whose xmin lags within the limit (a live standby's feedback)", () => {
    const live = slot({ xminAge: defaultHorizonPolicy.slotXminAgeLimit });
    expect(decideHorizon(observe({ slots: [live] }))).toEqual({ pinned: false });
  });

  it("a slot with no xmin at all", () => {
    expect(decideHorizon(observe({ slots: [slot({ xmin: null, xminAge: null, active: false })] }))).toEqual({
      pinned: false,
    });
  });
});

describe("horizon gate: genuine pins", () => {
  it("idle in transaction holding a write xid, however young", () => {
    const writer = backend({
      pid: 321,
      state: "idle in transaction",
      backendXid: "4242",
      backendXmin: null,
      xactStart: now - 300,
    });
    expect(decideHorizon(observe({ backends: [writer] }))).toEqual({
      pinned: true,
      kind: "idle_in_transaction",
      pid: 321,
      seconds: 0.3,
    });
  });

  it("idle in transaction with an xid but no visible start still pins (0 seconds)", () => {
    const writer = backend({ state: "idle in transaction", backendXid: "1", xactStart: null });
    expect(decideHorizon(observe({ backends: [writer] }))).toMatchObject({
      pinned: true,
      kind: "idle_in_transaction",
      seconds: 0,
    });
  });

  it("a REPEATABLE READ reader past the threshold", () => {
    const reader = backend({ pid: 7, state: "idle in transaction", xactStart: now - threshold - 1 });
    expect(decideHorizon(observe({ backends: [reader] }))).toEqual({
      pinned: true,
      kind: "long_transaction",
      pid: 7,
      seconds: 5,
    });
  });

  it("one long-running statement past the threshold", () => {
    const report = backend({ pid: 8, state: "active", xactStart: now - 42_000 });
    expect(decideHorizon(observe({ backends: [report] }))).toEqual({
      pinned: true,
      kind: "long_transaction",
      pid: 8,
      seconds: 42,
    });
  });

  it("an old writing transaction that is mid-statement (xid, no snapshot shown)", () => {
    const writer = backend({ state: "active", backendXid: "77", backendXmin: null, xactStart: now - 9_000 });
    expect(decideHorizon(observe({ backends: [writer] }))).toMatchObject({
      pinned: true,
      kind: "long_transaction",
      seconds: 9,
    });
  });

  it("an autovacuum that is not a lazy VACUUM (an ANALYZE holds an ordinary snapshot)", () => {
    const analyze = backend({ state: "active", lazyVacuum: false, xactStart: now - 600_000 });
    expect(decideHorizon(observe({ backends: [analyze] }))).toMatchObject({
      pinned: true,
      kind: "long_transaction",
    });
  });

  it("a backend attached to no database with an old transaction", () => {
    const worker = backend({ database: null, xactStart: now - 60_000 });
    expect(decideHorizon(observe({ backends: [worker] }))).toMatchObject({
      pinned: true,
      kind: "long_transaction",
    });
  });

  it("a prepared transaction, however young", () => {
    expect(decideHorizon(observe({ prepared: [prepared({ gid: "2pc-a", prepared: now - 1_500 })] }))).toEqual(
      { pinned: true, kind: "prepared_transaction", gid: "2pc-a", seconds: 1.5 },
    );
  });

  it("a prepared transaction with no database recorded", () => {
    expect(decideHorizon(observe({ prepared: [prepared({ database: null })] }))).toMatchObject({
      pinned: true,
      kind: "prepared_transaction",
    });
  });

  it("an inactive slot holding xmin (nothing will advance it)", () => {
    const abandoned = slot({ slot: "old", active: false, inactiveSince: now - 90_000, xminAge: 3 });
    expect(decideHorizon(observe({ slots: [abandoned] }))).toEqual({
      pinned: true,
      kind: "replication_slot",
      slot: "old",
      seconds: 90,
      xminAge: 3,
    });
  });

  it("an inactive slot on a Postgres without inactive_since", () => {
    expect(decideHorizon(observe({ slots: [slot({ active: false })] }))).toEqual({
      pinned: true,
      kind: "replication_slot",
      slot: "standby",
      seconds: null,
      xminAge: 50,
    });
  });

  it("an active slot lagging past the xmin age limit", () => {
    const lagging = slot({ xminAge: defaultHorizonPolicy.slotXminAgeLimit + 1 });
    expect(decideHorizon(observe({ slots: [lagging] }))).toMatchObject({
      pinned: true,
      kind: "replication_slot",
      seconds: null,
    });
  });

  it("a pin among ten thousand ordinary statements is still found", () => {
    const noise = Array.from({ length: 10_000 }, (_, i) => backend({ pid: 1_000 + i }));
    const pin = backend({ pid: 99_999, state: "idle in transaction", backendXid: "5" });
    expect(decideHorizon(observe({ backends: [...noise, pin] }))).toMatchObject({
      pinned: true,
      pid: 99_999,
    });
  });
});

describe("horizon gate: policy and reporting", () => {
  it("honours a custom threshold", () => {
    const reader = backend({ xactStart: now - 2_000 });
    const policy = { ...defaultHorizonPolicy, pinThresholdMs: 1_000 };
    expect(decideHorizon(observe({ backends: [reader] }), policy)).toMatchObject({ pinned: true });
    expect(decideHorizon(observe({ backends: [reader] }))).toEqual({ pinned: false });
  });

  it("honours a custom slot limit", () => {
    const live = slot({ xminAge: 500 });
    expect(
      decideHorizon(observe({ slots: [live] }), { ...defaultHorizonPolicy, slotXminAgeLimit: 100 }),
    ).toMatchObject({ pinned: true, kind: "replication_slot" });
  });

  it("reports the longest-held pin, and lists them all longest first", () => {
    const observation = observe({
      backends: [
        backend({ pid: 1, state: "idle in transaction", backendXid: "1", xactStart: now - 2_000 }),
        backend({ pid: 2, xactStart: now - 120_000 }),
      ],
      prepared: [prepared({ gid: "p", prepared: now - 30_000 })],
      slots: [slot({ active: false })],
    });
    expect(decideHorizon(observation)).toMatchObject({ kind: "long_transaction", pid: 2, seconds: 120 });
    expect(findPins(observation).map((pin) => pin.kind)).toEqual([
      "long_transaction",
      "prepared_transaction",
      "idle_in_transaction",
      "replication_slot",
    ]);
  });

  it("on equal ages prefers the most specific kind", () => {
    const observation = observe({
      backends: [
        backend({ pid: 2, xactStart: now - 10_000 }),
        backend({ pid: 1, state: "idle in transaction", backendXid: "1", xactStart: now - 10_000 }),
      ],
    });
    expect(decideHorizon(observation)).toMatchObject({ kind: "idle_in_transaction", pid: 1 });
  });

  it("never reports a negative age when clocks disagree", () => {
    const future = backend({ state: "idle in transaction", backendXid: "1", xactStart: now + 5_000 });
    expect(decideHorizon(observe({ backends: [future] }))).toMatchObject({ seconds: 0 });
  });

  it("describes each kind of pin", () => {
    expect(describePin({ kind: "idle_in_transaction", pid: 12, seconds: 3.4 })).toBe(
      "pid 12 for 3.4 seconds",
    );
    expect(describePin({ kind: "long_transaction", pid: 12, seconds: 60 })).toBe("pid 12 for 60 seconds");
    expect(describePin({ kind: "prepared_transaction", gid: "g", seconds: 2 })).toBe(
      "prepared transaction 'g' for 2 seconds",
    );
    expect(describePin({ kind: "replication_slot", slot: "s", seconds: 9, xminAge: 1 })).toBe(
      "replication slot 's' for 9 seconds",
    );
    expect(describePin({ kind: "replication_slot", slot: "s", seconds: null, xminAge: 77 })).toBe(
      "replication slot 's' (xmin 77 transactions old)",
    );
  });
});
