/**
 * Migration campaigns as plain data and functions over `now`: what a campaign asks for, which
 * tenants go first, which tenants the next batch claims, when the campaign moves on, what a
 * tenant's migration result means, and whether a contract step may run yet. The runner
 * (src/campaigns/) persists this and performs the I/O each decision asks for; nothing here
 * touches a runtime.
 *
 *     pending ──start──▶ canary ──every canary tenant succeeded──▶ rollout ──nothing left──▶ done
 *        │                  │  └─a canary tenant failed──▶ failed        └─a failure, continueOnFailure off──▶ failed
 *        └──────────────────┴──────────────┴── pause ⇄ resume (paused), cancel (cancelled) ──
 *
 * A tenant inside a campaign:
 *
 *     pending ──claim──▶ running ──migrated──▶ succeeded
 *                          │  │  └─failed──▶ failed
 *                          │  └─leases held / busy──▶ skipped (retryAt) ──due──▶ running …
 *                          └─claim went stale (runner killed)──▶ running (reclaimed)
 */
import * as v from "valibot";

export const campaignStates = [
  "pending",
  "canary",
  "rollout",
  "done",
  "paused",
  "cancelled",
  "failed",
] as const;
export type CampaignState = (typeof campaignStates)[number];
/** The states a tick advances. */
export type ActiveState = "pending" | "canary" | "rollout";
/** The states a campaign never leaves. */
export const finishedStates: readonly CampaignState[] = ["done", "cancelled", "failed"];

export const tenantStates = ["pending", "running", "succeeded", "failed", "skipped"] as const;
export type TenantState = (typeof tenantStates)[number];

export type Cohort = "canary" | "rollout";

/** One bundled tenant migration, as the campaign sees it. */
export interface BundledStep {
  version: number;
  kind: "expand" | "contract";
}

// ── The request ──────────────────────────────────────────────────────────────────────────────────

/** Bounds of a campaign request; each is a guard against a typo taking down a fleet. */
export const campaignLimits = {
  maxConcurrency: 32,
  maxListedTenants: 1_000,
  maxDrainTimeoutMs: 60_000,
  maxStabilityWindowMs: 24 * 3600_000,
} as const;

export const campaignDefaults = {
  concurrency: 4,
  drainTimeoutMs: 10_000,
  stabilityWindowMs: 15 * 60_000,
  /** Attempts before a tenant that keeps being skipped (leases held, unreachable) is given up on. */
  maxAttempts: 10,
  /**
   * A claim older than this is presumed dead (its runner was killed) and may be claimed again. A
   * live tick records every claim within its own bound (30 s; a migration still running then is
   * deferred, not left claimed), so two minutes is past any live one; a longer timeout only kept a
   * killed tick's tenants off the host's migration cap (the chaos soak: two idle minutes, issue 32).
   * Claiming again is safe: the database's ledger applies nothing twice.
   */
  claimTimeoutMs: 2 * 60_000,
} as const;

export type CanaryChoice =
  | { kind: "none" }
  | { kind: "list"; tenants: string[] }
  | { kind: "percent"; percent: number };

/** A validated `POST /v1/campaigns` body. */
export interface CampaignSpec {
  toVersion: number;
  concurrency: number;
  canary: CanaryChoice;
  continueOnFailure: boolean;
  force: boolean;
  drainTimeoutMs: number;
  stabilityWindowMs: number;
  /** Limit the campaign to these tenants; null is the whole fleet. */
  tenants: string[] | null;
  /**
   * Customers' databases (adopted, docs/customer-databases.md): `skip` (the default) leaves them out
   * and counts them; `include` migrates them like every other tenant (the customer asked for it).
   */
  adopted: AdoptedPolicy;
}

export type AdoptedPolicy = "skip" | "include";

