import { describe, expect, it } from "vitest";
import {
  admitDecision,
  backoffDelay,
  beginDrain,
  beginStart,
  classifyStartFailure,
  defaultBackoff,
  idleDecision,
  initialLifecycle,
  type Lifecycle,
  leaseOverdueAfterMs,
  leaseOverdueMarginMs,
  type PoolState,
  recoverAfterRestart,
  skipGeneration,
  startFailed,
  startSucceeded,
  stopped,
} from "../../src/core/lifecycle.ts";

const now = 1_700_000_000_000;

function lifecycle(overrides: Partial<Lifecycle> = {}): Lifecycle {
  return { ...initialLifecycle, ...overrides };
}

describe("admitDecision", () => {
  it("starts a stopped pool", () => {
    expect(admitDecision(lifecycle({ state: "stopped" }), now)).toEqual({ kind: "start" });
  });

  it("uses a ready pool", () => {
    expect(admitDecision(lifecycle({ state: "ready", generation: 3 }), now)).toEqual({ kind: "use" });
  });

  it("joins a start in progress instead of starting another", () => {
    expect(admitDecision(lifecycle({ state: "starting", generation: 1 }), now)).toEqual({
      kind: "join_start",
    });
  });

  it("refuses while draining", () => {
    expect(admitDecision(lifecycle({ state: "draining", generation: 1 }), now)).toEqual({
      kind: "refuse_draining",
    });
  });

  it("refuses a failed pool before its retry time, with the time left and the reason", () => {
    const failed = lifecycle({
      state: "failed",
      failures: 2,
      failureReason: "auth_failed",
      retryAt: now + 1_500,
    });
    expect(admitDecision(failed, now)).toEqual({
      kind: "refuse_backoff",
      retryAfterMs: 1_500,
      reason: "auth_failed",
    });
    expect(admitDecision(failed, now + 1_499)).toEqual({
      kind: "refuse_backoff",
      retryAfterMs: 1,
      reason: "auth_failed",
    });
  });

  it("starts a failed pool again once its retry time has come", () => {
    const failed = lifecycle({ state: "failed", failures: 1, failureReason: "unreachable", retryAt: now });
    expect(admitDecision(failed, now)).toEqual({ kind: "start" });
    expect(admitDecision(failed, now + 10_000)).toEqual({ kind: "start" });
  });

  it("reports an unknown reason when a failed record has none", () => {
    const failed = lifecycle({ state: "failed", failures: 1, retryAt: now + 10 });
    expect(admitDecision(failed, now)).toMatchObject({ kind: "refuse_backoff", reason: "unknown" });
  });
});

describe("backoffDelay", () => {
  it("waits between half and all of base·2ⁿ⁻¹", () => {
    for (const failures of [1, 2, 3, 4, 5, 6]) {
      const ceiling = defaultBackoff.baseMs * 2 ** (failures - 1);
      expect(backoffDelay(failures, 0)).toBe(ceiling / 2);
      const top = backoffDelay(failures, 0.999_999);
      expect(top).toBeGreaterThan(ceiling / 2);
      expect(top).toBeLessThanOrEqual(ceiling);
    }
  });

  it("grows with each consecutive failure", () => {
    expect(backoffDelay(2, 0)).toBeGreaterThan(backoffDelay(1, 0));
    expect(backoffDelay(3, 0)).toBeGreaterThan(backoffDelay(2, 0));
  });

  it("is jittered: different random draws give different delays", () => {
    const delays = new Set([0, 0.25, 0.5, 0.75].map((random) => backoffDelay(4, random)));
    expect(delays.size).toBe(4);
  });

  it("never exceeds the cap, however many failures", () => {
    for (const failures of [10, 20, 50, 1_000, 10_000]) {
      for (const random of [0, 0.5, 0.999_999]) {
        const delay = backoffDelay(failures, random);
        expect(delay).toBeGreaterThanOrEqual(defaultBackoff.capMs / 2);
        expect(delay).toBeLessThanOrEqual(defaultBackoff.capMs);
        expect(Number.isFinite(delay)).toBe(true);
      }
    }
  });

  it("follows a custom policy", () => {
    const policy = { baseMs: 100, capMs: 350 };
    expect(backoffDelay(1, 0, policy)).toBe(50);
    expect(backoffDelay(3, 0, policy)).toBe(175);
    expect(backoffDelay(3, 0.999_999, policy)).toBeLessThanOrEqual(350);
  });

  it("treats zero failures like the first", () => {
    expect(backoffDelay(0, 0)).toBe(backoffDelay(1, 0));
  });
});

