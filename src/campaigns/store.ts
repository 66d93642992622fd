/**
 * The campaign's durable state in the control plane: creating a campaign (enrolling its tenants),
 * the tally, the compare-and-swap claims and results the runner writes, and the operator's reads.
 * Every write here is one step a killed runner can resume after: each is guarded by the state it
 * expects (`WHERE state = …`, `WHERE claim_token = …`), so replaying a step is a no-op.
 */
import { and, asc, desc, eq, gt, inArray, lt, sql } from "drizzle-orm";
import { writeAudit } from "../audit/index.ts";
import type { ControlPlane } from "../control-plane/index.ts";
import {
  adoptedDatabases,
  appSchemaVersionsSeen,
  campaigns,
  campaignTenants,
  tenants,
} from "../control-plane/schema.ts";
import {
  type ActiveState,
  type BatchCandidate,
  type BundledStep,
  type CampaignSpec,
  type CampaignState,
  type CampaignTally,
  type Cohort,
  type CohortTally,
  contractStepsBetween,
  emptyTally,
  planCohorts,
  type SeenVersion,
  type TenantResult,
  type TenantState,
} from "../core/campaign.ts";
import { LessorError } from "../errors/index.ts";

export type CampaignRow = typeof campaigns.$inferSelect;
export type CampaignTenantRow = typeof campaignTenants.$inferSelect;

const activeStates: ActiveState[] = ["pending", "canary", "rollout"];
const insertChunk = 500;