/** The fields a campaign request may carry; anything else is refused, so a typo is never ignored. */
const campaignFields = [
  "toVersion",
  "concurrency",
  "canary",
  "canaryPercent",
  "continueOnFailure",
  "force",
  "drainTimeoutMs",
  "stabilityWindowMs",
  "tenants",
  "adopted",
] as const;

/** An integer in [min, max], refused with `message`. */
function boundedInt(min: number, max: number, message: string) {
  return v.pipe(
    v.number(message),
    v.safeInteger(message),
    v.minValue(min, message),
    v.maxValue(max, message),
  );
}

function tenantList(field: string, isTenantId: (raw: unknown) => boolean) {
  return v.pipe(
    v.array(
      v.custom<string>(isTenantId, `${field} holds something that is not a tenant id.`),
      `${field} must be an array of tenant ids.`,
    ),
    v.maxLength(
      campaignLimits.maxListedTenants,
      `${field} may name at most ${campaignLimits.maxListedTenants} tenants.`,
    ),
    v.transform((ids: string[]) => [...new Set(ids)]),
  );
}

/**
 * The schema of a `POST /v1/campaigns` body (valibot, so the route's validator middleware runs it).
 * `isTenantId` is the tenant-id parser (kept out of here so the core does not depend on it);
 * `bundledVersions` is the number of bundled migrations.
 */
export function campaignSpecSchema(bundledVersions: number, isTenantId: (raw: unknown) => boolean) {
  const versionMessage =
    bundledVersions === 0
      ? "No tenant migration is bundled in this deployment."
      : `toVersion must be a bundled schema version, an integer from 1 to ${bundledVersions}.`;
  const flag = (name: string) => v.optional(v.boolean(`${name} must be true or false.`), false);
  return v.pipe(
    v.unknown(),
    v.check(
      (body) => typeof body === "object" && body !== null && !Array.isArray(body),
      "The body must be a JSON object.",
    ),
    // Checked first: naming both is the mistake to report, whatever else is wrong with either.
    v.check(
      (body) => typeof body !== "object" || body === null || !("canary" in body && "canaryPercent" in body),
      "Give either canary or canaryPercent, not both.",
    ),
    v.strictObject(
      {
        toVersion: boundedInt(1, Math.max(1, bundledVersions), versionMessage),
        concurrency: v.optional(
          boundedInt(
            1,
            campaignLimits.maxConcurrency,
            `concurrency must be an integer from 1 to ${campaignLimits.maxConcurrency}.`,
          ),
          campaignDefaults.concurrency,
        ),
        canary: v.optional(
          v.pipe(tenantList("canary", isTenantId), v.minLength(1, "canary must name at least one tenant.")),
        ),
        canaryPercent: v.optional(
          v.pipe(
            v.number("canaryPercent must be a number greater than 0 and at most 100."),
            v.finite("canaryPercent must be a number greater than 0 and at most 100."),
            v.gtValue(0, "canaryPercent must be a number greater than 0 and at most 100."),
            v.maxValue(100, "canaryPercent must be a number greater than 0 and at most 100."),
          ),
        ),
        continueOnFailure: flag("continueOnFailure"),
        force: flag("force"),
        drainTimeoutMs: v.optional(
          boundedInt(
            0,
            campaignLimits.maxDrainTimeoutMs,
            `drainTimeoutMs must be an integer from 0 to ${campaignLimits.maxDrainTimeoutMs}.`,
          ),
          campaignDefaults.drainTimeoutMs,
        ),
        stabilityWindowMs: v.optional(
          boundedInt(
            0,
            campaignLimits.maxStabilityWindowMs,
            `stabilityWindowMs must be an integer from 0 to ${campaignLimits.maxStabilityWindowMs}.`,
          ),
          campaignDefaults.stabilityWindowMs,
        ),
        tenants: v.optional(
          v.pipe(
            tenantList("tenants", isTenantId),
            v.minLength(1, "tenants, when given, must name at least one tenant."),
          ),
        ),
        adopted: v.optional(v.picklist(["skip", "include"], 'adopted must be "skip" or "include".'), "skip"),
      },
      (issue) => {
        const key = issue.path?.[0]?.key;
        if (key === undefined) return "The body must be a JSON object.";
        if (issue.expected === "never") {
          return `Unknown field "${String(key).slice(0, 40)}"; a campaign takes ${campaignFields.join(", ")}.`;
        }
        // A required field is missing: only toVersion is required.
        return versionMessage;
      },
    ),
    v.check(() => bundledVersions > 0, versionMessage),
    v.transform(
      (body): CampaignSpec => ({
        toVersion: body.toVersion,
        concurrency: body.concurrency,
        canary:
          body.canary !== undefined
            ? { kind: "list", tenants: body.canary }
            : body.canaryPercent !== undefined
              ? { kind: "percent", percent: body.canaryPercent }
              : { kind: "none" },
        continueOnFailure: body.continueOnFailure,
        force: body.force,
        drainTimeoutMs: body.drainTimeoutMs,
        stabilityWindowMs: body.stabilityWindowMs,
        tenants: body.tenants ?? null,
        adopted: body.adopted,
      }),
    ),
  );
}

