/** What one fold run did, as it is appended to `fold_outcomes`, logged and shown to operators. */
import { describePin, type HorizonPin } from "./horizon.ts";

export type FoldOutcome =
  | {
      kind: "folded";
      /** Deltas drained and counted into the rollups. */
      foldedRows: number;
      /** Deltas drained that were replays of already-folded flushes (dropped, not counted). */
      replayedRows: number;
      /** Tenants whose rollup changed. */
      tenants: number;
      /** The batch was full: more deltas are waiting for the next run. */
      backlogRemains: boolean;
      trimmedGenerations: number;
      trimmedEvents: number;
      trimmedOutcomes: number;
      durationMs: number;
    }
  | { kind: "skipped_pinned"; pin: HorizonPin; durationMs: number }
  | { kind: "skipped_lock_busy"; durationMs: number }
  | { kind: "failed"; message: string; durationMs: number };

export type FoldOutcomeKind = FoldOutcome["kind"];

/** "folded N rows", "skipped: pinned by pid P for S seconds", "skipped: lock busy", "failed: …". */
export function describeFoldOutcome(outcome: FoldOutcome): string {
  switch (outcome.kind) {
    case "folded": {
      const extras = [
        outcome.replayedRows > 0 ? `${outcome.replayedRows} replayed rows dropped` : null,
        outcome.trimmedGenerations > 0 ? `trimmed ${outcome.trimmedGenerations} generations` : null,
        outcome.trimmedEvents > 0 ? `trimmed ${outcome.trimmedEvents} lifecycle events` : null,
        outcome.trimmedOutcomes > 0 ? `trimmed ${outcome.trimmedOutcomes} fold outcomes` : null,
        outcome.backlogRemains ? "backlog remains" : null,
      ].filter((part) => part !== null);
      const rows = `folded ${outcome.foldedRows} ${outcome.foldedRows === 1 ? "row" : "rows"}`;
      return extras.length === 0 ? rows : `${rows} (${extras.join("; ")})`;
    }
    case "skipped_pinned":
      return `skipped: pinned by ${describePin(outcome.pin)}`;
    case "skipped_lock_busy":
      return "skipped: lock busy";
    case "failed":
      return `failed: ${outcome.message}`;
  }
}

/** The columns of a `fold_outcomes` row, in `appendFoldOutcomeSql` parameter order after `$1`. */
export function outcomeColumns(outcome: FoldOutcome): unknown[] {
  const folded = outcome.kind === "folded" ? outcome : null;
  const pin = outcome.kind === "skipped_pinned" ? outcome.pin : null;
  return [
    Math.round(outcome.durationMs),
    outcome.kind,
    folded?.foldedRows ?? 0,
    folded?.replayedRows ?? 0,
    folded?.backlogRemains ?? false,
    folded?.trimmedGenerations ?? 0,
    folded?.trimmedEvents ?? 0,
    folded?.trimmedOutcomes ?? 0,
    pin?.kind ?? null,
    pin && "pid" in pin ? pin.pid : null,
    pin?.kind === "prepared_transaction" ? pin.gid : null,
    pin?.kind === "replication_slot" ? pin.slot : null,
    pin?.seconds ?? null,
    outcome.kind === "failed" ? outcome.message : null,
  ];
}
