import { describe, expect, it } from "vitest";
import {
  type BatchCandidate,
  type BatchLimits,
  type CampaignTally,
  type CohortTally,
  campaignDefaults,
  contractGuard,
  contractStepsBetween,
  controlCampaign,
  decidePhase,
  emptyTally,
  isClaimable,
  parseCampaignSpec,
  parseSchemaVersionHeader,
  planCohorts,
  recordedAppVersion,
  resultOfAttempt,
  retryDelayMs,
  selectNextBatch,
} from "../../src/core/campaign.ts";
import { parseTenantId } from "../../src/core/tenant-id.ts";

const now = 1_800_000_000_000;
const isTenantId = (raw: unknown) => parseTenantId(raw) !== null;

function tally(canary: Partial<CohortTally> = {}, rollout: Partial<CohortTally> = {}): CampaignTally {
  return { canary: { ...emptyTally, ...canary }, rollout: { ...emptyTally, ...rollout } };
}

describe("parseCampaignSpec", () => {
  const parse = (body: unknown) => parseCampaignSpec(body, 3, isTenantId);

  it("fills in the defaults", () => {
    expect(parse({ toVersion: 3 })).toEqual({
      ok: true,
      spec: {
        toVersion: 3,
        concurrency: campaignDefaults.concurrency,
        canary: { kind: "none" },
        continueOnFailure: false,
        force: false,
        drainTimeoutMs: campaignDefaults.drainTimeoutMs,
        stabilityWindowMs: campaignDefaults.stabilityWindowMs,
        tenants: null,
        adopted: "skip",
      },
    });
  });

  it("skips customers' databases unless told to include them", () => {
    const included = parse({ toVersion: 2, adopted: "include" });
    expect(included.ok && included.spec.adopted).toBe("include");
    expect(parse({ toVersion: 2, adopted: "all" })).toEqual({
      ok: false,
      problem: 'adopted must be "skip" or "include".',
    });
  });

  it("takes an explicit canary list, deduplicated, or a percentage", () => {
    const listed = parse({ toVersion: 2, canary: ["a", "b", "a"], concurrency: 8, continueOnFailure: true });
    expect(listed.ok && listed.spec.canary).toEqual({ kind: "list", tenants: ["a", "b"] });
    const percent = parse({ toVersion: 2, canaryPercent: 2.5 });
    expect(percent.ok && percent.spec.canary).toEqual({ kind: "percent", percent: 2.5 });
  });

  it.each([
    [[], "The body must be a JSON object."],
    [{}, "toVersion must be a bundled schema version"],
    [{ toVersion: 4 }, "toVersion must be a bundled schema version"],
    [{ toVersion: 0 }, "toVersion must be a bundled schema version"],
    [{ toVersion: "3" }, "toVersion must be a bundled schema version"],
    [{ toVersion: 2.5 }, "toVersion must be a bundled schema version"],
    [{ toVersion: 3, concurrency: 0 }, "concurrency must be an integer"],
    [{ toVersion: 3, concurrency: 33 }, "concurrency must be an integer"],
    [{ toVersion: 3, canary: [], canaryPercent: 5 }, "either canary or canaryPercent"],
    [{ toVersion: 3, canary: [] }, "canary must name at least one tenant"],
    [{ toVersion: 3, canary: "a" }, "canary must be an array"],
    [{ toVersion: 3, canary: ["Not_A_Slug"] }, "not a tenant id"],
    [{ toVersion: 3, canaryPercent: 0 }, "canaryPercent must be"],
    [{ toVersion: 3, canaryPercent: 101 }, "canaryPercent must be"],
    [{ toVersion: 3, canaryPercent: "5" }, "canaryPercent must be"],
    [{ toVersion: 3, continueOnFailure: "yes" }, "continueOnFailure must be true or false"],
    [{ toVersion: 3, force: 1 }, "force must be true or false"],
    [{ toVersion: 3, drainTimeoutMs: -1 }, "drainTimeoutMs must be"],
    [{ toVersion: 3, stabilityWindowMs: 1e12 }, "stabilityWindowMs must be"],
    [{ toVersion: 3, tenants: [] }, "at least one tenant"],
    [{ toVersion: 3, tenant: ["a"] }, 'Unknown field "tenant"'],
  ])("refuses %j", (body, problem) => {
    const parsed = parse(body);
    expect(parsed.ok).toBe(false);
    if (!parsed.ok) expect(parsed.problem).toContain(problem);
  });

  it("refuses every version when nothing is bundled", () => {
    const parsed = parseCampaignSpec({ toVersion: 1 }, 0, isTenantId);
    expect(parsed).toEqual({ ok: false, problem: "No tenant migration is bundled in this deployment." });
  });

  it("bounds listed tenants", () => {
    const many = Array.from({ length: 1_001 }, (_, i) => `t${i}`);
    expect(parse({ toVersion: 3, tenants: many }).ok).toBe(false);
    expect(parse({ toVersion: 3, tenants: many.slice(0, 1_000) }).ok).toBe(true);
  });
});

