/**
 * Tenant erase as plain data: the stage order, what a failed attempt waits, whether an erase may
 * start, and the commit's re-check. The TenantObject runs the stages (src/tenant-object/erase.ts);
 * why the order is safe is docs/adr/011-erase-stage-order.md.
 */
import { backoffDelay } from "./lifecycle.ts";
import { type ErasedTable, eraseStageOf } from "./tenant-data.ts";

/**
 * The stages, in the order they run. Each is idempotent and recorded in the job's progress row
 * before the next starts.
 */
export const eraseStages = [
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
] as const;

export type EraseStage = (typeof eraseStages)[number];

/** The stage after `stage`, or null after the commit. */
export function stageAfter(stage: EraseStage): EraseStage | null {
  return eraseStages[eraseStages.indexOf(stage) + 1] ?? null;
}

export function isEraseStage(value: string): value is EraseStage {
  return (eraseStages as readonly string[]).includes(value);
}

/** A failed attempt waits 1 s, 2 s, 4 s … up to 5 minutes (with jitter) before the next. */
export const eraseBackoff = { baseMs: 1_000, capMs: 300_000 };

/** How long after its `attempts`-th failure the job is tried again. `random` is in [0, 1). */
export function eraseRetryDelay(attempts: number, random: number): number {
  return backoffDelay(attempts, random, eraseBackoff);
}

/** What the object knows when an erase is asked for. */
export interface EraseRequestFacts {
  pinned: boolean;
  force: boolean;
  /** A campaign's migration runs under the object right now. */
  migrating: boolean;
  /** A running campaign holds a live claim on the tenant (its migration call may be on the way). */
  claimedByCampaign: boolean;
}

export type EraseRequestDecision =
  | { kind: "start" }
  | { kind: "refuse"; code: "tenant_pinned" | "tenant_in_campaign" };

/**
 * Whether an erase may start: not while a campaign migrates the tenant (the migration would be cut
 * off half way, and its claim would report a tenant that is gone), and a pinned tenant only when
 * forced (someone pinned it on purpose).
 */
export function eraseRequestDecision(facts: EraseRequestFacts): EraseRequestDecision {
  if (facts.migrating || facts.claimedByCampaign) return { kind: "refuse", code: "tenant_in_campaign" };
  if (facts.pinned && !facts.force) return { kind: "refuse", code: "tenant_pinned" };
  return { kind: "start" };
}

/**
 * Rows that still name the tenant when the commit re-checks, per control-plane table: every table
 * the declaration (core/tenant-data.ts) says an erase deletes from.
 */
export type EraseLeftovers = Record<ErasedTable, number>;

export type RecheckVerdict = { ok: true } | { ok: false; resumeAt: EraseStage; summary: string };

/**
 * The commit's re-check: rows written for the tenant while the erase ran (a key issued, a usage
 * delta flushed, an event appended) must not outlive it. If any remain the commit does not happen;
 * the job goes back to the earliest stage that removes them, and runs on from there (every stage
 * is idempotent, so the ones in between change nothing).
 */
export function recheckVerdict(leftovers: EraseLeftovers): RecheckVerdict {
  const found = (Object.keys(leftovers) as (keyof EraseLeftovers)[]).filter((kind) => leftovers[kind] > 0);
  if (found.length === 0) return { ok: true };
  const resumeAt = eraseStages.find((stage) => found.some((kind) => eraseStageOf(kind) === stage)) ?? "keys";
  const summary = `commit re-check: written during the erase: ${found
    .map((kind) => `${leftovers[kind]} ${kind}`)
    .join(", ")}; resuming at ${resumeAt}`;
  return { ok: false, resumeAt, summary };
}

/** A stage's counts added to what it counted before (a re-check sent the job back to it). */
export function addCounts(
  before: Record<string, number>,
  now: Record<string, number>,
): Record<string, number> {
  const sum: Record<string, number> = { ...before };
  for (const [name, n] of Object.entries(now)) {
    // Times (waitedMs) and the generation are not amounts: the last one stands.
    sum[name] = name === "waitedMs" || name === "generation" ? n : (sum[name] ?? 0) + n;
  }
  return sum;
}