/** Validates a campaign request outside a route (the schema's first problem, if any). */
export function parseCampaignSpec(
  body: unknown,
  bundledVersions: number,
  isTenantId: (raw: unknown) => boolean,
): { ok: true; spec: CampaignSpec } | { ok: false; problem: string } {
  const result = v.safeParse(campaignSpecSchema(bundledVersions, isTenantId), body, { abortEarly: true });
  if (result.success) return { ok: true, spec: result.output };
  return { ok: false, problem: result.issues[0].message };
}

// ── Cohorts ──────────────────────────────────────────────────────────────────────────────────────

export interface PlannedTenant {
  tenantId: string;
  cohort: Cohort;
  /** Order in which the campaign claims tenants: the canary first, then the rest by id. */
  position: number;
}

/**
 * Splits the enrolled tenants into the canary cohort and the rest. Deterministic: the same
 * tenants, choice and seed (the campaign id) always give the same plan, so a plan can be recomputed
 * and checked. A percentage picks `ceil(n × percent / 100)` tenants (at least one) by a hash of
 * seed and tenant id, which spreads the canary across the fleet instead of taking the first ids.
 * Returns the listed canary tenants that are not enrolled, if any: the caller refuses those.
 */
export function planCohorts(
  enrolled: readonly string[],
  canary: CanaryChoice,
  seed: string,
): { ok: true; plan: PlannedTenant[] } | { ok: false; notEnrolled: string[] } {
  const ids = [...new Set(enrolled)].sort();
  let canaryIds: string[];
  switch (canary.kind) {
    case "none":
      canaryIds = [];
      break;
    case "list": {
      const enrolledSet = new Set(ids);
      const notEnrolled = canary.tenants.filter((id) => !enrolledSet.has(id));
      if (notEnrolled.length > 0) return { ok: false, notEnrolled };
      canaryIds = [...new Set(canary.tenants)];
      break;
    }
    case "percent": {
      const count = ids.length === 0 ? 0 : Math.max(1, Math.ceil((ids.length * canary.percent) / 100));
      canaryIds = ids
        .map((id) => ({ id, rank: fnv1a(`${seed}:${id}`) }))
        .sort((a, b) => a.rank - b.rank || (a.id < b.id ? -1 : 1))
        .slice(0, count)
        .map((entry) => entry.id)
        .sort();
      break;
    }
  }
  const canarySet = new Set(canaryIds);
  const plan: PlannedTenant[] = [
    ...canaryIds.map((tenantId) => ({ tenantId, cohort: "canary" as const })),
    ...ids.filter((id) => !canarySet.has(id)).map((tenantId) => ({ tenantId, cohort: "rollout" as const })),
  ].map((entry, position) => ({ ...entry, position }));
  return { ok: true, plan };
}

