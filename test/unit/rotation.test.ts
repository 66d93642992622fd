/**
 * Credential rotation's pure decisions (docs/adr/013): when a rotation overlaps generations, how the
 * switch and the retirement move the lifecycle, what a restart leaves, and the rotation reserve's
 * arithmetic.
 */
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import {
  type Allocation,
  type BudgetLimits,
  fits,
  rotationFits,
  validateLimits,
} from "../../src/core/budget.ts";
import {
  admitDecision,
  beginRotation,
  beginStart,
  initialLifecycle,
  type Lifecycle,
  nextGeneration,
  recoverAfterRestart,
  retired,
  rotationAbandoned,
  rotationDecision,
  rotationSwitched,
  stopped,
} from "../../src/core/lifecycle.ts";

function lifecycle(overrides: Partial<Lifecycle> = {}): Lifecycle {
  return { ...initialLifecycle, ...overrides };
}

const ready = lifecycle({ state: "ready", generation: 4 });

describe("rotationDecision", () => {
  it("overlaps a ready pool and only updates the credential of one that does not run", () => {
    expect(rotationDecision(ready)).toEqual({ kind: "overlap" });
    expect(rotationDecision(lifecycle({ state: "stopped" }))).toEqual({ kind: "update_credential" });
    expect(rotationDecision(lifecycle({ state: "failed" }))).toEqual({ kind: "update_credential" });
  });

  it("refuses while the pool changes state, migrates, or a rotation is still in progress", () => {
    expect(rotationDecision(lifecycle({ state: "starting" }))).toMatchObject({ code: "tenant_busy" });
    expect(rotationDecision(lifecycle({ state: "draining" }))).toMatchObject({ code: "tenant_draining" });
    expect(rotationDecision({ ...ready, migrating: true })).toMatchObject({ code: "tenant_migrating" });
    expect(rotationDecision({ ...ready, rotatingTo: 5 })).toMatchObject({ code: "rotation_in_progress" });
    // Even a stopped tenant waits for a retiring generation: its guard key is still needed.
    expect(rotationDecision(lifecycle({ state: "stopped", generation: 5, retiring: 4 }))).toMatchObject({
      code: "rotation_in_progress",
    });
  });
});

describe("a rotation's generations", () => {
  it("reserves the next generation while the current one keeps serving, then switches", () => {
    const preparing = beginRotation(ready);
    expect(preparing).toMatchObject({ state: "ready", generation: 4, rotatingTo: 5 });
    expect(admitDecision(preparing, 0)).toEqual({ kind: "use" });
    expect(rotationSwitched(preparing, 4)).toMatchObject({
      state: "ready",
      generation: 5,
      rotatingTo: null,
      retiring: 4,
    });
  });

  it("never switches a pool that stopped or changed meanwhile", () => {
    const preparing = beginRotation(ready);
    expect(rotationSwitched({ ...preparing, state: "stopped" }, 4)).toBeNull();
    expect(rotationSwitched({ ...preparing, state: "draining" }, 4)).toBeNull();
    expect(rotationSwitched({ ...preparing, migrating: true }, 4)).toBeNull();
    expect(rotationSwitched(ready, 4)).toBeNull();
    expect(rotationAbandoned(preparing)).toEqual(ready);
  });

  it("a start during a rotation never reuses the generation being prepared", () => {
    const preparing = beginRotation(ready);
    const afterStop = stopped({ ...preparing, state: "draining" }, 4);
    expect(nextGeneration(afterStop)).toBe(6);
    expect(beginStart(afterStop).generation).toBe(6);
  });

  it("the retiring generation leaves only when it is the one that stopped", () => {
    const switched = rotationSwitched(beginRotation(ready), 4);
    if (!switched) throw new Error("expected a switch");
    expect(retired(switched, 3)).toBe(switched);
    expect(retired(switched, 4)).toMatchObject({ generation: 5, retiring: null, state: "ready" });
    // The current generation can stop before the retiring one does; neither affects the other.
    expect(stopped(switched, 4)).toBe(switched);
    expect(stopped(switched, 5)).toMatchObject({ state: "stopped", retiring: 4 });
  });
});

