import { describe, expect, it } from "vitest";
import { LessorError } from "../../src/errors/index.ts";
import { runFold } from "../../src/folds/fold.ts";
import { defaultFoldOptions, foldOptionsFromVars } from "../../src/folds/options.ts";
import { describeFoldOutcome, outcomeColumns } from "../../src/folds/outcome.ts";
import {
  appendFoldOutcomeSql,
  foldDeltasSql,
  observeHorizonSql,
  trimFoldOutcomesSql,
  trimGenerationLedgerSql,
  trimLifecycleEventsSql,
  tryFoldLockSql,
} from "../../src/folds/sql.ts";
import { outcomeFromRow } from "../../src/folds/status.ts";
import type { Queryable } from "../../src/postgres/queryable.ts";

const now = Date.parse("2026-11-29T12:00:00Z");

interface Call {
  text: string;
  params: unknown[];
}

/** A scripted client: answers each statement from `answers`, records every call. */
function scriptedClient(answers: (text: string) => Record<string, unknown>[] | Error): {
  client: Queryable;
  calls: Call[];
} {
  const calls: Call[] = [];
  return {
    calls,
    client: {
      async query(text: string, params: unknown[] = []) {
        calls.push({ text, params });
        const answer = answers(text);
        if (answer instanceof Error) throw answer;
        return { rows: answer };
      },
    },
  };
}

function observation(backends: unknown[] = []): Record<string, unknown> {
  return {
    own_pid: 1,
    database: "lessor",
    now_ms: now,
    backends: JSON.stringify(backends),
    prepared: "[]",
    slots: "[]",
    unobservable: 0,
  };
}

function answers(parts: { locked?: boolean; backends?: unknown[]; fold?: Error } = {}) {
  return (text: string): Record<string, unknown>[] | Error => {
    if (text === tryFoldLockSql) return [{ locked: parts.locked ?? true }];
    if (text === observeHorizonSql) return [observation(parts.backends)];
    if (text === foldDeltasSql) return parts.fold ?? [{ drained: 12, folded: 10, tenants: 3 }];
    if ([trimGenerationLedgerSql, trimLifecycleEventsSql, trimFoldOutcomesSql].includes(text))
      return [{ trimmed: 2 }];
    if (text === appendFoldOutcomeSql) return [{ id: "41" }];
    return [];
  };
}

const clock = () => now;

describe("runFold", () => {
  it("folds, trims and appends its outcome in one transaction", async () => {
    const { client, calls } = scriptedClient(answers());
    const run = await runFold(client, { ...defaultFoldOptions, batchSize: 12 }, { scheduledAt: now, clock });
    expect(run).toEqual({
      id: "41",
      unobservableBackends: 0,
      outcome: {
        kind: "folded",
        foldedRows: 10,
        replayedRows: 2,
        tenants: 3,
        backlogRemains: true,
        trimmedGenerations: 2,
        trimmedEvents: 2,
        trimmedOutcomes: 2,
        durationMs: 0,
      },
    });
    const texts = calls.map((call) => call.text);
    expect(texts[0]).toBe("BEGIN");
    expect(texts.at(-1)).toBe("COMMIT");
    // The lock is taken before the horizon is looked at, and the horizon before anything is deleted.
    expect(texts.indexOf(tryFoldLockSql)).toBeLessThan(texts.indexOf(observeHorizonSql));
    expect(texts.indexOf(observeHorizonSql)).toBeLessThan(texts.indexOf(foldDeltasSql));
    expect(calls.find((call) => call.text === foldDeltasSql)?.params).toEqual([12]);
    expect(calls.find((call) => call.text === appendFoldOutcomeSql)?.params.slice(0, 3)).toEqual([
      now,
      0,
      "folded",
    ]);
  });

  it("skips the tick when the lock is busy, deleting nothing", async () => {
    const { client, calls } = scriptedClient(answers({ locked: false }));
    const run = await runFold(client, defaultFoldOptions, { scheduledAt: null, clock });
    expect(run.outcome).toEqual({ kind: "skipped_lock_busy", durationMs: 0 });
    const texts = calls.map((call) => call.text);
    expect(texts).not.toContain(observeHorizonSql);
    expect(texts).not.toContain(foldDeltasSql);
    expect(texts).toContain(appendFoldOutcomeSql);
    expect(texts.at(-1)).toBe("COMMIT");
  });

  it("stands down while the horizon is pinned, deleting nothing", async () => {
    const pin = {
      pid: 77,
      database: "lessor",
      state: "idle in transaction",
      backendXid: "900",
      backendXmin: null,
      xactStart: now - 12_000,
    };
    const { client, calls } = scriptedClient(answers({ backends: [pin] }));
    const run = await runFold(client, defaultFoldOptions, { scheduledAt: now, clock });
    expect(run.outcome).toEqual({
      kind: "skipped_pinned",
      pin: { kind: "idle_in_transaction", pid: 77, seconds: 12 },
      durationMs: 0,
    });
    expect(describeFoldOutcome(run.outcome)).toBe("skipped: pinned by pid 77 for 12 seconds");
    const texts = calls.map((call) => call.text);
    for (const deleting of [foldDeltasSql, trimGenerationLedgerSql, trimLifecycleEventsSql]) {
      expect(texts).not.toContain(deleting);
    }
    const appended = calls.find((call) => call.text === appendFoldOutcomeSql)?.params;
    expect(appended?.[2]).toBe("skipped_pinned");
    expect(appended?.slice(9)).toEqual(["idle_in_transaction", 77, null, null, 12, null]);
  });

  it("does not stand down for a young snapshot", async () => {
    const reader = {
      pid: 78,
      database: "lessor",
      state: "idle in transaction",
      backendXid: null,
      backendXmin: "900",
      xactStart: now - 500,
    };
    const { client } = scriptedClient(answers({ backends: [reader] }));
    const run = await runFold(client, defaultFoldOptions, { scheduledAt: now, clock });
    expect(run.outcome.kind).toBe("folded");
  });

  it("rolls back, records a failed outcome and rethrows when a statement fails", async () => {
    const boom = new Error("canceling statement due to statement timeout");
    const { client, calls } = scriptedClient(answers({ fold: boom }));
    await expect(runFold(client, defaultFoldOptions, { scheduledAt: now, clock })).rejects.toBe(boom);
    const texts = calls.map((call) => call.text);
    expect(texts).toContain("ROLLBACK");
    expect(texts).not.toContain("COMMIT");
    // The failure is appended after the rollback, outside the failed transaction.
    expect(texts.lastIndexOf(appendFoldOutcomeSql)).toBeGreaterThan(texts.indexOf("ROLLBACK"));
    const appended = calls.findLast((call) => call.text === appendFoldOutcomeSql)?.params;
    expect(appended?.[2]).toBe("failed");
    expect(appended?.at(-1)).toContain("statement timeout");
  });

  it("still rethrows the original error when the failure cannot be recorded", async () => {
    const boom = new Error("connection lost");
    const { client } = scriptedClient(() => boom);
    await expect(runFold(client, defaultFoldOptions, { scheduledAt: now, clock })).rejects.toBe(boom);
  });
});

