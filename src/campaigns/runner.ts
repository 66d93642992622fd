/**
 * The campaign runner: one tick advances each active campaign by at most one batch, within a time
 * bound. A tick is a sequence of explicit durable steps, each a guarded write that is a no-op when
 * replayed:
 *
 *     start    pending → canary | rollout                       (compare-and-swap on the state)
 *     phase    canary → rollout | failed, rollout → done | failed (compare-and-swap on the state)
 *     blocked  record why the contract guard holds the campaign back
 *     claim    pending / due skipped / stale running → running   (advisory lock + compare-and-swap)
 *     migrate  TenantObject.migrate for one claimed tenant       (the database's ledger + advisory lock)
 *     record   running → succeeded | failed | skipped            (only under this tick's claim token)
 *
 * A tick killed after any step leaves durable progress the next tick resumes from: an unrecorded
 * claim goes stale and is claimed again, and migrating that tenant again applies nothing (its
 * database's own ledger says the steps are applied), so no migration is ever applied twice.
 * Tests stop a tick after exactly k steps with `stepBudget` to prove it.
 */
import { budgetSubject, loadConfig } from "../config/index.ts";
import { type ControlPlane, withControlPlane } from "../control-plane/index.ts";
import {
  type ActiveState,
  activeCohort,
  campaignDefaults,
  campaignLimits,
  contractGuard,
  decidePhase,
  deferredResult,
  finishedStates,
  type MigrateAnswer,
  resultOfAttempt,
  selectNextBatch,
  type TenantResult,
} from "../core/campaign.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent, redact } from "../log/index.ts";
import { tenantObject } from "../placement/index.ts";
import {
  activeCampaigns,
  appVersionsSeenSince,
  type CampaignRow,
  type ClaimedTenant,
  claimBatch,
  loadTally,
  moveCampaign,
  recordResult,
  setBlockedReason,
  trimAppVersionsSeen,
} from "./store.ts";

export interface TickOptions {
  /** The tick's clock, epoch ms (default: now). Tests move it forward to make claims stale and retries due. */
  now?: number;
  /** Wall-clock bound of the whole tick (default 30 s, inside the cron fan-out's 50 s). */
  deadlineMs?: number;
  /** Stop after this many durable steps, as if the Worker were killed there (tests). */
  stepBudget?: number;
  /** Advance only this campaign. */
  campaignId?: string;
  /** Claims older than this are presumed dead (default 10 minutes). */
  claimTimeoutMs?: number;
  /** Most campaigns one tick advances. */
  maxCampaigns?: number;
  /**
   * The region whose campaigns the tick advances (default: the default region). A campaign lives in
   * one region's control plane and migrates that region's tenants only (docs/adr/023-regions.md).
   */
  region?: string;
}

export interface CampaignTickReport {
  id: string;
  from: string;
  to: string;
  claimed: number;
  succeeded: number;
  failed: number;
  skipped: number;
  /** Migrations still running when the tick's time ran out; deferred to a later tick (`still_running`). */
  abandoned: number;
  blocked: string | null;
}

export interface TickReport {
  campaigns: CampaignTickReport[];
  /** Durable steps taken, in order. */
  steps: string[];
  /** The step budget ran out: the tick stopped as if killed. */
  killed: boolean;
}

/** Thrown inside a tick when its step budget runs out. */
class StepBudgetExhausted extends Error {
  override readonly name = "StepBudgetExhausted";
}

interface Steps {
  take(step: string): void;
  readonly taken: string[];
  readonly killed: boolean;
}

function stepCounter(budget: number | undefined): Steps {
  const taken: string[] = [];
  let killed = false;
  return {
    taken,
    get killed() {
      return killed;
    },
    take(step: string) {
      if (killed || (budget !== undefined && taken.length >= budget)) {
        killed = true;
        throw new StepBudgetExhausted(step);
      }
      taken.push(step);
    },
  };
}

const defaultDeadlineMs = 30_000;
const defaultMaxCampaigns = 5;
/** Kept for twice the longest stability window a campaign may ask for. */
const seenRetentionMs = 2 * campaignLimits.maxStabilityWindowMs;