describe("recoverAfterRestart with a rotation", () => {
  it("mid-preparation: both generations are dead, neither serves, the next start is past both", () => {
    const { lifecycle: after, deadGenerations } = recoverAfterRestart(beginRotation(ready));
    expect(after).toMatchObject({ state: "stopped", rotatingTo: null, retiring: null });
    expect(deadGenerations.toSorted()).toEqual([4, 5]);
    expect(beginStart(after).generation).toBe(6);
  });

  it("after the switch, with the old generation still retiring", () => {
    const switched = rotationSwitched(beginRotation(ready), 4);
    if (!switched) throw new Error("expected a switch");
    const { lifecycle: after, deadGenerations } = recoverAfterRestart(switched);
    expect(after).toMatchObject({ state: "stopped", generation: 5, retiring: null });
    expect(deadGenerations.toSorted()).toEqual([4, 5]);
  });

  it("a stopped current generation with a retiring one still reports the retiring one dead", () => {
    const { lifecycle: after, deadGenerations } = recoverAfterRestart(
      lifecycle({ state: "stopped", generation: 5, retiring: 4 }),
    );
    expect(after).toMatchObject({ state: "stopped", generation: 5, retiring: null });
    expect(deadGenerations).toEqual([4]);
  });

  it("an old persisted lifecycle without rotation fields recovers as before", () => {
    const old = {
      state: "ready",
      generation: 3,
      failures: 0,
      failureReason: null,
      retryAt: null,
      migrating: false,
    };
    const { lifecycle: after, deadGenerations } = recoverAfterRestart(old as unknown as Lifecycle);
    expect(after).toMatchObject({ state: "stopped", generation: 3, rotatingTo: null, retiring: null });
    expect(deadGenerations).toEqual([3]);
  });
});

describe("the rotation reserve", () => {
  const limits: BudgetLimits = { connections: 12, reserve: 2, rotationReserve: 5 };
  const pool = (tenantId: string, size: number): Allocation => ({
    tenantId,
    generation: 1,
    size,
    phase: "allocated",
    idleSince: 1,
    leases: 0,
    pinned: false,
    migrating: false,
  });

  it("admits an overlap past the pools' share, up to the reserve, and never ordinary starts", () => {
    const full = [pool("a", 5), pool("b", 5)];
    expect(fits(full, limits, 1)).toBe(false);
    expect(rotationFits(full, limits, 5)).toBe(true);
    expect(rotationFits(full, limits, 6)).toBe(false);
    const overlapping = [...full, pool("a", 5)];
    expect(rotationFits(overlapping, limits, 1)).toBe(false);
    expect(fits(overlapping, limits, 1)).toBe(false);
    expect(rotationFits(full, { connections: 12, reserve: 2, rotationReserve: 0 }, 1)).toBe(false);
  });

  it("is validated and defaults to the largest pool", () => {
    expect(validateLimits({ connections: 12, reserve: 2, rotationReserve: -1 }, 5)).toMatch(
      /rotationReserve/,
    );
    expect(validateLimits({ connections: 12, reserve: 2, rotationReserve: 1.5 }, 5)).toMatch(
      /rotationReserve/,
    );
    const env = {
      LESSOR_POOL_SIZES: JSON.stringify({ free: 2, standard: 5, pro: 6 }),
      LESSOR_BUDGETS: JSON.stringify({
        "*": { connections: 40 },
        b: { connections: 40, rotationReserve: 0 },
      }),
      LESSOR_HOSTS: JSON.stringify({
        a: "postgres://x:y@127.0.0.1:5432/postgres",
        b: "postgres://x:y@127.0.0.1:5432/postgres",
      }),
      LESSOR_ADMIN_KEY: "unit-admin",
      LESSOR_SEAL_KEY: "unit-seal",
      LESSOR_KEY_MAC_KEYS: btoa(String.fromCharCode(...new Uint8Array(32).fill(5))),
    } as unknown as Env;
    const config = loadConfig(env);
    expect(config.hosts.get("a")?.budget.rotationReserve).toBe(6);
    expect(config.hosts.get("b")?.budget.rotationReserve).toBe(0);
  });
});