describe("planCohorts", () => {
  const fleet = Array.from({ length: 40 }, (_, i) => `tenant-${String(i).padStart(2, "0")}`);

  it("puts an explicit canary first, then the rest by id", () => {
    const planned = planCohorts(["c", "a", "b", "d"], { kind: "list", tenants: ["d", "b"] }, "cmp_1");
    expect(planned).toEqual({
      ok: true,
      plan: [
        { tenantId: "d", cohort: "canary", position: 0 },
        { tenantId: "b", cohort: "canary", position: 1 },
        { tenantId: "a", cohort: "rollout", position: 2 },
        { tenantId: "c", cohort: "rollout", position: 3 },
      ],
    });
  });

  it("refuses a canary tenant that is not enrolled", () => {
    expect(planCohorts(["a", "b"], { kind: "list", tenants: ["a", "zz"] }, "cmp_1")).toEqual({
      ok: false,
      notEnrolled: ["zz"],
    });
  });

  it("has no canary cohort when none is asked for", () => {
    const planned = planCohorts(["b", "a"], { kind: "none" }, "cmp_1");
    expect(planned.ok && planned.plan.map((p) => [p.tenantId, p.cohort])).toEqual([
      ["a", "rollout"],
      ["b", "rollout"],
    ]);
  });

  it("draws a percentage deterministically: ceil(n × p), at least one, spread by the seed", () => {
    const canaryOf = (seed: string, percent: number, ids = fleet) => {
      const planned = planCohorts(ids, { kind: "percent", percent }, seed);
      return planned.ok ? planned.plan.filter((p) => p.cohort === "canary").map((p) => p.tenantId) : [];
    };
    expect(canaryOf("cmp_a", 10)).toHaveLength(4);
    expect(canaryOf("cmp_a", 1)).toHaveLength(1);
    expect(canaryOf("cmp_a", 100)).toHaveLength(40);
    expect(canaryOf("cmp_a", 10)).toEqual(canaryOf("cmp_a", 10));
    // The input order does not matter.
    expect(canaryOf("cmp_a", 10, [...fleet].reverse())).toEqual(canaryOf("cmp_a", 10));
    // Another campaign draws another canary (not simply the first ids).
    expect(canaryOf("cmp_b", 10)).not.toEqual(canaryOf("cmp_a", 10));
    expect(canaryOf("cmp_a", 10)).not.toEqual(fleet.slice(0, 4));
    expect(canaryOf("cmp_a", 10, [])).toEqual([]);
  });

  it("gives every tenant one dense position", () => {
    const planned = planCohorts(fleet, { kind: "percent", percent: 25 }, "cmp_x");
    expect(planned.ok && planned.plan.map((p) => p.position)).toEqual(fleet.map((_, i) => i));
    expect(planned.ok && new Set(planned.plan.map((p) => p.tenantId)).size).toBe(40);
  });
});

