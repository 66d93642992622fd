import { describe, expect, it } from "vitest";
import {
  type EraseLeftovers,
  eraseRequestDecision,
  eraseRetryDelay,
  eraseStages,
  isEraseStage,
  recheckVerdict,
  stageAfter,
} from "../../src/core/erase.ts";
import { erasedTables, tablesErasedAt } from "../../src/core/tenant-data.ts";

const none: EraseLeftovers = {
  tenantKeys: 0,
  tenantJwt: 0,
  campaignTenants: 0,
  tenantCredentials: 0,
  adoptedDatabases: 0,
  usageDeltas: 0,
  usageRollups: 0,
  lifecycleEvents: 0,
  generationLedger: 0,
};

describe("erase stages", () => {
  it("run in the documented order, each once, ending with the commit", () => {
    expect(eraseStages).toEqual([
      "keys",
      "leases",
      "pool",
      "campaigns",
      "database",
      "credentials",
      "usage",
      "events",
      "object",
      "commit",
    ]);
    const walked: string[] = [];
    for (let stage: (typeof eraseStages)[number] | null = "keys"; stage !== null; stage = stageAfter(stage)) {
      walked.push(stage);
    }
    expect(walked).toEqual([...eraseStages]);
    expect(isEraseStage("database")).toBe(true);
    expect(isEraseStage("tombstone")).toBe(false);
  });

  it("keys go before anything that can be reached with one; the object's own storage just before the commit", () => {
    const at = (stage: string) => eraseStages.indexOf(stage as (typeof eraseStages)[number]);
    expect(at("keys")).toBeLessThan(at("leases"));
    expect(at("leases")).toBeLessThan(at("pool"));
    expect(at("pool")).toBeLessThan(at("database"));
    expect(at("database")).toBeLessThan(at("credentials"));
    expect(at("object")).toBe(eraseStages.length - 2);
  });
});

describe("eraseRequestDecision", () => {
  const base = { pinned: false, force: false, migrating: false, claimedByCampaign: false };

  it("starts an ordinary erase", () => {
    expect(eraseRequestDecision(base)).toEqual({ kind: "start" });
  });

  it("refuses a pinned tenant unless forced", () => {
    expect(eraseRequestDecision({ ...base, pinned: true })).toEqual({
      kind: "refuse",
      code: "tenant_pinned",
    });
    expect(eraseRequestDecision({ ...base, pinned: true, force: true })).toEqual({ kind: "start" });
  });

  it("refuses while a campaign migrates or claims the tenant, even when forced", () => {
    for (const facts of [
      { ...base, migrating: true },
      { ...base, claimedByCampaign: true },
      { ...base, migrating: true, force: true, pinned: true },
    ]) {
      expect(eraseRequestDecision(facts)).toEqual({ kind: "refuse", code: "tenant_in_campaign" });
    }
  });
});

describe("recheckVerdict", () => {
  it("commits when nothing names the tenant any more", () => {
    expect(recheckVerdict(none)).toEqual({ ok: true });
  });

  it("goes back to the earliest stage that removes what was written meanwhile", () => {
    expect(recheckVerdict({ ...none, usageDeltas: 2 })).toMatchObject({ ok: false, resumeAt: "usage" });
    expect(recheckVerdict({ ...none, lifecycleEvents: 1, generationLedger: 1 })).toMatchObject({
      ok: false,
      resumeAt: "events",
    });
    const both = recheckVerdict({ ...none, tenantKeys: 1, usageDeltas: 1 });
    expect(both).toMatchObject({ ok: false, resumeAt: "keys" });
    if (!both.ok)
      expect(both.summary).toBe(
        "commit re-check: written during the erase: 1 tenantKeys, 1 usageDeltas; resuming at keys",
      );
    expect(recheckVerdict({ ...none, campaignTenants: 1, tenantCredentials: 1 })).toMatchObject({
      resumeAt: "campaigns",
    });
    // Where a customer's database is goes at `database` (detached, never dropped).
    expect(recheckVerdict({ ...none, adoptedDatabases: 1, tenantCredentials: 1 })).toMatchObject({
      resumeAt: "database",
    });
  });
});

describe("the tables each stage deletes from (the declaration drives the erase)", () => {
  it("every declared table is deleted by exactly one stage before the commit", () => {
    const byStage = eraseStages.flatMap((stage) => tablesErasedAt(stage));
    expect([...byStage].sort()).toEqual([...erasedTables].sort());
    expect(new Set(byStage).size).toBe(byStage.length);
    expect(tablesErasedAt("commit")).toEqual([]);
    // Stages that touch only the object or the host delete no control-plane row.
    for (const stage of ["leases", "pool", "object"] as const) expect(tablesErasedAt(stage)).toEqual([]);
  });

  it("usage deltas go before the rollup (a fold that drained deltas has committed its rollup by then)", () => {
    expect(tablesErasedAt("usage")).toEqual(["usageDeltas", "usageRollups"]);
    expect(tablesErasedAt("keys")).toEqual(["tenantKeys", "tenantJwt"]);
    expect(tablesErasedAt("database")).toEqual(["adoptedDatabases"]);
  });
});

describe("eraseRetryDelay", () => {
  it("backs off from about a second to at most five minutes", () => {
    expect(eraseRetryDelay(1, 0)).toBe(500);
    expect(eraseRetryDelay(1, 0.999)).toBeLessThanOrEqual(1_000);
    expect(eraseRetryDelay(3, 0)).toBe(2_000);
    expect(eraseRetryDelay(30, 0.999)).toBeLessThanOrEqual(300_000);
    expect(eraseRetryDelay(30, 0)).toBe(150_000);
  });
});
