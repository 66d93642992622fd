/**
 * The operator's view of the folds (`GET /v1/maintenance`): recent outcomes, counters over the
 * retained outcomes, the deltas backlog, and the horizon gate's verdict right now. A horizon
 * pinned for long shows up here as a growing backlog next to a run of `skipped_pinned` outcomes.
 */
import type { Queryable } from "../postgres/queryable.ts";
import { checkHorizon } from "./fold.ts";
import { describePin, type HorizonPin } from "./horizon.ts";
import type { FoldOptions } from "./options.ts";
import { describeFoldOutcome, type FoldOutcome, type FoldOutcomeKind } from "./outcome.ts";

export interface OutcomeView {
  id: string;
  scheduledAt: string | null;
  startedAt: string;
  durationMs: number;
  outcome: FoldOutcomeKind;
  summary: string;
  foldedRows: number;
  replayedRows: number;
  backlogRemains: boolean;
  trimmedGenerations: number;
  trimmedEvents: number;
  trimmedOutcomes: number;
  pin: HorizonPin | null;
  message: string | null;
}

export interface MaintenanceStatus {
  horizon: ({ pinned: false } | ({ pinned: true; description: string } & HorizonPin)) & {
    unobservableBackends: number;
  };
  backlog: { deltas: number; oldestAt: string | null; oldestAgeSeconds: number | null };
  /** Totals over the outcomes still retained (since `since`). */
  counters: {
    since: string | null;
    runs: number;
    foldedRuns: number;
    foldedRows: number;
    replayedRows: number;
    skippedPinned: number;
    skippedLockBusy: number;
    failed: number;
    lastRunAt: string | null;
    lastFoldedAt: string | null;
  };
  outcomes: OutcomeView[];
  nextCursor: string | null;
}

const outcomesPageSql = `
SELECT id::text AS id,
       (extract(epoch FROM scheduled_at) * 1000)::float8 AS scheduled_at,
       (extract(epoch FROM started_at) * 1000)::float8 AS started_at,
       duration_ms, outcome, folded_rows, replayed_rows, backlog_remains,
       trimmed_generations, trimmed_events, trimmed_outcomes,
       pin_kind, pin_pid, pin_gid, pin_slot, pin_seconds, message
  FROM fold_outcomes
 WHERE $1::bigint IS NULL OR id < $1::bigint
 ORDER BY id DESC
 LIMIT $2::int
`;

const countersSql = `
SELECT count(*)::int AS runs,
       count(*) FILTER (WHERE outcome = 'folded')::int AS folded_runs,
       coalesce(sum(folded_rows), 0)::float8 AS folded_rows,
       coalesce(sum(replayed_rows), 0)::float8 AS replayed_rows,
       count(*) FILTER (WHERE outcome = 'skipped_pinned')::int AS skipped_pinned,
       count(*) FILTER (WHERE outcome = 'skipped_lock_busy')::int AS skipped_lock_busy,
       count(*) FILTER (WHERE outcome = 'failed')::int AS failed,
       (extract(epoch FROM min(started_at)) * 1000)::float8 AS since,
       (extract(epoch FROM max(started_at)) * 1000)::float8 AS last_run_at,
       (extract(epoch FROM max(started_at) FILTER (WHERE outcome = 'folded')) * 1000)::float8 AS last_folded_at
  FROM fold_outcomes
`;

const backlogSql = `
SELECT count(*)::float8 AS deltas,
       (extract(epoch FROM min(at)) * 1000)::float8 AS oldest,
       (extract(epoch FROM now()) * 1000)::float8 AS now
  FROM usage_deltas
`;

function num(value: unknown): number {
  return typeof value === "number" ? value : Number(value ?? 0);
}

function iso(value: unknown): string | null {
  return value === null || value === undefined ? null : new Date(num(value)).toISOString();
}

function str(value: unknown): string | null {
  return value === null || value === undefined ? null : String(value);
}

function isOutcomeKind(value: unknown): value is FoldOutcomeKind {
  return (
    value === "folded" || value === "skipped_pinned" || value === "skipped_lock_busy" || value === "failed"
  );
}