describe("decidePhase", () => {
  it("starts with the canary when there is one, else with the rollout", () => {
    expect(decidePhase("pending", false, tally({ pending: 1 }, { pending: 5 })).state).toBe("canary");
    expect(decidePhase("pending", false, tally({}, { pending: 5 })).state).toBe("rollout");
    expect(decidePhase("pending", false, tally()).state).toBe("rollout");
  });

  it("holds the canary phase until every canary tenant is finished", () => {
    for (const open of [{ pending: 1 }, { running: 1 }, { skippedRetry: 1 }]) {
      expect(decidePhase("canary", false, tally({ succeeded: 2, ...open }, { pending: 9 }))).toEqual({
        state: "canary",
        reason: null,
        stopping: false,
      });
    }
  });

  it("lets the rest follow only a canary that succeeded", () => {
    expect(decidePhase("canary", false, tally({ succeeded: 3 }, { pending: 9 })).state).toBe("rollout");
    expect(decidePhase("canary", false, tally({ succeeded: 2, skippedFinal: 1 }, { pending: 9 })).state).toBe(
      "rollout",
    );
    const failed = decidePhase("canary", true, tally({ succeeded: 2, failed: 1 }, { pending: 9 }));
    expect(failed.state).toBe("failed");
    expect(failed.reason).toContain("canary");
    const inconclusive = decidePhase("canary", false, tally({ skippedFinal: 2 }, { pending: 9 }));
    expect(inconclusive.state).toBe("failed");
  });

  it("lets running canary tenants finish before failing, claiming nothing new", () => {
    expect(decidePhase("canary", false, tally({ failed: 1, running: 1, pending: 2 }))).toEqual({
      state: "canary",
      reason: null,
      stopping: true,
    });
  });

  it("stops the rollout at the first failure unless continueOnFailure", () => {
    expect(
      decidePhase("rollout", false, tally({ succeeded: 1 }, { failed: 1, running: 2, pending: 5 })),
    ).toEqual({
      state: "rollout",
      reason: null,
      stopping: true,
    });
    expect(decidePhase("rollout", false, tally({ succeeded: 1 }, { failed: 1, pending: 5 })).state).toBe(
      "failed",
    );
    expect(decidePhase("rollout", true, tally({ succeeded: 1 }, { failed: 1, pending: 5 }))).toEqual({
      state: "rollout",
      reason: null,
      stopping: false,
    });
  });

  it("is done when nothing is left, saying what it finished with", () => {
    expect(decidePhase("rollout", false, tally({ succeeded: 1 }, { succeeded: 5 }))).toEqual({
      state: "done",
      reason: null,
      stopping: false,
    });
    const withFailures = decidePhase(
      "rollout",
      true,
      tally({ succeeded: 1 }, { succeeded: 5, failed: 2, skippedFinal: 1 }),
    );
    expect(withFailures.state).toBe("done");
    expect(withFailures.reason).toBe("finished with 2 failed and 1 skipped tenant(s)");
    expect(decidePhase("rollout", true, tally({}, { skippedRetry: 1 })).state).toBe("rollout");
  });
});