/** 32-bit FNV-1a: a stable, dependency-free hash for the canary draw (not for security). */
export function fnv1a(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    hash ^= text.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193) >>> 0;
  }
  return hash;
}

// ── Progress and phases ──────────────────────────────────────────────────────────────────────────

/** How many tenants of one cohort are in each state. */
export interface CohortTally {
  pending: number;
  running: number;
  succeeded: number;
  failed: number;
  /** Skipped and due to be retried later. */
  skippedRetry: number;
  /** Skipped for good (the tenant is gone, or it kept being skipped). */
  skippedFinal: number;
}

export const emptyTally: CohortTally = {
  pending: 0,
  running: 0,
  succeeded: 0,
  failed: 0,
  skippedRetry: 0,
  skippedFinal: 0,
};

export interface CampaignTally {
  canary: CohortTally;
  rollout: CohortTally;
}

function unfinished(t: CohortTally): number {
  return t.pending + t.running + t.skippedRetry;
}

function total(t: CohortTally): number {
  return unfinished(t) + t.succeeded + t.failed + t.skippedFinal;
}

/** The cohort a campaign in `state` works on; null when it claims nothing. */
export function activeCohort(state: CampaignState): Cohort | null {
  return state === "canary" ? "canary" : state === "rollout" ? "rollout" : null;
}

export interface PhaseDecision {
  state: CampaignState;
  /** Why a campaign failed or finished; null while it runs. */
  reason: string | null;
  /** The campaign stays in its phase but claims no new tenant: it only lets in-flight ones finish. */
  stopping: boolean;
}

/**
 * Where an active campaign stands, given its tally. A campaign that must stop (a canary failure,
 * or a rollout failure with `continueOnFailure` off) first lets its running tenants finish, so no
 * result is left unrecorded, and only then fails. The canary gate holds regardless of
 * `continueOnFailure`: the rest of the fleet follows only a canary that succeeded.
 */
export function decidePhase(
  state: ActiveState,
  continueOnFailure: boolean,
  tally: CampaignTally,
): PhaseDecision {
  const { canary, rollout } = tally;
  if (state === "pending") {
    return { state: total(canary) > 0 ? "canary" : "rollout", reason: null, stopping: false };
  }
  if (state === "canary") {
    if (canary.failed > 0) {
      const reason = `${canary.failed} canary tenant(s) failed; the rest of the fleet was not touched`;
      return canary.running > 0
        ? { state, reason: null, stopping: true }
        : { state: "failed", reason, stopping: false };
    }
    if (unfinished(canary) > 0) return { state, reason: null, stopping: false };
    if (canary.succeeded === 0) {
      return {
        state: "failed",
        reason:
          "no canary tenant could be migrated (all were skipped); the rest of the fleet was not touched",
        stopping: false,
      };
    }
    return { state: "rollout", reason: null, stopping: false };
  }
  if (rollout.failed > 0 && !continueOnFailure) {
    const reason = `${rollout.failed} tenant(s) failed and continueOnFailure is off`;
    return rollout.running > 0
      ? { state, reason: null, stopping: true }
      : { state: "failed", reason, stopping: false };
  }
  if (unfinished(rollout) > 0) return { state, reason: null, stopping: false };
  const failed = rollout.failed;
  const skipped = rollout.skippedFinal + canary.skippedFinal;
  return {
    state: "done",
    reason: failed + skipped === 0 ? null : `finished with ${failed} failed and ${skipped} skipped tenant(s)`,
    stopping: false,
  };
}

// ── Operator control ─────────────────────────────────────────────────────────────────────────────

export type ControlAction = "pause" | "resume" | "cancel";

export type ControlDecision =
  | { kind: "change"; state: CampaignState; pausedFrom: ActiveState | null }
  | { kind: "unchanged" }
  | { kind: "conflict"; message: string };

