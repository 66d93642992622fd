/**
 * Operator endpoints for migration campaigns (admin key, checked per route).
 *
 *     POST /v1/campaigns                {"toVersion", "concurrency", "canary" | "canaryPercent", …}
 *     GET  /v1/campaigns                newest first, paged
 *     GET  /v1/campaigns/:id            counts and per-tenant results, paged
 *     POST /v1/campaigns/:id/pause | resume | cancel
 *
 * The cron trigger does the work (src/campaigns/runner.ts); these routes only create and steer.
 */
import { Hono } from "hono";
import * as v from "valibot";
import { writeAudit } from "../audit/index.ts";
import type { CampaignRow, CampaignTenantRow } from "../campaigns/store.ts";
import {
  campaignIdPattern,
  countsOf,
  createCampaign,
  listCampaigns,
  listCampaignTenants,
  loadCampaign,
  loadTally,
  moveCampaign,
} from "../campaigns/store.ts";
import { loadConfig } from "../config/index.ts";
import { type ControlPlane, withControlPlane } from "../control-plane/index.ts";
import {
  type ActiveState,
  type ControlAction,
  campaignSpecSchema,
  controlCampaign,
  type TenantState,
  tenantStates,
} from "../core/campaign.ts";
import { parseTenantId } from "../core/tenant-id.ts";
import { LessorError } from "../errors/index.ts";
import { tenantMigrations } from "../migrations/tenant.gen.ts";
import { requireAdmin } from "./auth.ts";
import { type AppContext, type AppEnv, regionParam } from "./context.ts";
import { integerCursor, jsonBody, pageLimit, query } from "./validation.ts";

export const campaignRoutes = new Hono<AppEnv>();

function campaignParam(c: AppContext): string {
  const id = c.req.param("id") ?? "";
  if (!campaignIdPattern.test(id)) throw new LessorError("campaign_not_found");
  return id;
}

function publicCampaign(row: CampaignRow) {
  return {
    id: row.id,
    state: row.state,
    pausedFrom: row.pausedFrom,
    toVersion: row.toVersion,
    concurrency: row.concurrency,
    continueOnFailure: row.continueOnFailure,
    force: row.force,
    drainTimeoutMs: row.drainTimeoutMs,
    stabilityWindowMs: row.stabilityWindowMs,
    canaryPercent: row.canaryPercent,
    scope: row.listed ? "listed" : "fleet",
    // Customers' databases: migrated (`include`) or left out (`skip`, and how many were).
    adopted: { policy: row.adoptedPolicy, skipped: row.adoptedSkipped },
    contractSteps: row.contractSteps,
    blockedReason: row.blockedReason,
    reason: row.reason,
    createdAt: row.createdAt.toISOString(),
    updatedAt: row.updatedAt.toISOString(),
    startedAt: row.startedAt?.toISOString() ?? null,
    finishedAt: row.finishedAt?.toISOString() ?? null,
  };
}

function publicTenantResult(row: CampaignTenantRow) {
  return {
    tenantId: row.tenantId,
    cohort: row.cohort,
    state: row.state,
    fromVersion: row.fromVersion,
    toVersion: row.toVersion,
    attempts: row.attempts,
    startedAt: row.startedAt?.toISOString() ?? null,
    finishedAt: row.finishedAt?.toISOString() ?? null,
    retryAt: row.retryAt?.toISOString() ?? null,
    skipReason: row.skipReason,
    failureSummary: row.failureSummary,
  };
}

const campaignSpec = campaignSpecSchema(tenantMigrations.length, (raw) => parseTenantId(raw) !== null);

campaignRoutes.post("/v1/campaigns", requireAdmin, jsonBody(campaignSpec), async (c) => {
  const spec = c.req.valid("json");
  const config = loadConfig(c.env);
  const created = await withControlPlane(config, c.env, regionParam(c), (db) =>
    createCampaign(db, spec, tenantMigrations, Date.now(), c.var.actor),
  );
  return c.json(
    {
      region: regionParam(c),
      campaign: publicCampaign(created.campaign),
      enrolled: created.enrolled,
      canary: created.canary,
      alreadyCurrent: created.alreadyCurrent,
      adoptedSkipped: created.adoptedSkipped,
    },
    201,
  );
});