/** One tick over the active campaigns, on one control-plane connection. */
export async function runCampaignTick(env: Env, options: TickOptions = {}): Promise<TickReport> {
  const config = loadConfig(env);
  const wallStart = Date.now();
  const offset = (options.now ?? wallStart) - wallStart;
  const clock = () => Date.now() + offset;
  const deadline = wallStart + (options.deadlineMs ?? defaultDeadlineMs);
  const steps = stepCounter(options.stepBudget);
  const reports: CampaignTickReport[] = [];
  // A host's, or a customer tunnel's (`tunnel:<name>`), maintenance reserve.
  const hostCap = (host: string) => Math.max(1, budgetSubject(config, host)?.budget.reserve ?? 1);
  const region = options.region ?? config.defaultRegion;
  try {
    await withControlPlane(config, env, region, async (db) => {
      // Sightings older than any stability window are no longer evidence of anything.
      if (options.campaignId === undefined) {
        await trimAppVersionsSeen(db, clock() - seenRetentionMs);
      }
      const active = await activeCampaigns(
        db,
        options.maxCampaigns ?? defaultMaxCampaigns,
        options.campaignId,
      );
      for (const campaign of active) {
        if (Date.now() >= deadline) break;
        const report: CampaignTickReport = {
          id: campaign.id,
          from: campaign.state,
          to: campaign.state,
          claimed: 0,
          succeeded: 0,
          failed: 0,
          skipped: 0,
          abandoned: 0,
          blocked: null,
        };
        reports.push(report);
        await advanceCampaign(env, db, campaign, report, {
          clock,
          deadline,
          steps,
          hostCap,
          region,
          claimTimeoutMs: options.claimTimeoutMs ?? campaignDefaults.claimTimeoutMs,
        });
      }
    });
  } catch (error) {
    if (!(error instanceof StepBudgetExhausted)) throw error;
  }
  return { campaigns: reports, steps: [...steps.taken], killed: steps.killed };
}

interface AdvanceContext {
  clock: () => number;
  deadline: number;
  steps: Steps;
  hostCap: (host: string) => number;
  region: string;
  claimTimeoutMs: number;
}

async function advanceCampaign(
  env: Env,
  db: ControlPlane,
  initial: CampaignRow,
  report: CampaignTickReport,
  ctx: AdvanceContext,
): Promise<void> {
  let campaign: CampaignRow | null = initial;

  // Step: phase (and start). Settles where the campaign stands before it claims anything.
  const settle = async (): Promise<{ state: ActiveState; stopping: boolean } | null> => {
    if (!campaign) return null;
    const current = campaign.state as ActiveState;
    const decision = decidePhase(current, campaign.continueOnFailure, await loadTally(db, campaign.id));
    if (decision.state !== current) {
      ctx.steps.take(current === "pending" ? `start:${campaign.id}` : `phase:${campaign.id}`);
      campaign = await moveCampaign(db, campaign.id, current, decision.state, ctx.clock(), {
        reason: decision.reason,
      });
      if (!campaign) return null; // moved by someone else (a pause, another tick): leave it to them
      report.to = campaign.state;
      logEvent("info", "campaign_phase", {
        campaign: campaign.id,
        from: current,
        to: campaign.state,
        ...(decision.reason ? { reason: decision.reason } : {}),
      });
      if (finishedStates.includes(campaign.state)) return null;
      // A campaign that starts settles again: with no canary it may already be done (nothing enrolled).
      return settle();
    }
    return { state: current, stopping: decision.stopping };
  };

  const where = await settle();
  if (!where || !campaign) return;
  const state = where.state;
  const cohort = activeCohort(state);
  if (!cohort) return;
  const now = ctx.clock();

  // The expand/contract guard: a contract step waits while older apps were seen recently.
  const active: CampaignRow = campaign;
  if (active.contractSteps.length > 0) {
    const verdict = contractGuard({
      contractSteps: active.contractSteps,
      seen: await appVersionsSeenSince(db, now - active.stabilityWindowMs),
      now,
      stabilityWindowMs: active.stabilityWindowMs,
      force: active.force,
    });
    const blocked = verdict.ok ? null : verdict.reason;
    if (blocked !== active.blockedReason) {
      ctx.steps.take(`blocked:${active.id}`);
      await setBlockedReason(db, active.id, blocked, now);
    }
    report.blocked = blocked;
    if (blocked !== null) return;
  }

  // Step: claim. Nothing new starts once the tick's time is up.
  if (Date.now() >= ctx.deadline) return;
  const claimToken = crypto.randomUUID();
  ctx.steps.take(`claim:${active.id}`);
  const claimed = await claimBatch(db, {
    campaignId: active.id,
    phase: state,
    cohort,
    concurrency: active.concurrency,
    claimToken,
    now,
    claimTimeoutMs: ctx.claimTimeoutMs,
    stopping: where.stopping,
    choose: (candidates, liveRunningByHost) =>
      selectNextBatch(candidates, {
        now,
        concurrency: active.concurrency,
        claimTimeoutMs: ctx.claimTimeoutMs,
        liveRunningByHost,
        hostCap: ctx.hostCap,
        stopping: where.stopping,
      }),
  });
  report.claimed = claimed.length;
  if (claimed.length === 0) return;

  // Steps: migrate and record, one pipeline per claimed tenant, all in parallel.
  const outcomes = await Promise.allSettled(
    claimed.map((tenant) => migrateAndRecord(env, db, active, tenant, claimToken, report, ctx)),
  );
  const killed = outcomes.find(
    (o): o is PromiseRejectedResult => o.status === "rejected" && o.reason instanceof StepBudgetExhausted,
  );
  if (killed) throw killed.reason;
  const broken = outcomes.find((o): o is PromiseRejectedResult => o.status === "rejected");
  if (broken) throw broken.reason;

  // Step: phase again, so the batch that finishes a cohort moves the campaign in this same tick.
  await settle();
}