/**
 * Pause stops new batches (tenants already running finish and are recorded); resume returns to the
 * phase it paused in; cancel stops for good (tenants not yet claimed stay pending). Repeating an
 * action is harmless; acting on a finished campaign is a conflict.
 */
export function controlCampaign(
  state: CampaignState,
  pausedFrom: ActiveState | null,
  action: ControlAction,
): ControlDecision {
  if (finishedStates.includes(state)) {
    if (action === "cancel" && state === "cancelled") return { kind: "unchanged" };
    return { kind: "conflict", message: `The campaign is ${state}; it cannot be ${pastTense(action)}.` };
  }
  switch (action) {
    case "pause":
      return state === "paused"
        ? { kind: "unchanged" }
        : { kind: "change", state: "paused", pausedFrom: state as ActiveState };
    case "resume":
      return state === "paused"
        ? { kind: "change", state: pausedFrom ?? "pending", pausedFrom: null }
        : { kind: "unchanged" };
    case "cancel":
      return { kind: "change", state: "cancelled", pausedFrom: null };
  }
}

function pastTense(action: ControlAction): string {
  return action === "pause" ? "paused" : action === "resume" ? "resumed" : "cancelled";
}

// ── The next batch ───────────────────────────────────────────────────────────────────────────────

/** A tenant row the next batch may claim. */
export interface BatchCandidate {
  tenantId: string;
  host: string;
  state: TenantState;
  position: number;
  /** Epoch ms; set while skipped (null: skipped for good). */
  retryAt: number | null;
  /** Epoch ms of the current claim; set while running. */
  claimedAt: number | null;
}

export interface BatchLimits {
  now: number;
  concurrency: number;
  claimTimeoutMs: number;
  /** Tenants running under a live (not stale) claim, per host. */
  liveRunningByHost: ReadonlyMap<string, number>;
  /**
   * Most migrations one host may run at once. Each migration holds a dedicated connection outside
   * the tenant's pool; those come out of the host's budget reserve, so this is that reserve.
   */
  hostCap: (host: string) => number;
  /** The campaign is stopping: only stale claims are taken back (to record their outcome). */
  stopping: boolean;
}

/** Whether a tenant in the active cohort may be claimed now. */
export function isClaimable(
  candidate: BatchCandidate,
  limits: Pick<BatchLimits, "now" | "claimTimeoutMs" | "stopping">,
): boolean {
  switch (candidate.state) {
    case "pending":
      return !limits.stopping;
    case "skipped":
      return !limits.stopping && candidate.retryAt !== null && candidate.retryAt <= limits.now;
    case "running":
      return candidate.claimedAt !== null && candidate.claimedAt <= limits.now - limits.claimTimeoutMs;
    default:
      return false;
  }
}

/** Claim order: stale claims first (their work may be half done), then due retries, then new tenants. */
export function claimRank(state: TenantState): number {
  return state === "running" ? 0 : state === "skipped" ? 1 : 2;
}

/**
 * Chooses the next batch from the active cohort: at most `concurrency` tenants in flight in all,
 * and at most `hostCap(host)` on each host, counting the ones still running under a live claim.
 */
export function selectNextBatch(
  candidates: readonly BatchCandidate[],
  limits: BatchLimits,
): BatchCandidate[] {
  let live = 0;
  for (const n of limits.liveRunningByHost.values()) live += n;
  let room = limits.concurrency - live;
  const perHost = new Map(limits.liveRunningByHost);
  const chosen: BatchCandidate[] = [];
  const ordered = candidates
    .filter((c) => isClaimable(c, limits))
    .sort((a, b) => claimRank(a.state) - claimRank(b.state) || a.position - b.position);
  for (const candidate of ordered) {
    if (room <= 0) break;
    const onHost = perHost.get(candidate.host) ?? 0;
    if (onHost >= Math.min(limits.concurrency, limits.hostCap(candidate.host))) continue;
    perHost.set(candidate.host, onHost + 1);
    chosen.push(candidate);
    room--;
  }
  return chosen;
}