/** A fresh campaign id: `cmp_` and 16 hex digits. */
export function newCampaignId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(8));
  return `cmp_${[...bytes].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

export const campaignIdPattern = /^cmp_[0-9a-f]{16}$/;

export interface CreatedCampaign {
  campaign: CampaignRow;
  enrolled: number;
  canary: string[];
  /** Listed tenants that were not enrolled because they are already at `toVersion` or newer. */
  alreadyCurrent: number;
  /** Customers' databases below `toVersion` left out by the campaign's `adopted: "skip"`. */
  adoptedSkipped: number;
}

/**
 * Creates a campaign and enrolls its tenants in one transaction: every tenant (or every listed
 * tenant) that is active or disabled and whose recorded schema version is below `toVersion`. Tenants
 * provisioned later start at the newest bundled version, so they never need enrolling.
 */
export async function createCampaign(
  db: ControlPlane,
  spec: CampaignSpec,
  bundled: readonly BundledStep[],
  now: number,
  actor: string,
): Promise<CreatedCampaign> {
  return db.transaction(async (tx) => {
    // Active and disabled tenants (a disabled tenant's schema still has to move); never one being
    // provisioned or erased, nor any state added later that this code does not know. FOR SHARE: an
    // erase that closes a tenant's gate meanwhile waits for this transaction, or this one sees the
    // tenant as erasing and leaves it out, so no enrollment can outlive an erase.
    const provisioned = inArray(tenants.status, ["active", "disabled"]);
    const rows = await tx
      .select({
        id: tenants.id,
        host: tenants.host,
        schemaVersion: tenants.schemaVersion,
        adopted: sql<boolean>`(${adoptedDatabases.tenantId} IS NOT NULL)`,
      })
      .from(tenants)
      .leftJoin(adoptedDatabases, eq(adoptedDatabases.tenantId, tenants.id))
      .where(spec.tenants === null ? provisioned : and(provisioned, inArray(tenants.id, spec.tenants)))
      .orderBy(asc(tenants.id))
      .for("share", { of: tenants });
    if (spec.tenants !== null) {
      const found = new Set(rows.map((row) => row.id));
      const unknown = spec.tenants.filter((id) => !found.has(id));
      if (unknown.length > 0) {
        throw new LessorError("invalid_request", {
          publicMessage: `tenants names unknown tenant(s): ${unknown.slice(0, 5).join(", ")}${unknown.length > 5 ? ", …" : ""}.`,
        });
      }
    }
    // A customer's database is migrated only when the campaign says so; the rest are counted.
    const below = rows.filter((row) => row.schemaVersion < spec.toVersion);
    const enrolled = below.filter((row) => spec.adopted === "include" || !row.adopted);
    const adoptedSkipped = below.length - enrolled.length;
    const id = newCampaignId();
    const planned = planCohorts(
      enrolled.map((row) => row.id),
      spec.canary,
      id,
    );
    if (!planned.ok) {
      throw new LessorError("invalid_request", {
        publicMessage: `canary names tenant(s) this campaign does not migrate (unknown, not listed, or already at version ${spec.toVersion}): ${planned.notEnrolled.slice(0, 5).join(", ")}.`,
      });
    }
    const byId = new Map(enrolled.map((row) => [row.id, row]));
    const minFrom = enrolled.reduce((min, row) => Math.min(min, row.schemaVersion), spec.toVersion);
    const at = new Date(now);
    const [campaign] = await tx
      .insert(campaigns)
      .values({
        id,
        state: "pending",
        toVersion: spec.toVersion,
        concurrency: spec.concurrency,
        continueOnFailure: spec.continueOnFailure,
        force: spec.force,
        drainTimeoutMs: spec.drainTimeoutMs,
        stabilityWindowMs: spec.stabilityWindowMs,
        canaryPercent: spec.canary.kind === "percent" ? spec.canary.percent : null,
        listed: spec.tenants !== null,
        adoptedPolicy: spec.adopted,
        adoptedSkipped,
        contractSteps: contractStepsBetween(bundled, minFrom, spec.toVersion),
        createdAt: at,
        updatedAt: at,
      })
      .returning();
    if (!campaign) throw new LessorError("internal", { internal: "campaign insert returned nothing" });
    for (let start = 0; start < planned.plan.length; start += insertChunk) {
      await tx.insert(campaignTenants).values(
        planned.plan.slice(start, start + insertChunk).map((entry) => {
          const row = byId.get(entry.tenantId);
          return {
            campaignId: id,
            tenantId: entry.tenantId,
            host: row?.host ?? "",
            cohort: entry.cohort,
            position: entry.position,
            state: "pending" as const,
            fromVersion: row?.schemaVersion ?? 0,
          };
        }),
      );
    }
    await writeAudit(tx, {
      actor,
      action: "campaign.create",
      tenantId: null,
      detail: {
        campaign: id,
        toVersion: spec.toVersion,
        enrolled: planned.plan.length,
        scope: spec.tenants === null ? "fleet" : "listed",
        adopted: spec.adopted,
        adoptedSkipped,
      },
    });
    return {
      campaign,
      enrolled: planned.plan.length,
      canary: planned.plan.filter((entry) => entry.cohort === "canary").map((entry) => entry.tenantId),
      alreadyCurrent: rows.length - below.length,
      adoptedSkipped,
    };
  });
}

/** Active campaigns, oldest first (bounded: a tick advances at most `limit`). */
export function activeCampaigns(db: ControlPlane, limit: number, only?: string): Promise<CampaignRow[]> {
  return db
    .select()
    .from(campaigns)
    .where(
      and(inArray(campaigns.state, activeStates), only === undefined ? undefined : eq(campaigns.id, only)),
    )
    .orderBy(asc(campaigns.seq))
    .limit(limit);
}

export async function loadCampaign(db: ControlPlane, id: string): Promise<CampaignRow | null> {
  const [row] = await db.select().from(campaigns).where(eq(campaigns.id, id)).limit(1);
  return row ?? null;
}

/** Newest-first page of campaigns; the cursor is the last `seq` of the previous page. */
export function listCampaigns(
  db: ControlPlane,
  before: number | null,
  limit: number,
): Promise<CampaignRow[]> {
  return db
    .select()
    .from(campaigns)
    .where(before === null ? undefined : lt(campaigns.seq, before))
    .orderBy(desc(campaigns.seq))
    .limit(limit);
}

/** How many of the campaign's tenants are in each state, per cohort. */
export async function loadTally(db: ControlPlane, campaignId: string): Promise<CampaignTally> {
  const rows = await db
    .select({
      cohort: campaignTenants.cohort,
      state: campaignTenants.state,
      retry: sql<boolean>`(${campaignTenants.retryAt} IS NOT NULL)`,
      n: sql<number>`count(*)::int`,
    })
    .from(campaignTenants)
    .where(eq(campaignTenants.campaignId, campaignId))
    .groupBy(campaignTenants.cohort, campaignTenants.state, sql`3`);
  const tally: CampaignTally = { canary: { ...emptyTally }, rollout: { ...emptyTally } };
  for (const row of rows) {
    const cohort: CohortTally = tally[row.cohort];
    const n = Number(row.n);
    if (row.state === "skipped") {
      if (row.retry) cohort.skippedRetry += n;
      else cohort.skippedFinal += n;
    } else {
      cohort[row.state] += n;
    }
  }
  return tally;
}

/**
 * Counts per tenant state over both cohorts, for the operator. `erased`: enrolled tenants erased
 * since (their rows went with them), so `total` stays the number the campaign enrolled.
 */
export function countsOf(
  tally: CampaignTally,
  erased = 0,
): Record<TenantState, number> & { erased: number; total: number } {
  const sum = (pick: (t: CohortTally) => number) => pick(tally.canary) + pick(tally.rollout);
  const counts = {
    pending: sum((t) => t.pending),
    running: sum((t) => t.running),
    succeeded: sum((t) => t.succeeded),
    failed: sum((t) => t.failed),
    skipped: sum((t) => t.skippedRetry + t.skippedFinal),
    erased,
  };
  return { ...counts, total: Object.values(counts).reduce((a, b) => a + b, 0) };
}

/**
 * Moves an active campaign from `from` to `to` if it is still in `from` (compare-and-swap).
 * Returns the updated row, or null if someone else moved it first.
 */
export async function moveCampaign(
  db: ControlPlane,
  id: string,
  from: CampaignState,
  to: CampaignState,
  now: number,
  extra: { reason?: string | null; pausedFrom?: ActiveState | null } = {},
): Promise<CampaignRow | null> {
  const at = new Date(now);
  const finished = to === "done" || to === "failed" || to === "cancelled";
  const [row] = await db
    .update(campaigns)
    .set({
      state: to,
      updatedAt: at,
      ...(from === "pending" && (to === "canary" || to === "rollout") ? { startedAt: at } : {}),
      ...(finished ? { finishedAt: at, blockedReason: null } : {}),
      ...(extra.reason === undefined ? {} : { reason: extra.reason }),
      ...(extra.pausedFrom === undefined ? {} : { pausedFrom: extra.pausedFrom }),
    })
    .where(and(eq(campaigns.id, id), eq(campaigns.state, from)))
    .returning();
  return row ?? null;
}

/** Records (or clears) why the campaign could not claim; written only when it changes. */
export async function setBlockedReason(db: ControlPlane, id: string, reason: string | null, now: number) {
  await db
    .update(campaigns)
    .set({ blockedReason: reason, updatedAt: new Date(now) })
    .where(and(eq(campaigns.id, id), sql`${campaigns.blockedReason} IS DISTINCT FROM ${reason}`));
}

export interface ClaimedTenant {
  tenantId: string;
  attempts: number;
  fromVersion: number;
}

/**
 * Claims the next batch. Runs in one transaction under a per-campaign advisory lock, so two ticks
 * at the same moment claim one after the other and the second counts the first's claims as
 * running; the UPDATE's own WHERE re-checks each row, so a row can only be claimed from a
 * claimable state (compare-and-swap). `choose` is the core's batch selection.
 */
export async function claimBatch(
  db: ControlPlane,
  input: {
    campaignId: string;
    phase: ActiveState;
    cohort: Cohort;
    concurrency: number;
    claimToken: string;
    now: number;
    claimTimeoutMs: number;
    stopping: boolean;
    choose: (candidates: BatchCandidate[], liveRunningByHost: Map<string, number>) => BatchCandidate[];
  },
): Promise<ClaimedTenant[]> {
  return db.transaction(async (tx) => {
    await tx.execute(
      sql`SELECT pg_advisory_xact_lock(hashtext('lessor:campaign'), hashtext(${input.campaignId}))`,
    );
    // Under the lock: a pause, cancel or phase change that committed first stops this claim.
    const [current] = await tx
      .select({ state: campaigns.state })
      .from(campaigns)
      .where(eq(campaigns.id, input.campaignId));
    if (current?.state !== input.phase) return [];
    const now = new Date(input.now);
    const staleBefore = new Date(input.now - input.claimTimeoutMs);
    const live = await tx
      .select({ host: campaignTenants.host, n: sql<number>`count(*)::int` })
      .from(campaignTenants)
      .where(
        and(
          eq(campaignTenants.campaignId, input.campaignId),
          eq(campaignTenants.state, "running"),
          gt(campaignTenants.claimedAt, staleBefore),
        ),
      )
      .groupBy(campaignTenants.host);
    const liveByHost = new Map(live.map((row) => [row.host, Number(row.n)]));
    // Candidates, at most `concurrency` per host, in claim order; the core picks from these.
    const { rows } = await tx.execute(sql`
      SELECT tenant_id, host, state, position,
             (extract(epoch FROM retry_at) * 1000)::float8 AS retry_at_ms,
             (extract(epoch FROM claimed_at) * 1000)::float8 AS claimed_at_ms
      FROM (
        SELECT tenant_id, host, state, position, retry_at, claimed_at,
               row_number() OVER (
                 PARTITION BY host
                 ORDER BY CASE state WHEN 'running' THEN 0 WHEN 'skipped' THEN 1 ELSE 2 END, position
               ) AS rank
        FROM campaign_tenants
        WHERE campaign_id = ${input.campaignId} AND cohort = ${input.cohort}
          -- A tenant being erased is skipped: its erase removes its row from the campaign.
          AND NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = campaign_tenants.tenant_id AND t.status = 'erasing')
          AND ((state = 'running' AND claimed_at <= ${staleBefore.toISOString()}::timestamptz)
            OR (NOT ${input.stopping}::boolean AND state = 'skipped' AND retry_at <= ${now.toISOString()}::timestamptz)
            OR (NOT ${input.stopping}::boolean AND state = 'pending'))
      ) candidates
      WHERE rank <= ${input.concurrency}`);
    const candidates: BatchCandidate[] = rows.map((row) => ({
      tenantId: String(row.tenant_id),
      host: String(row.host),
      state: String(row.state) as TenantState,
      position: Number(row.position),
      retryAt: row.retry_at_ms === null ? null : Number(row.retry_at_ms),
      claimedAt: row.claimed_at_ms === null ? null : Number(row.claimed_at_ms),
    }));
    const chosen = input.choose(candidates, liveByHost);
    if (chosen.length === 0) return [];
    const claimed = await tx
      .update(campaignTenants)
      .set({
        state: "running",
        claimToken: input.claimToken,
        claimedAt: now,
        attempts: sql`${campaignTenants.attempts} + 1`,
        startedAt: now,
        finishedAt: null,
        retryAt: null,
      })
      .where(
        and(
          eq(campaignTenants.campaignId, input.campaignId),
          inArray(
            campaignTenants.tenantId,
            chosen.map((c) => c.tenantId),
          ),
          sql`(${campaignTenants.state} = 'pending'
            OR (${campaignTenants.state} = 'skipped' AND ${campaignTenants.retryAt} <= ${now.toISOString()}::timestamptz)
            OR (${campaignTenants.state} = 'running' AND ${campaignTenants.claimedAt} <= ${staleBefore.toISOString()}::timestamptz))`,
        ),
      )
      .returning({
        tenantId: campaignTenants.tenantId,
        attempts: campaignTenants.attempts,
        fromVersion: campaignTenants.fromVersion,
      });
    return claimed;
  });
}

/**
 * Records one tenant's result, only if this runner's claim is still the current one: a result that
 * arrives after its claim went stale and was taken over is dropped (the new claim records its own).
 */
export async function recordResult(
  db: ControlPlane,
  input: { campaignId: string; tenantId: string; claimToken: string; result: TenantResult; now: number },
): Promise<boolean> {
  const { result } = input;
  const at = new Date(input.now);
  const common = { claimToken: null, claimedAt: null, finishedAt: at };
  const set =
    result.state === "succeeded"
      ? {
          ...common,
          state: "succeeded" as const,
          toVersion: result.toVersion,
          failureSummary: null,
          skipReason: null,
          retryAt: null,
          ...(result.fromVersion === null ? {} : { fromVersion: result.fromVersion }),
        }
      : result.state === "failed"
        ? {
            ...common,
            state: "failed" as const,
            toVersion: result.toVersion,
            failureSummary: result.summary,
            skipReason: null,
            retryAt: null,
          }
        : {
            ...common,
            state: "skipped" as const,
            skipReason: result.reason,
            retryAt: result.retryAt === null ? null : new Date(result.retryAt),
          };
  const updated = await db
    .update(campaignTenants)
    .set(set)
    .where(
      and(
        eq(campaignTenants.campaignId, input.campaignId),
        eq(campaignTenants.tenantId, input.tenantId),
        eq(campaignTenants.state, "running"),
        eq(campaignTenants.claimToken, input.claimToken),
      ),
    )
    .returning({ tenantId: campaignTenants.tenantId });
  return updated.length === 1;
}

/** Page of a campaign's tenants in claim order; the cursor is the last position of the previous page. */
export function listCampaignTenants(
  db: ControlPlane,
  campaignId: string,
  options: { after: number | null; limit: number; state: TenantState | null },
): Promise<CampaignTenantRow[]> {
  return db
    .select()
    .from(campaignTenants)
    .where(
      and(
        eq(campaignTenants.campaignId, campaignId),
        options.after === null ? undefined : gt(campaignTenants.position, options.after),
        options.state === null ? undefined : eq(campaignTenants.state, options.state),
      ),
    )
    .orderBy(asc(campaignTenants.position))
    .limit(options.limit);
}

// ── App schema versions seen ─────────────────────────────────────────────────────────────────────

/** Notes that an app needing `version` was seen this minute (insert-only; a repeat is a no-op). */
export async function noteAppVersionSeen(db: ControlPlane, version: number): Promise<void> {
  await db
    .insert(appSchemaVersionsSeen)
    .values({ version, minute: sql`date_trunc('minute', now())` })
    .onConflictDoNothing();
}

/** The last minute each app version was seen, for versions seen since `since`. */
export async function appVersionsSeenSince(db: ControlPlane, since: number): Promise<SeenVersion[]> {
  const rows = await db
    .select({
      version: appSchemaVersionsSeen.version,
      lastMs: sql<number>`(extract(epoch FROM max(${appSchemaVersionsSeen.minute})) * 1000)::float8`,
    })
    .from(appSchemaVersionsSeen)
    // The row's minute is when the minute began: a sighting late in it still counts.
    .where(gt(appSchemaVersionsSeen.minute, new Date(since - 60_000)))
    .groupBy(appSchemaVersionsSeen.version);
  return rows.map((row) => ({
    version: row.version,
    // The sighting may have been anywhere in the minute: count it at the minute's end.
    lastSeenAt: Number(row.lastMs) + 59_999,
  }));
}

/** Deletes sightings older than `before` (bounded by the table's own size: one row per version-minute). */
export async function trimAppVersionsSeen(db: ControlPlane, before: number): Promise<number> {
  const deleted = await db
    .delete(appSchemaVersionsSeen)
    .where(lt(appSchemaVersionsSeen.minute, new Date(before)))
    .returning({ version: appSchemaVersionsSeen.version });
  return deleted.length;
}