describe("controlCampaign", () => {
  it("pauses an active campaign and resumes it where it was", () => {
    expect(controlCampaign("canary", null, "pause")).toEqual({
      kind: "change",
      state: "paused",
      pausedFrom: "canary",
    });
    expect(controlCampaign("paused", "canary", "resume")).toEqual({
      kind: "change",
      state: "canary",
      pausedFrom: null,
    });
    expect(controlCampaign("paused", null, "resume")).toEqual({
      kind: "change",
      state: "pending",
      pausedFrom: null,
    });
  });

  it("treats a repeated action as done", () => {
    expect(controlCampaign("paused", "rollout", "pause")).toEqual({ kind: "unchanged" });
    expect(controlCampaign("rollout", null, "resume")).toEqual({ kind: "unchanged" });
    expect(controlCampaign("cancelled", null, "cancel")).toEqual({ kind: "unchanged" });
  });

  it("cancels from any active or paused state", () => {
    for (const state of ["pending", "canary", "rollout", "paused"] as const) {
      expect(controlCampaign(state, null, "cancel")).toEqual({
        kind: "change",
        state: "cancelled",
        pausedFrom: null,
      });
    }
  });

  it("refuses to steer a finished campaign", () => {
    for (const state of ["done", "failed", "cancelled"] as const) {
      for (const action of ["pause", "resume"] as const) {
        expect(controlCampaign(state, null, action).kind).toBe("conflict");
      }
    }
    expect(controlCampaign("done", null, "cancel").kind).toBe("conflict");
  });
});

describe("selectNextBatch", () => {
  const candidate = (tenantId: string, overrides: Partial<BatchCandidate> = {}): BatchCandidate => ({
    tenantId,
    host: "h1",
    state: "pending",
    position: Number(tenantId.replace(/\D/g, "")),
    retryAt: null,
    claimedAt: null,
    ...overrides,
  });
  const limits = (overrides: Partial<BatchLimits> = {}): BatchLimits => ({
    now,
    concurrency: 3,
    claimTimeoutMs: 60_000,
    liveRunningByHost: new Map(),
    hostCap: () => 10,
    stopping: false,
    ...overrides,
  });
  const ids = (batch: BatchCandidate[]) => batch.map((c) => c.tenantId);

  it("takes at most concurrency tenants, in position order", () => {
    const all = ["t5", "t1", "t4", "t2", "t3"].map((id) => candidate(id));
    expect(ids(selectNextBatch(all, limits()))).toEqual(["t1", "t2", "t3"]);
  });

  it("counts tenants still running under a live claim", () => {
    const all = ["t1", "t2", "t3"].map((id) => candidate(id));
    expect(ids(selectNextBatch(all, limits({ liveRunningByHost: new Map([["h1", 2]]) })))).toEqual(["t1"]);
    expect(selectNextBatch(all, limits({ liveRunningByHost: new Map([["h1", 3]]) }))).toEqual([]);
  });

  it("takes stale claims first, then due retries, then new tenants", () => {
    const all = [
      candidate("t1"),
      candidate("t2", { state: "skipped", retryAt: now - 1 }),
      candidate("t3", { state: "skipped", retryAt: now + 1 }),
      candidate("t4", { state: "running", claimedAt: now - 60_000 }),
      candidate("t5", { state: "running", claimedAt: now - 59_999 }),
      candidate("t6", { state: "skipped", retryAt: null }),
      candidate("t7", { state: "succeeded" }),
    ];
    expect(ids(selectNextBatch(all, limits({ concurrency: 10 })))).toEqual(["t4", "t2", "t1"]);
  });

  it("while stopping, only takes back stale claims", () => {
    const all = [
      candidate("t1"),
      candidate("t2", { state: "skipped", retryAt: now - 1 }),
      candidate("t4", { state: "running", claimedAt: now - 120_000 }),
    ];
    expect(ids(selectNextBatch(all, limits({ stopping: true })))).toEqual(["t4"]);
    expect(isClaimable(candidate("t1"), { now, claimTimeoutMs: 1, stopping: true })).toBe(false);
  });

  it("keeps each host within its cap (its budget reserve)", () => {
    const all = [
      ...["t1", "t2", "t3", "t4"].map((id) => candidate(id, { host: "a" })),
      ...["t5", "t6"].map((id) => candidate(id, { host: "b" })),
    ];
    const capped = limits({ concurrency: 4, hostCap: (host) => (host === "a" ? 2 : 10) });
    expect(ids(selectNextBatch(all, capped))).toEqual(["t1", "t2", "t5", "t6"]);
    const busy = limits({ concurrency: 4, hostCap: () => 2, liveRunningByHost: new Map([["a", 1]]) });
    expect(ids(selectNextBatch(all, busy))).toEqual(["t1", "t5", "t6"]);
  });
});