describe("fold outcomes", () => {
  it("reads as the issue words them", () => {
    const folded = {
      kind: "folded",
      foldedRows: 120,
      replayedRows: 0,
      tenants: 3,
      backlogRemains: false,
      trimmedGenerations: 0,
      trimmedEvents: 0,
      trimmedOutcomes: 0,
      durationMs: 5,
    } as const;
    expect(describeFoldOutcome(folded)).toBe("folded 120 rows");
    expect(describeFoldOutcome({ ...folded, foldedRows: 1 })).toBe("folded 1 row");
    expect(
      describeFoldOutcome({ ...folded, replayedRows: 2, trimmedGenerations: 4, backlogRemains: true }),
    ).toBe("folded 120 rows (2 replayed rows dropped; trimmed 4 generations; backlog remains)");
    expect(describeFoldOutcome({ kind: "skipped_lock_busy", durationMs: 1 })).toBe("skipped: lock busy");
    expect(describeFoldOutcome({ kind: "failed", message: "x", durationMs: 1 })).toBe("failed: x");
  });

  it("round-trips through a fold_outcomes row", () => {
    const outcome = {
      kind: "skipped_pinned",
      pin: { kind: "prepared_transaction", gid: "g1", seconds: 3.5 },
      durationMs: 4,
    } as const;
    const [durationMs, kind, foldedRows, replayedRows, backlogRemains, tg, te, to, pk, pp, pg, ps, sec, msg] =
      outcomeColumns(outcome);
    const view = outcomeFromRow({
      id: "9",
      scheduled_at: null,
      started_at: now,
      duration_ms: durationMs,
      outcome: kind,
      folded_rows: foldedRows,
      replayed_rows: replayedRows,
      backlog_remains: backlogRemains,
      trimmed_generations: tg,
      trimmed_events: te,
      trimmed_outcomes: to,
      pin_kind: pk,
      pin_pid: pp,
      pin_gid: pg,
      pin_slot: ps,
      pin_seconds: sec,
      message: msg,
    });
    expect(view).toMatchObject({
      id: "9",
      outcome: "skipped_pinned",
      summary: "skipped: pinned by prepared transaction 'g1' for 3.5 seconds",
      pin: { kind: "prepared_transaction", gid: "g1", seconds: 3.5 },
      startedAt: new Date(now).toISOString(),
      scheduledAt: null,
    });
  });
});

describe("fold options", () => {
  it("defaults when no var is set", () => {
    expect(foldOptionsFromVars({})).toEqual(defaultFoldOptions);
  });

  it("reads overrides by name", () => {
    const options = foldOptionsFromVars({
      LESSOR_FOLD_BATCH_SIZE: "1000",
      LESSOR_FOLD_PIN_THRESHOLD_MS: "2500",
      LESSOR_LIFECYCLE_EVENTS_RETENTION_DAYS: "0.5",
      LESSOR_FOLD_TRIM_BATCH_SIZE: "",
    });
    expect(options).toMatchObject({
      batchSize: 1000,
      pinThresholdMs: 2500,
      lifecycleEventsRetentionDays: 0.5,
      trimBatchSize: defaultFoldOptions.trimBatchSize,
    });
  });

  it("refuses a malformed value, naming the var but not the value", () => {
    for (const bad of ["0", "-1", "lots", "1.5"]) {
      let error: unknown;
      try {
        foldOptionsFromVars({ LESSOR_FOLD_BATCH_SIZE: bad });
      } catch (caught) {
        error = caught;
      }
      expect(error).toBeInstanceOf(LessorError);
      expect((error as LessorError).code).toBe("misconfigured");
      expect((error as LessorError).message).toContain("LESSOR_FOLD_BATCH_SIZE");
    }
  });
});