// ── Results ──────────────────────────────────────────────────────────────────────────────────────

/** What the TenantObject's `migrate` answers (structurally the same as its `MigrateOutcome`). */
export type MigrateAnswer =
  | { outcome: "migrated"; fromVersion: number; toVersion: number; applied: number[] }
  | { outcome: "skipped"; reason: string; leases?: number }
  | { outcome: "failed"; version: number | null; summary: string };

/** A tenant's recorded result for one attempt. */
export type TenantResult =
  | { state: "succeeded"; fromVersion: number | null; toVersion: number; applied: number[] }
  /** `toVersion`: the version the tenant reached (null when unknown). */
  | { state: "failed"; toVersion: number | null; summary: string }
  | { state: "skipped"; reason: string; retryAt: number | null };

/** Delay before a skipped tenant is tried again: 30 s, doubling, at most 10 minutes. */
export function retryDelayMs(attempts: number): number {
  return Math.min(30_000 * 2 ** Math.max(0, attempts - 1), 10 * 60_000);
}

/**
 * Delay before a migration a transient fault interrupted (a killed backend, a restarted host, a cut
 * network) is run again: 5 s, doubling, at most 2 minutes. Shorter than `retryDelayMs`: nothing of
 * the tenant's is in the way, only a fault that is usually over in seconds.
 */
export function interruptedRetryDelayMs(attempts: number): number {
  return Math.min(5_000 * 2 ** Math.max(0, attempts - 1), 2 * 60_000);
}

/**
 * A tenant put off to a later tick for a reason that is not its own (the host's maintenance reserve
 * was full, or the tick's time ran out while its migration still ran): retried after the first
 * back-off step, never given up on. The migration is bounded on its own (`LESSOR_MIGRATION_TIMEOUT_MS`),
 * so a later attempt finds it done or failed.
 */
export function deferredResult(reason: string, now: number): TenantResult {
  return { state: "skipped", reason, retryAt: now + retryDelayMs(1) };
}

/**
 * What one `migrate` call (or its failure to answer) means for the tenant. `attempts` counts this
 * one. Held leases and a migration already in progress are retried later, up to `maxAttempts`;
 * an unknown (erased) tenant is skipped for good; an unanswered call is retried (the database's
 * own ledger makes a second run harmless) and fails once attempts run out.
 */
export function resultOfAttempt(
  answer: MigrateAnswer | { outcome: "unanswered"; summary: string },
  attempts: number,
  now: number,
  maxAttempts: number = campaignDefaults.maxAttempts,
): TenantResult {
  const exhausted = attempts >= maxAttempts;
  switch (answer.outcome) {
    case "migrated":
      return {
        state: "succeeded",
        // When nothing was applied, an earlier attempt did the work; keep the version recorded then.
        fromVersion: answer.applied.length > 0 ? answer.fromVersion : null,
        toVersion: answer.toVersion,
        applied: answer.applied,
      };
    case "failed":
      // Each migration commits on its own: the tenant reached the version before the one that failed.
      return {
        state: "failed",
        toVersion: answer.version === null ? null : answer.version - 1,
        summary: boundSummary(answer.summary),
      };
    case "skipped": {
      const reason =
        answer.reason === "leases_held" && answer.leases !== undefined
          ? `leases_held (${answer.leases})`
          : answer.reason;
      // A tenant that does not exist, or is being erased, will not need migrating again.
      if (answer.reason === "tenant_unknown" || answer.reason === "tenant_erasing") {
        return { state: "skipped", reason, retryAt: null };
      }
      // The host's maintenance reserve was full, or the control plane did not answer the tenant's
      // lookup: deferred to a later tick, never given up on (neither is the tenant's doing).
      if (answer.reason === "maintenance_busy" || answer.reason === "control_plane_unavailable")
        return deferredResult(reason, now);
      // A transient fault interrupted it: run again after a backoff, never given up on and never
      // `failed` (only the migration's own SQL, or a bound it reached, fails a tenant).
      if (answer.reason === "interrupted")
        return { state: "skipped", reason, retryAt: now + interruptedRetryDelayMs(attempts) };
      return exhausted
        ? { state: "skipped", reason: `${reason}; gave up after ${attempts} attempts`, retryAt: null }
        : { state: "skipped", reason, retryAt: now + retryDelayMs(attempts) };
    }
    case "unanswered":
      return exhausted
        ? {
            state: "failed",
            toVersion: null,
            summary: boundSummary(`no answer after ${attempts} attempts: ${answer.summary}`),
          }
        : {
            state: "skipped",
            reason: boundSummary(`unanswered: ${answer.summary}`),
            retryAt: now + retryDelayMs(attempts),
          };
  }
}