function pinFromRow(row: Record<string, unknown>): HorizonPin | null {
  const seconds = row.pin_seconds === null ? null : num(row.pin_seconds);
  switch (row.pin_kind) {
    case "idle_in_transaction":
    case "long_transaction":
      return { kind: row.pin_kind, pid: num(row.pin_pid), seconds: seconds ?? 0 };
    case "prepared_transaction":
      return { kind: row.pin_kind, gid: String(row.pin_gid), seconds: seconds ?? 0 };
    case "replication_slot":
      return { kind: row.pin_kind, slot: String(row.pin_slot), seconds, xminAge: null };
    default:
      return null;
  }
}

/** Rebuilds the outcome a `fold_outcomes` row records. */
export function outcomeFromRow(row: Record<string, unknown>): OutcomeView {
  const kind = isOutcomeKind(row.outcome) ? row.outcome : "failed";
  const pin = pinFromRow(row);
  const durationMs = num(row.duration_ms);
  let outcome: FoldOutcome;
  if (kind === "folded") {
    outcome = {
      kind,
      foldedRows: num(row.folded_rows),
      replayedRows: num(row.replayed_rows),
      tenants: 0,
      backlogRemains: row.backlog_remains === true,
      trimmedGenerations: num(row.trimmed_generations),
      trimmedEvents: num(row.trimmed_events),
      trimmedOutcomes: num(row.trimmed_outcomes),
      durationMs,
    };
  } else if (kind === "skipped_pinned" && pin) {
    outcome = { kind, pin, durationMs };
  } else if (kind === "skipped_lock_busy") {
    outcome = { kind, durationMs };
  } else {
    outcome = { kind: "failed", message: str(row.message) ?? "unknown", durationMs };
  }
  return {
    id: String(row.id),
    scheduledAt: iso(row.scheduled_at),
    startedAt: iso(row.started_at) ?? new Date(0).toISOString(),
    durationMs,
    outcome: kind,
    summary: describeFoldOutcome(outcome),
    foldedRows: num(row.folded_rows),
    replayedRows: num(row.replayed_rows),
    backlogRemains: row.backlog_remains === true,
    trimmedGenerations: num(row.trimmed_generations),
    trimmedEvents: num(row.trimmed_events),
    trimmedOutcomes: num(row.trimmed_outcomes),
    pin,
    message: str(row.message),
  };
}

/**
 * Reads the whole status in one read-only REPEATABLE READ transaction, so the outcomes, the
 * counters and the backlog agree with each other.
 */
export async function readMaintenanceStatus(
  client: Queryable,
  options: FoldOptions,
  page: { before: string | null; limit: number },
): Promise<MaintenanceStatus> {
  await client.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  try {
    const { decision, unobservableBackends } = await checkHorizon(client, options);
    const { rows: outcomeRows } = await client.query(outcomesPageSql, [page.before, page.limit + 1]);
    const { rows: counterRows } = await client.query(countersSql);
    const { rows: backlogRows } = await client.query(backlogSql);
    await client.query("COMMIT");

    const outcomes = outcomeRows.slice(0, page.limit).map(outcomeFromRow);
    const c = counterRows[0] ?? {};
    const b = backlogRows[0] ?? {};
    const oldest = b.oldest === null || b.oldest === undefined ? null : num(b.oldest);
    const horizon: MaintenanceStatus["horizon"] = decision.pinned
      ? { ...decision, description: describePin(decision), unobservableBackends }
      : { pinned: false, unobservableBackends };
    return {
      horizon,
      backlog: {
        deltas: num(b.deltas),
        oldestAt: iso(oldest),
        oldestAgeSeconds: oldest === null ? null : Math.max(0, Math.round((num(b.now) - oldest) / 1000)),
      },
      counters: {
        since: iso(c.since),
        runs: num(c.runs),
        foldedRuns: num(c.folded_runs),
        foldedRows: num(c.folded_rows),
        replayedRows: num(c.replayed_rows),
        skippedPinned: num(c.skipped_pinned),
        skippedLockBusy: num(c.skipped_lock_busy),
        failed: num(c.failed),
        lastRunAt: iso(c.last_run_at),
        lastFoldedAt: iso(c.last_folded_at),
      },
      outcomes,
      nextCursor: outcomeRows.length > page.limit ? (outcomes.at(-1)?.id ?? null) : null,
    };
  } catch (error) {
    await client.query("ROLLBACK").catch(() => undefined);
    throw error;
  }
}