describe("resultOfAttempt", () => {
  it("records a migration with the versions it moved between", () => {
    expect(
      resultOfAttempt({ outcome: "migrated", fromVersion: 1, toVersion: 3, applied: [2, 3] }, 1, now),
    ).toEqual({ state: "succeeded", fromVersion: 1, toVersion: 3, applied: [2, 3] });
  });

  it("keeps the earlier from-version when a retry finds the work already done", () => {
    expect(
      resultOfAttempt({ outcome: "migrated", fromVersion: 3, toVersion: 3, applied: [] }, 2, now),
    ).toEqual({
      state: "succeeded",
      fromVersion: null,
      toVersion: 3,
      applied: [],
    });
  });

  it("runs a migration a transient fault interrupted again after a growing backoff, and never fails it", () => {
    expect(resultOfAttempt({ outcome: "skipped", reason: "interrupted" }, 1, now, 3)).toEqual({
      state: "skipped",
      reason: "interrupted",
      retryAt: now + 5_000,
    });
    expect(resultOfAttempt({ outcome: "skipped", reason: "interrupted" }, 3, now, 3)).toEqual({
      state: "skipped",
      reason: "interrupted",
      retryAt: now + 20_000,
    });
    // Past maxAttempts, still retried (capped at two minutes): a fault is not the tenant's.
    expect(resultOfAttempt({ outcome: "skipped", reason: "interrupted" }, 50, now, 3)).toEqual({
      state: "skipped",
      reason: "interrupted",
      retryAt: now + 120_000,
    });
  });

  it("defers a busy maintenance reserve and an unanswered control-plane lookup, and never gives up on them", () => {
    for (const reason of ["maintenance_busy", "control_plane_unavailable"]) {
      expect(resultOfAttempt({ outcome: "skipped", reason }, 99, now, 3)).toEqual({
        state: "skipped",
        reason,
        retryAt: now + 30_000,
      });
    }
    // An unknown tenant is skipped for good.
    expect(resultOfAttempt({ outcome: "skipped", reason: "tenant_unknown" }, 1, now, 3)).toMatchObject({
      retryAt: null,
    });
  });

  it("retries held leases later, with backoff, and gives up after maxAttempts", () => {
    expect(resultOfAttempt({ outcome: "skipped", reason: "leases_held", leases: 1 }, 1, now, 3)).toEqual({
      state: "skipped",
      reason: "leases_held (1)",
      retryAt: now + 30_000,
    });
    expect(resultOfAttempt({ outcome: "skipped", reason: "already_migrating" }, 2, now, 3)).toEqual({
      state: "skipped",
      reason: "already_migrating",
      retryAt: now + 60_000,
    });
    expect(resultOfAttempt({ outcome: "skipped", reason: "leases_held" }, 3, now, 3)).toEqual({
      state: "skipped",
      reason: "leases_held; gave up after 3 attempts",
      retryAt: null,
    });
  });

  it("skips an unknown (erased) tenant for good", () => {
    expect(resultOfAttempt({ outcome: "skipped", reason: "tenant_unknown" }, 1, now)).toEqual({
      state: "skipped",
      reason: "tenant_unknown",
      retryAt: null,
    });
  });

  it("records a failure with its bounded summary", () => {
    const result = resultOfAttempt({ outcome: "failed", version: 3, summary: "x".repeat(600) }, 1, now);
    expect(result.state).toBe("failed");
    if (result.state === "failed") {
      expect(result.toVersion).toBe(2); // the version reached: 3 failed and rolled back
      expect(result.summary).toHaveLength(500);
    }
  });

  it("retries an unanswered call, then fails it", () => {
    expect(resultOfAttempt({ outcome: "unanswered", summary: "boom" }, 1, now, 2).state).toBe("skipped");
    const given = resultOfAttempt({ outcome: "unanswered", summary: "boom" }, 2, now, 2);
    expect(given).toEqual({ state: "failed", toVersion: null, summary: "no answer after 2 attempts: boom" });
  });

  it("backs off 30 s, doubling, to at most 10 minutes", () => {
    expect([1, 2, 3, 4, 5, 6, 20].map(retryDelayMs)).toEqual([
      30_000, 60_000, 120_000, 240_000, 480_000, 600_000, 600_000,
    ]);
  });
});