describe("start transitions", () => {
  it("takes the next generation on every start", () => {
    const first = beginStart(initialLifecycle);
    expect(first).toMatchObject({ state: "starting", generation: 1 });
    const second = beginStart(stopped(startSucceeded(first), 1));
    expect(second).toMatchObject({ state: "starting", generation: 2 });
  });

  it("moves past a generation another start took", () => {
    expect(skipGeneration(lifecycle({ state: "starting", generation: 2 }), 5).generation).toBe(6);
    // Never moves backwards, even if the ledger is behind.
    expect(skipGeneration(lifecycle({ state: "starting", generation: 7 }), 3).generation).toBe(8);
  });

  it("a failed start records the reason, counts the failure and sets a bounded retry time", () => {
    const failed = startFailed(lifecycle({ state: "starting", generation: 1 }), "unreachable", now, 0.5);
    expect(failed.state).toBe("failed");
    expect(failed.failures).toBe(1);
    expect(failed.failureReason).toBe("unreachable");
    expect(failed.generation).toBe(1);
    expect(failed.retryAt).toBe(now + backoffDelay(1, 0.5));

    const again = startFailed({ ...failed, state: "starting", generation: 2 }, "auth_failed", now, 0.5);
    expect(again.failures).toBe(2);
    expect(again.failureReason).toBe("auth_failed");
    expect(again.retryAt).toBe(now + backoffDelay(2, 0.5));
  });

  it("a successful start clears the failure record", () => {
    const failed = startFailed(lifecycle({ state: "starting", generation: 1 }), "unreachable", now, 0);
    const ready = startSucceeded({ ...failed, state: "starting", generation: 2 });
    expect(ready).toMatchObject({
      state: "ready",
      generation: 2,
      failures: 0,
      failureReason: null,
      retryAt: null,
    });
  });

  it("does not mutate its input", () => {
    const before = lifecycle({ state: "starting", generation: 1 });
    const copy = { ...before };
    startFailed(before, "unknown", now, 0);
    startSucceeded(before);
    beginStart(before);
    expect(before).toEqual(copy);
  });
});

describe("drain and stop", () => {
  it("drains only a ready pool", () => {
    expect(beginDrain(lifecycle({ state: "ready", generation: 2 })).state).toBe("draining");
    for (const state of ["stopped", "starting", "failed", "draining"] satisfies PoolState[]) {
      expect(beginDrain(lifecycle({ state, generation: 2 })).state).toBe(state);
    }
  });

  it("stops only the generation that drained", () => {
    const draining = lifecycle({ state: "draining", generation: 4 });
    expect(stopped(draining, 4).state).toBe("stopped");
    const newer = lifecycle({ state: "ready", generation: 5 });
    expect(stopped(newer, 4)).toEqual(newer);
  });
});

