/**
 * Fold settings: how much one run may do, how long ledgers are kept, and the horizon policy.
 * Each can be overridden by an optional Worker var (`LESSOR_FOLD_*`); the defaults suit a
 * one-minute cron.
 */
import { LessorError } from "../errors/index.ts";
import { defaultHorizonPolicy, type HorizonPolicy } from "./horizon.ts";

export interface FoldOptions extends HorizonPolicy {
  /** Most usage deltas one run drains. Bounds a run's time; a full batch reports `backlogRemains`. */
  batchSize: number;
  /** Most rows one run trims from each ledger. */
  trimBatchSize: number;
  /** Lifecycle events older than this are trimmed. */
  lifecycleEventsRetentionDays: number;
  /** Generation-ledger rows older than this are trimmed, except each tenant's highest generation. */
  generationLedgerRetentionDays: number;
  /** Fold outcomes older than this are trimmed (the counters at `GET /v1/maintenance` cover this window). */
  outcomesRetentionDays: number;
  /** `statement_timeout` inside the fold's transaction: a run never outlives its tick. */
  statementTimeoutMs: number;
}

export const defaultFoldOptions: FoldOptions = {
  ...defaultHorizonPolicy,
  batchSize: 50_000,
  trimBatchSize: 10_000,
  lifecycleEventsRetentionDays: 30,
  generationLedgerRetentionDays: 30,
  outcomesRetentionDays: 7,
  statementTimeoutMs: 20_000,
};

/** The Worker var that overrides each option. */
export const foldOptionVars: Readonly<Record<keyof FoldOptions, string>> = {
  pinThresholdMs: "LESSOR_FOLD_PIN_THRESHOLD_MS",
  slotXminAgeLimit: "LESSOR_FOLD_SLOT_XMIN_AGE_LIMIT",
  batchSize: "LESSOR_FOLD_BATCH_SIZE",
  trimBatchSize: "LESSOR_FOLD_TRIM_BATCH_SIZE",
  lifecycleEventsRetentionDays: "LESSOR_LIFECYCLE_EVENTS_RETENTION_DAYS",
  generationLedgerRetentionDays: "LESSOR_GENERATION_LEDGER_RETENTION_DAYS",
  outcomesRetentionDays: "LESSOR_FOLD_OUTCOMES_RETENTION_DAYS",
  statementTimeoutMs: "LESSOR_FOLD_STATEMENT_TIMEOUT_MS",
};

/**
 * Reads the overrides from the Worker's vars. They are optional and not declared in
 * wrangler.toml, so they are read by name; a malformed value is `misconfigured`, naming the var.
 */
export function foldOptionsFromVars(vars: object): FoldOptions {
  const options: FoldOptions = { ...defaultFoldOptions };
  for (const key of Object.keys(foldOptionVars) as (keyof FoldOptions)[]) {
    const name = foldOptionVars[key];
    const raw: unknown = Reflect.get(vars, name);
    if (raw === undefined || raw === "") continue;
    const value = typeof raw === "number" ? raw : Number(raw);
    const fractional = key.endsWith("RetentionDays");
    if (!Number.isFinite(value) || value <= 0 || (!fractional && !Number.isInteger(value))) {
      throw new LessorError("misconfigured", {
        internal: `${name}: must be a positive ${fractional ? "number" : "integer"}`,
      });
    }
    options[key] = value;
  }
  return options;
}