async function migrateAndRecord(
  env: Env,
  db: ControlPlane,
  campaign: CampaignRow,
  tenant: ClaimedTenant,
  claimToken: string,
  report: CampaignTickReport,
  ctx: AdvanceContext,
): Promise<void> {
  ctx.steps.take(`migrate:${tenant.tenantId}`);
  const remaining = ctx.deadline - Date.now();
  const answer = await withinDeadline(
    callMigrate(env, ctx.region, tenant.tenantId, campaign.toVersion, campaign.drainTimeoutMs),
    remaining,
  );
  // The tick's time ran out with the migration still running inside the TenantObject (it goes on
  // there, under its own deadline). The tenant is deferred like a busy one, so a later tick asks
  // again and finds the work done, rather than its claim blocking the host's cap until the claim
  // timeout.
  if (answer === "deadline") report.abandoned++;
  const result: TenantResult =
    answer === "deadline"
      ? deferredResult("still_running", ctx.clock())
      : resultOfAttempt(answer, tenant.attempts, ctx.clock());
  ctx.steps.take(`record:${tenant.tenantId}`);
  const recorded = await recordResult(db, {
    campaignId: campaign.id,
    tenantId: tenant.tenantId,
    claimToken,
    result,
    now: ctx.clock(),
  });
  if (!recorded) return;
  report[result.state]++;
  if (result.state !== "succeeded") {
    logEvent("warn", "campaign_tenant_not_migrated", {
      campaign: campaign.id,
      tenant: tenant.tenantId,
      state: result.state,
      attempts: tenant.attempts,
      ...(result.state === "failed" ? { failure: result.summary } : { reason: result.reason }),
    });
  }
}

/** Calls the tenant's object; an exception (the object is unreachable) becomes `unanswered`. */
async function callMigrate(
  env: Env,
  region: string,
  tenantId: string,
  toVersion: number,
  drainTimeoutMs: number,
): Promise<MigrateAnswer | { outcome: "unanswered"; summary: string }> {
  try {
    const answer: MigrateAnswer = await tenantObject(env, region, tenantId).migrate(
      tenantId,
      toVersion,
      drainTimeoutMs,
    );
    if (answer.outcome === "failed") return { ...answer, summary: redact(answer.summary) };
    return answer;
  } catch (error) {
    return { outcome: "unanswered", summary: describeFailure(error) };
  }
}

function withinDeadline<T>(promise: Promise<T>, ms: number): Promise<T | "deadline"> {
  if (ms <= 0) return Promise.resolve("deadline");
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<"deadline">((resolve) => {
    timer = setTimeout(() => resolve("deadline"), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}
