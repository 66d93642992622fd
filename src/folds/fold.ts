/**
 * The fold: drains the append-only usage deltas into the per-tenant rollups and trims the
 * generation ledger, the lifecycle events and its own outcomes to their retention, all in one
 * control-plane transaction, and only while no backend genuinely pins the horizon (horizon.ts).
 *
 * It runs over any node-postgres-shaped client, so the Worker (Neon driver) and the benchmark
 * (node-postgres) run the same code. Every run appends one outcome row, whatever happened.
 *
 * Safe to run twice, concurrently or killed half way: the advisory lock serializes runs (a busy
 * lock skips the tick), and everything a run changes commits or rolls back together.
 */

import { describeFailure } from "../errors/index.ts";
import type { Queryable } from "../postgres/queryable.ts";
import {
  type BackendActivity,
  decideHorizon,
  type HorizonDecision,
  type HorizonObservation,
  type PreparedTransaction,
  type ReplicationSlot,
} from "./horizon.ts";
import type { FoldOptions } from "./options.ts";
import type { FoldOutcome } from "./outcome.ts";
import { outcomeColumns } from "./outcome.ts";
import {
  appendFoldOutcomeSql,
  boundFoldSql,
  foldDeltasSql,
  foldLockKey,
  observeHorizonSql,
  trimFoldOutcomesSql,
  trimGenerationLedgerSql,
  trimLifecycleEventsSql,
  tryFoldLockSql,
} from "./sql.ts";

/** One run: the outcome, the id of its `fold_outcomes` row, and what the gate could not see. */
export interface FoldRun {
  id: string | null;
  outcome: FoldOutcome;
  /** Backends of the control-plane database whose state the fold's role may not read. */
  unobservableBackends: number;
}

function int(value: unknown): number {
  const n = typeof value === "number" ? value : Number(value);
  if (!Number.isFinite(n)) throw new TypeError(`expected a number, got ${typeof value}`);
  return n;
}

function nullableNumber(value: unknown): number | null {
  return value === null || value === undefined ? null : int(value);
}

function nullableString(value: unknown): string | null {
  return value === null || value === undefined ? null : String(value);
}

function jsonArray(value: unknown): Record<string, unknown>[] {
  const parsed: unknown = typeof value === "string" ? JSON.parse(value) : value;
  if (!Array.isArray(parsed)) throw new TypeError("expected a JSON array");
  return parsed as Record<string, unknown>[];
}

/** Reads the horizon observation (`observeHorizonSql`) on `client`'s own backend. */
export async function observeHorizon(
  client: Queryable,
): Promise<{ observation: HorizonObservation; unobservableBackends: number }> {
  const { rows } = await client.query(observeHorizonSql);
  const row = rows[0];
  if (!row) throw new Error("horizon observation returned no row");
  const backends: BackendActivity[] = jsonArray(row.backends).map((b) => ({
    pid: int(b.pid),
    database: nullableString(b.database),
    state: nullableString(b.state),
    backendXid: nullableString(b.backendXid),
    backendXmin: nullableString(b.backendXmin),
    xactStart: nullableNumber(b.xactStart),
    lazyVacuum: b.lazyVacuum === true,
  }));
  const prepared: PreparedTransaction[] = jsonArray(row.prepared).map((p) => ({
    gid: String(p.gid),
    database: nullableString(p.database),
    prepared: int(p.prepared),
  }));
  const slots: ReplicationSlot[] = jsonArray(row.slots).map((s) => ({
    slot: String(s.slot),
    active: s.active === true,
    xmin: nullableString(s.xmin),
    catalogXmin: nullableString(s.catalogXmin),
    xminAge: nullableNumber(s.xminAge),
    inactiveSince: nullableNumber(s.inactiveSince),
  }));
  return {
    observation: {
      now: int(row.now_ms),
      ownPid: int(row.own_pid),
      database: String(row.database),
      backends,
      prepared,
      slots,
    },
    unobservableBackends: int(row.unobservable),
  };
}

/** The gate's verdict, observed on `client`'s own backend. */
export async function checkHorizon(
  client: Queryable,
  options: FoldOptions,
): Promise<{ decision: HorizonDecision; unobservableBackends: number }> {
  const { observation, unobservableBackends } = await observeHorizon(client);
  return { decision: decideHorizon(observation, options), unobservableBackends };
}

async function trimmed(client: Queryable, text: string, days: number, limit: number): Promise<number> {
  const { rows } = await client.query(text, [days, limit]);
  return int(rows[0]?.trimmed ?? 0);
}

/**
 * Runs one fold on `client` (which must not be inside a transaction) and appends its outcome.
 * A failure rolls everything back, appends a `failed` outcome if it still can, and is rethrown.
 */
export async function runFold(
  client: Queryable,
  options: FoldOptions,
  run: { scheduledAt: number | null; clock?: () => number },
): Promise<FoldRun> {
  const clock = run.clock ?? Date.now;
  const startedAt = clock();
  let unobservableBackends = 0;
  try {
    await client.query("BEGIN");
    await client.query(boundFoldSql, [options.statementTimeoutMs]);
    const { rows: lockRows } = await client.query(tryFoldLockSql, [foldLockKey]);
    let outcome: FoldOutcome;
    if (lockRows[0]?.locked !== true) {
      outcome = { kind: "skipped_lock_busy", durationMs: 0 };
    } else {
      const gate = await checkHorizon(client, options);
      unobservableBackends = gate.unobservableBackends;
      if (gate.decision.pinned) {
        const { pinned: _, ...pin } = gate.decision;
        outcome = { kind: "skipped_pinned", pin, durationMs: 0 };
      } else {
        const { rows } = await client.query(foldDeltasSql, [options.batchSize]);
        const drained = int(rows[0]?.drained ?? 0);
        const folded = int(rows[0]?.folded ?? 0);
        outcome = {
          kind: "folded",
          foldedRows: folded,
          replayedRows: drained - folded,
          tenants: int(rows[0]?.tenants ?? 0),
          backlogRemains: drained >= options.batchSize,
          trimmedGenerations: await trimmed(
            client,
            trimGenerationLedgerSql,
            options.generationLedgerRetentionDays,
            options.trimBatchSize,
          ),
          trimmedEvents: await trimmed(
            client,
            trimLifecycleEventsSql,
            options.lifecycleEventsRetentionDays,
            options.trimBatchSize,
          ),
          trimmedOutcomes: await trimmed(
            client,
            trimFoldOutcomesSql,
            options.outcomesRetentionDays,
            options.trimBatchSize,
          ),
          durationMs: 0,
        };
      }
    }
    outcome.durationMs = clock() - startedAt;
    const id = await appendOutcome(client, run.scheduledAt, outcome);
    await client.query("COMMIT");
    return { id, outcome, unobservableBackends };
  } catch (error) {
    await client.query("ROLLBACK").catch(() => undefined);
    const failed: FoldOutcome = {
      kind: "failed",
      message: describeFailure(error),
      durationMs: clock() - startedAt,
    };
    await appendOutcome(client, run.scheduledAt, failed).catch(() => undefined);
    throw error;
  }
}

async function appendOutcome(
  client: Queryable,
  scheduledAt: number | null,
  outcome: FoldOutcome,
): Promise<string | null> {
  const { rows } = await client.query(appendFoldOutcomeSql, [scheduledAt, ...outcomeColumns(outcome)]);
  return nullableString(rows[0]?.id);
}