function boundSummary(text: string): string {
  return text.length > 500 ? `${text.slice(0, 497)}...` : text;
}

// ── Expand and contract ──────────────────────────────────────────────────────────────────────────

/** The contract steps a move from `fromVersion` to `toVersion` applies. */
export function contractStepsBetween(
  steps: readonly BundledStep[],
  fromVersion: number,
  toVersion: number,
): number[] {
  return steps
    .filter((step) => step.kind === "contract" && step.version > fromVersion && step.version <= toVersion)
    .map((step) => step.version);
}

/** An app schema version (from `Lessor-Schema-Version`) and when it was last seen. */
export interface SeenVersion {
  version: number;
  lastSeenAt: number;
}

export type GuardVerdict = { ok: true; forced: boolean } | { ok: false; reason: string };

/**
 * A contract step at version V needs every app at V or newer. It refuses while an app that needs
 * an older version (so was built against a schema before V) has been seen within the stability
 * window, unless forced. Apps that never send the header are invisible to this guard.
 */
export function contractGuard(input: {
  contractSteps: readonly number[];
  seen: readonly SeenVersion[];
  now: number;
  stabilityWindowMs: number;
  force: boolean;
}): GuardVerdict {
  if (input.contractSteps.length === 0) return { ok: true, forced: false };
  const since = input.now - input.stabilityWindowMs;
  const lowestStep = Math.min(...input.contractSteps);
  const blocking = input.seen
    .filter((seen) => seen.version < lowestStep && seen.lastSeenAt >= since)
    .sort((a, b) => a.version - b.version);
  if (blocking.length === 0) return { ok: true, forced: false };
  if (input.force) return { ok: true, forced: true };
  const oldest = blocking[0];
  const last = Math.max(...blocking.map((seen) => seen.lastSeenAt));
  const clearAt = new Date(last + input.stabilityWindowMs).toISOString();
  return {
    ok: false,
    reason:
      `contract step ${lowestStep} waits: apps needing schema version ${blocking.map((s) => s.version).join(", ")} ` +
      `were seen within the stability window (oldest ${oldest?.version}); it may run after ${clearAt} ` +
      "if no such app is seen again, or create the campaign with force",
  };
}

/**
 * The version to record for an app's `Lessor-Schema-Version`. Versions beyond the newest bundled
 * one are recorded as newest + 1 ("newer than this deployment"): they never block a contract step,
 * and an arbitrary header value cannot grow the record without bound.
 */
export function recordedAppVersion(required: number, bundledVersions: number): number {
  return Math.min(required, bundledVersions + 1);
}

/** Parses `Lessor-Schema-Version`: absent is null, a positive integer is that version, else malformed. */
export function parseSchemaVersionHeader(raw: string | undefined): number | null | "malformed" {
  if (raw === undefined) return null;
  const trimmed = raw.trim();
  if (!/^[1-9][0-9]{0,8}$/.test(trimmed)) return "malformed";
  return Number(trimmed);
}