describe("recoverAfterRestart", () => {
  it.each(["ready", "starting", "draining"] satisfies PoolState[])(
    "declares a persisted %s generation dead and stops",
    (state) => {
      const { lifecycle: recovered, deadGeneration } = recoverAfterRestart(
        lifecycle({ state, generation: 7 }),
      );
      expect(deadGeneration).toBe(7);
      expect(recovered.state).toBe("stopped");
      // The generation is kept, so the next start takes 8 rather than reusing 7.
      expect(recovered.generation).toBe(7);
      expect(beginStart(recovered).generation).toBe(8);
    },
  );

  it("leaves a stopped pool alone", () => {
    const input = lifecycle({ state: "stopped", generation: 3 });
    expect(recoverAfterRestart(input)).toMatchObject({ lifecycle: input, deadGeneration: null });
  });

  it("keeps a failed pool's backoff across a restart", () => {
    const input = lifecycle({
      state: "failed",
      generation: 3,
      failures: 2,
      failureReason: "unreachable",
      retryAt: now + 5_000,
    });
    expect(recoverAfterRestart(input)).toMatchObject({ lifecycle: input, deadGeneration: null });
  });
});

describe("idleDecision", () => {
  const base = { idleTimeoutMs: 60_000, heartbeatMs: 30_000, now };

  it.each(["stopped", "starting", "draining", "failed"] satisfies PoolState[])(
    "does nothing for a %s pool",
    (state) => {
      expect(idleDecision({ ...base, state, leases: 0, idleSince: now - 1_000_000 })).toEqual({
        kind: "none",
      });
    },
  );

  it("never drains a pool with a live lease, however long ago it was idle", () => {
    expect(idleDecision({ ...base, state: "ready", leases: 1, idleSince: now - 10_000_000 })).toEqual({
      kind: "rearm",
      at: now + 30_000,
    });
  });

  it("re-arms a ready pool that has no idle clock yet", () => {
    expect(idleDecision({ ...base, state: "ready", leases: 0, idleSince: null })).toEqual({
      kind: "rearm",
      at: now + 30_000,
    });
  });

  it("drains once the idle timeout has passed", () => {
    expect(idleDecision({ ...base, state: "ready", leases: 0, idleSince: now - 60_000 })).toEqual({
      kind: "drain",
    });
    expect(idleDecision({ ...base, state: "ready", leases: 0, idleSince: now - 60_001 })).toEqual({
      kind: "drain",
    });
  });

  it("re-arms at the deadline when it comes before the next heartbeat", () => {
    expect(idleDecision({ ...base, state: "ready", leases: 0, idleSince: now - 50_000 })).toEqual({
      kind: "rearm",
      at: now + 10_000,
    });
  });

  it("re-arms at the heartbeat when the deadline is further away", () => {
    expect(idleDecision({ ...base, state: "ready", leases: 0, idleSince: now - 1_000 })).toEqual({
      kind: "rearm",
      at: now + 30_000,
    });
  });
});

describe("classifyStartFailure", () => {
  it.each([
    [{ code: "28P01" }, "auth_failed"],
    [{ code: "28000" }, "auth_failed"],
    [{ code: "3D000" }, "database_missing"],
    [{ code: "53300" }, "too_many_connections"],
    [{ code: "57P03" }, "unreachable"],
    [{ code: "ECONNREFUSED" }, "unreachable"],
    [{ code: "misconfigured" }, "misconfigured"],
    [new Error("WebSocket connection closed"), "unreachable"],
    [new Error("Connection terminated due to connection timeout"), "timeout"],
    [new Error("something else"), "unknown"],
    ["a string", "unknown"],
  ])("classifies %j as %s", (error, reason) => {
    expect(classifyStartFailure(error)).toBe(reason);
  });
});

describe("leaseOverdueAfterMs", () => {
  const bounds = { statementTimeoutMs: 30_000, leaseMaxLifetimeMs: 3_600_000 };
  it("lies past everything that legitimately holds a lease, by the margin", () => {
    expect(leaseOverdueAfterMs("sql", bounds)).toBe(30_000 + leaseOverdueMarginMs);
    expect(leaseOverdueAfterMs("session", bounds)).toBe(3_600_000 + leaseOverdueMarginMs);
    // The margin covers a checkout wait (10 s) and a cancel's and a cut's grace (2 s each).
    expect(leaseOverdueMarginMs).toBeGreaterThan(10_000 + 2_000 + 2_000);
  });
});