describe("expand/contract guard", () => {
  const steps = [
    { version: 1, kind: "expand" as const },
    { version: 2, kind: "expand" as const },
    { version: 3, kind: "contract" as const },
    { version: 4, kind: "expand" as const },
    { version: 5, kind: "contract" as const },
  ];
  const windowMs = 15 * 60_000;

  it("finds the contract steps a move applies", () => {
    expect(contractStepsBetween(steps, 1, 2)).toEqual([]);
    expect(contractStepsBetween(steps, 1, 3)).toEqual([3]);
    expect(contractStepsBetween(steps, 3, 5)).toEqual([5]);
    expect(contractStepsBetween(steps, 0, 5)).toEqual([3, 5]);
  });

  it("passes expand-only moves without looking", () => {
    expect(
      contractGuard({
        contractSteps: [],
        seen: [{ version: 1, lastSeenAt: now }],
        now,
        stabilityWindowMs: windowMs,
        force: false,
      }),
    ).toEqual({ ok: true, forced: false });
  });

  it("refuses while an older app was seen within the window", () => {
    const verdict = contractGuard({
      contractSteps: [3],
      seen: [
        { version: 2, lastSeenAt: now - 60_000 },
        { version: 3, lastSeenAt: now },
      ],
      now,
      stabilityWindowMs: windowMs,
      force: false,
    });
    expect(verdict.ok).toBe(false);
    if (!verdict.ok) {
      expect(verdict.reason).toContain("contract step 3 waits");
      expect(verdict.reason).toContain(new Date(now - 60_000 + windowMs).toISOString());
    }
  });

  it("passes once the older apps are out of the window, or when forced", () => {
    const old = [{ version: 2, lastSeenAt: now - windowMs - 1 }];
    expect(
      contractGuard({ contractSteps: [3], seen: old, now, stabilityWindowMs: windowMs, force: false }).ok,
    ).toBe(true);
    const recent = [{ version: 1, lastSeenAt: now }];
    expect(
      contractGuard({ contractSteps: [3], seen: recent, now, stabilityWindowMs: windowMs, force: true }),
    ).toEqual({
      ok: true,
      forced: true,
    });
  });

  it("is not blocked by apps at or above the contract step", () => {
    const seen = [
      { version: 3, lastSeenAt: now },
      { version: 6, lastSeenAt: now },
    ];
    expect(
      contractGuard({ contractSteps: [3], seen, now, stabilityWindowMs: windowMs, force: false }).ok,
    ).toBe(true);
  });

  it("clamps recorded versions past the bundle, bounding the record", () => {
    expect(recordedAppVersion(2, 3)).toBe(2);
    expect(recordedAppVersion(999_999, 3)).toBe(4);
  });
});

describe("parseSchemaVersionHeader", () => {
  it.each([
    [undefined, null],
    ["3", 3],
    [" 12 ", 12],
    ["0", "malformed"],
    ["-1", "malformed"],
    ["1.5", "malformed"],
    ["three", "malformed"],
    ["", "malformed"],
    ["1234567890", "malformed"],
    ["03", "malformed"],
  ])("%j → %j", (raw, expected) => {
    expect(parseSchemaVersionHeader(raw)).toBe(expected);
  });
});
