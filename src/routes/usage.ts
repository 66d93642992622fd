/**
 * Usage readers: `GET /v1/tenants/:id/usage` (the admin key, or that tenant's own key) and
 * `GET /v1/usage` (admin: fleet totals). Both are exact at every moment (src/usage/readers.ts).
 */
import { Hono } from "hono";
import { loadConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { parseTenantId } from "../core/tenant-id.ts";
import { LessorError } from "../errors/index.ts";
import { readFleetUsage, readTenantUsage } from "../usage/readers.ts";
import { authenticateTenantOrAdmin, principalRegion, requireAdmin } from "./auth.ts";
import { type AppEnv, regionParam } from "./context.ts";

export const usageRoutes = new Hono<AppEnv>();

usageRoutes.get("/v1/tenants/:id/usage", async (c) => {
  const id = parseTenantId(c.req.param("id"));
  if (!id) throw new LessorError("invalid_tenant_id");
  const region = principalRegion(c, await authenticateTenantOrAdmin(c, id));
  const usage = await withControlPlane(loadConfig(c.env), c.env, region, (db) => readTenantUsage(db, id));
  if (!usage) throw new LessorError("tenant_not_found");
  return c.json(usage);
});

usageRoutes.get("/v1/usage", requireAdmin, async (c) => {
  const region = regionParam(c);
  const usage = await withControlPlane(loadConfig(c.env), c.env, region, (db) => readFleetUsage(db));
  return c.json({ region, ...usage });
});
