/**
 * The operator's fleet view (admin key), for the status page and `lessorctl`:
 *
 *     GET /v1/fleet/overview                     hosts, pools by state, failing tenants, recent
 *                                                events, latest campaigns, folds: one glance
 *     GET /v1/fleet/failing?limit=               tenants whose latest event moved them to failed,
 *                                                newest first, and how many per host
 *     GET /v1/fleet/events?limit=&cursor=        the fleet's lifecycle events, newest first
 *     GET /v1/fleet/tenants?q=<prefix>&limit=    tenant search by id prefix (never the whole catalog)
 *     GET /v1/capacity/evictions?host=&tier=|size=   the eviction dry run of each host of the region
 */
import { Hono } from "hono";
import * as v from "valibot";
import { loadConfig, regionNamed } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { LessorError } from "../errors/index.ts";
import { readOverview } from "../fleet/overview.ts";
import {
  countFailingByHost,
  defaultFailingWindowMs,
  parseEventCursor,
  readFailingTenants,
  readRecentEvents,
  searchTenants,
} from "../fleet/readers.ts";
import { budgetObject } from "../placement/index.ts";
import { requireAdmin } from "./auth.ts";
import { type AppEnv, regionParam } from "./context.ts";
import { badCursor, pageLimit, query } from "./validation.ts";

export const fleetRoutes = new Hono<AppEnv>();

fleetRoutes.get("/v1/fleet/overview", requireAdmin, async (c) => {
  return c.json(await readOverview(c.env, loadConfig(c.env), regionParam(c)));
});

fleetRoutes.get("/v1/fleet/failing", requireAdmin, query(v.object({ limit: pageLimit })), async (c) => {
  const { limit } = c.req.valid("query");
  const { failing, byHost } = await withControlPlane(
    loadConfig(c.env),
    c.env,
    regionParam(c),
    async (db) => ({
      failing: await readFailingTenants(db, { windowMs: defaultFailingWindowMs, limit }),
      byHost: await countFailingByHost(db, defaultFailingWindowMs),
    }),
    "lessor-operator",
  );
  return c.json({
    windowSeconds: defaultFailingWindowMs / 1000,
    count: failing.count,
    byHost: Object.fromEntries(byHost),
    tenants: failing.tenants,
  });
});

const eventsPage = v.object({
  limit: pageLimit,
  cursor: v.optional(
    v.pipe(
      v.string(),
      v.check((raw) => parseEventCursor(raw) !== null, badCursor),
    ),
  ),
});

fleetRoutes.get("/v1/fleet/events", requireAdmin, query(eventsPage), async (c) => {
  const { limit, cursor } = c.req.valid("query");
  const before = cursor === undefined ? null : parseEventCursor(cursor);
  const page = await withControlPlane(
    loadConfig(c.env),
    c.env,
    regionParam(c),
    (db) => readRecentEvents(db, { limit, before }),
    "lessor-operator",
  );
  return c.json(page);
});

const searchQuery = v.object({
  q: v.pipe(
    v.string("q (a tenant id prefix) is required."),
    v.regex(
      /^[a-z0-9][a-z0-9-]{0,39}$/,
      "q must be the start of a tenant id (lowercase letters, digits, hyphens).",
    ),
  ),
  limit: v.optional(
    v.pipe(
      v.string(),
      v.regex(/^[1-9][0-9]?$/, "limit must be an integer from 1 to 50."),
      v.transform(Number),
      v.maxValue(50, "limit must be an integer from 1 to 50."),
    ),
    "20",
  ),
});

fleetRoutes.get("/v1/fleet/tenants", requireAdmin, query(searchQuery), async (c) => {
  const { q, limit } = c.req.valid("query");
  const tenants = await withControlPlane(
    loadConfig(c.env),
    c.env,
    regionParam(c),
    (db) => searchTenants(db, q, limit),
    "lessor-operator",
  );
  return c.json({ tenants });
});

const evictionsQuery = v.object({
  host: v.optional(v.string()),
  tier: v.optional(v.string()),
  size: v.optional(
    v.pipe(v.string(), v.regex(/^[1-9][0-9]{0,3}$/, "size must be a positive integer."), v.transform(Number)),
  ),
});

fleetRoutes.get("/v1/capacity/evictions", requireAdmin, query(evictionsQuery), async (c) => {
  const config = loadConfig(c.env);
  const region = regionNamed(config, regionParam(c));
  const { host, tier, size } = c.req.valid("query");
  const named = host === undefined ? undefined : config.hosts.get(host);
  if (host !== undefined && !named) throw new LessorError("unknown_host");
  if (named && named.region !== region.name) {
    throw new LessorError("host_not_in_region", {
      publicMessage: `Host ${named.name} is in region ${named.region}, not ${region.name}; ask that region (?region=${named.region}, lessorctl --region ${named.region}).`,
    });
  }
  if (tier !== undefined && size !== undefined) {
    throw new LessorError("invalid_request", { publicMessage: "Give either tier or size, not both." });
  }
  // A start reserves its tier's size (which an adaptive pool may later grow past, up to its maximum).
  const tierSize = config.poolStartSizes.get(tier ?? config.defaultTier);
  if (tierSize === undefined) throw new LessorError("unknown_tier");
  const names = host === undefined ? region.hosts : [host];
  const hosts = await Promise.all(
    names.map((name) => budgetObject(c.env, name).evictionReport(name, size ?? tierSize)),
  );
  return c.json({
    region: region.name,
    tier: size === undefined ? (tier ?? config.defaultTier) : null,
    hosts,
  });
});
