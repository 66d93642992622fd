/**
 * `GET /v1/maintenance` (admin): the folds as an operator needs to see them. Recent outcomes
 * (newest first, paged by `cursor`), counters over the retained outcomes, the deltas backlog
 * (count and oldest age) and whether the horizon is pinned right now, and by what; per host, the
 * maintenance reserve in use and what the budget reconcile repaired (released allocations,
 * terminated orphan backends, expired maintenance slots).
 */
import { Hono } from "hono";
import * as v from "valibot";
import { loadConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { rotationProgress } from "../cron/jobs/credential-rotation.ts";
import { foldOptionsFromVars } from "../folds/options.ts";
import { readMaintenanceStatus } from "../folds/status.ts";
import { budgetObject } from "../placement/index.ts";
import { requireAdmin } from "./auth.ts";
import { type AppEnv, regionParam } from "./context.ts";
import { badCursor, pageLimit, query } from "./validation.ts";

export const maintenanceRoutes = new Hono<AppEnv>();

/** Outcome ids are bigints: the cursor stays a string of digits. */
const maintenancePage = v.object({
  limit: pageLimit,
  cursor: v.optional(v.pipe(v.string(), v.regex(/^[1-9][0-9]{0,17}$/, badCursor))),
});

maintenanceRoutes.get("/v1/maintenance", requireAdmin, query(maintenancePage), async (c) => {
  const { limit, cursor: rawCursor } = c.req.valid("query");
  const cursor = rawCursor ?? null;
  const config = loadConfig(c.env);
  const options = foldOptionsFromVars(c.env);
  // One region's maintenance: its folds, its hosts, its rotation (docs/adr/023-regions.md).
  const region = regionParam(c);
  const status = await withControlPlane(
    config,
    c.env,
    region,
    (db) => readMaintenanceStatus(db.$client, options, { before: cursor, limit }),
    "lessor-maintenance",
  );
  // Each host's kind and capabilities, what the budget reconcile repaired, and the maintenance
  // reserve in use right now.
  const hosts = await Promise.all(
    (config.regions.get(region)?.hosts ?? []).map(async (host) => {
      const budget = await budgetObject(c.env, host).status(host, 0);
      const kind = config.hosts.get(host)?.kind ?? "postgres";
      return {
        host,
        kind,
        // What its admin role can do, as last probed (null until an admin connection probes it).
        capabilities: budget.capabilities,
        reserve: budget.reserve,
        maintenance: budget.maintenance,
        reconciled: budget.reconciled,
      };
    }),
  );
  // The scheduled rotation's progress across the fleet (a count, never a list of tenants).
  const credentials = await withControlPlane(config, c.env, region, (db) => rotationProgress(db, config));
  return c.json({ region, ...status, hosts, credentials });
});