const campaignPage = v.object({ limit: pageLimit, cursor: integerCursor(1) });

campaignRoutes.get("/v1/campaigns", requireAdmin, query(campaignPage), async (c) => {
  const { limit, cursor } = c.req.valid("query");
  const before = cursor ?? null;
  const rows = await withControlPlane(loadConfig(c.env), c.env, regionParam(c), (db) =>
    listCampaigns(db, before, limit + 1),
  );
  const page = rows.slice(0, limit);
  return c.json({
    region: regionParam(c),
    campaigns: page.map(publicCampaign),
    nextCursor: rows.length > limit ? String(page.at(-1)?.seq ?? "") : null,
  });
});

const campaignTenantPage = v.object({
  limit: pageLimit,
  cursor: integerCursor(0),
  state: v.optional(v.picklist(tenantStates, `state must be one of ${tenantStates.join(", ")}.`)),
});

campaignRoutes.get("/v1/campaigns/:id", requireAdmin, query(campaignTenantPage), async (c) => {
  const id = campaignParam(c);
  const { limit, cursor, state: chosen } = c.req.valid("query");
  const after = cursor ?? null;
  const state: TenantState | null = chosen ?? null;
  const found = await withControlPlane(loadConfig(c.env), c.env, regionParam(c), async (db) => {
    const campaign = await loadCampaign(db, id);
    if (!campaign) return null;
    const tally = await loadTally(db, id);
    const tenants = await listCampaignTenants(db, id, { after, limit: limit + 1, state });
    return { campaign, tally, tenants };
  });
  if (!found) throw new LessorError("campaign_not_found");
  const page = found.tenants.slice(0, limit);
  return c.json({
    campaign: publicCampaign(found.campaign),
    counts: countsOf(found.tally, found.campaign.erasedTenants),
    cohorts: found.tally,
    tenants: page.map(publicTenantResult),
    nextCursor: found.tenants.length > limit ? String(page.at(-1)?.position ?? "") : null,
  });
});

for (const action of ["pause", "resume", "cancel"] as const satisfies readonly ControlAction[]) {
  campaignRoutes.post(`/v1/campaigns/:id/${action}`, requireAdmin, async (c) => {
    const id = campaignParam(c);
    const campaign = await withControlPlane(loadConfig(c.env), c.env, regionParam(c), async (db) => {
      // Compare-and-swap against the state just read; a tick moving the campaign in between makes
      // the swap miss, and the action is decided again on the new state.
      for (let attempt = 0; attempt < 5; attempt++) {
        const current = await loadCampaign(db, id);
        if (!current) throw new LessorError("campaign_not_found");
        const decision = controlCampaign(current.state, current.pausedFrom as ActiveState | null, action);
        if (decision.kind === "unchanged") return current;
        if (decision.kind === "conflict") {
          throw new LessorError("campaign_state_conflict", { publicMessage: decision.message });
        }
        // The move and its audit row commit together.
        const moved = await db.transaction(async (tx) => {
          const row = await moveCampaign(
            tx as unknown as ControlPlane,
            id,
            current.state,
            decision.state,
            Date.now(),
            {
              pausedFrom: decision.pausedFrom,
              ...(action === "cancel" ? { reason: "cancelled by the operator" } : {}),
            },
          );
          if (row) {
            await writeAudit(tx, {
              actor: c.var.actor,
              action: `campaign.${action}`,
              tenantId: null,
              detail: { campaign: id, from: current.state, to: row.state },
            });
          }
          return row;
        });
        if (moved) return moved;
      }
      throw new LessorError("campaign_state_conflict", {
        publicMessage: "The campaign kept changing state; retry.",
      });
    });
    return c.json({ campaign: publicCampaign(campaign) });
  });
}
