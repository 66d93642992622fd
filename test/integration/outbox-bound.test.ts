/**
 * The object's outboxes while the control plane is away (issue 16): each keeps at most
 * `outboxBound` rows; past it the oldest rows no flush has tried are summarised (usage summed,
 * events counted), never dropped, and rows a flush may already have appended are never merged.
 * Runs the real storage class on a Durable Object's own SQLite in workerd.
 */
import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { outboxBound, TenantStorage } from "../../src/tenant-object/storage.ts";
import { uniqueTenantId } from "./harness.ts";

const delta = { queries: 1, rowsReturned: 2, errors: 1, leaseMs: 3, poolStarts: 1 };

/** A TenantObject's storage for an id never provisioned: nothing else writes to it. */
function withStorage<T>(work: (storage: TenantStorage) => Promise<T>): Promise<T> {
  const stub = env.TENANTS.getByName(uniqueTenantId("outbox-bound"));
  return runInDurableObject(stub, async (_instance, state) => {
    const storage = new TenantStorage(state.storage);
    await storage.open();
    return work(storage);
  });
}

function drain<T extends { seq: number }>(page: () => T[], forget: (upTo: number) => void): T[] {
  const all: T[] = [];
  for (let rows = page(); rows.length > 0; rows = page()) {
    all.push(...rows);
    forget(rows.at(-1)?.seq ?? 0);
  }
  return all;
}

describe("outboxes past their bound", () => {
  it("usage: the oldest untried rows are summed into one, the totals are exact, and tried rows stay as they were", async () => {
    await withStorage(async (storage) => {
      const staged = outboxBound + 1;
      for (let i = 0; i < 10; i++) storage.stageUsage(delta);
      // A flush sent these ten and failed: they may already be in the control plane.
      const tried = storage.pendingUsage().at(-1)?.seq ?? 0;
      storage.markAttempted(null, tried);
      for (let i = 10; i < staged; i++) storage.stageUsage(delta);

      const rows = drain(
        () => storage.pendingUsage(),
        (upTo) => storage.forgetUsage(upTo),
      );
      // One past the bound: the oldest half no flush tried became one row.
      expect(rows.length).toBe(staged - Math.floor(outboxBound / 2) + 1);
      // Nothing lost: every counter sums to what was staged.
      for (const key of Object.keys(delta) as (keyof typeof delta)[]) {
        expect(rows.reduce((n, row) => n + row[key], 0)).toBe(staged * delta[key]);
      }
      // The ten tried rows are untouched (same seq, one delta each), ahead of the summary.
      expect(rows.slice(0, 10).map((row) => [row.seq, row.queries])).toEqual(
        Array.from({ length: 10 }, (_, i) => [i + 1, 1]),
      );
      const summary = rows[10];
      expect(summary?.queries).toBe(Math.floor(outboxBound / 2));
      expect(summary?.seq).toBe(11);
      // Order is kept: sequence numbers only rise.
      expect(rows.every((row, i) => i === 0 || row.seq > (rows[i - 1]?.seq ?? 0))).toBe(true);
    });
  });

  it("events: the oldest untried events become one that counts them; tried events stay", async () => {
    await withStorage(async (storage) => {
      const appended = outboxBound + 1;
      for (let i = 0; i < 5; i++) storage.appendEvent(1, "stopped", "starting", "demand");
      storage.markAttempted(storage.pendingEvents().at(-1)?.seq ?? 0, null);
      for (let i = 5; i < appended; i++) storage.appendEvent(1 + i, "starting", "ready", "pool_ready");

      const rows = drain(
        () => storage.pendingEvents(),
        (upTo) => storage.forgetEvents(upTo),
      );
      expect(rows.length).toBe(appended - Math.floor(outboxBound / 2) + 1);
      expect(rows.slice(0, 5).every((row) => row.reason === "demand")).toBe(true);
      const summary = rows[5];
      expect(summary?.reason).toMatch(
        new RegExp(
          `^outbox_summarised: ${Math.floor(outboxBound / 2)} events from .* \\(control plane unreachable\\)$`,
        ),
      );
      // The summary spans from the first summarised event's state to the last one's generation.
      expect(summary?.generation).toBe(5 + Math.floor(outboxBound / 2));
      // Counted, not dropped: the summary's count plus the rows kept is every event appended.
      expect(rows.length - 1 + Math.floor(outboxBound / 2)).toBe(appended);
    });
  });
});
