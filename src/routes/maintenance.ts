/**
 * `GET /v1/maintenance` (admin): the folds as an operator needs to see them. Recent outcomes
 * (newest first, paged by `cursor`), counters over the retained outcomes, the deltas backlog
 * (count and oldest age) and whether the horizon is pinned right now, and by what.
 */
import { Hono } from "hono";
import { loadConfig } from "../config/index.ts";
import { LessorError } from "../errors/index.ts";
import { withControlPlaneClient } from "../maintenance/index.ts";
import { foldOptionsFromVars } from "../maintenance/options.ts";
import { readMaintenanceStatus } from "../maintenance/status.ts";
import { requireAdmin } from "./auth.ts";
import { type AppEnv, pageLimit } from "./context.ts";

export const maintenanceRoutes = new Hono<AppEnv>();

maintenanceRoutes.get("/v1/maintenance", requireAdmin, async (c) => {
  const limit = pageLimit(c.req.query("limit"));
  const cursor = c.req.query("cursor") ?? null;
  if (cursor !== null && !/^[1-9][0-9]{0,17}$/.test(cursor)) {
    throw new LessorError("invalid_request", {
      publicMessage: "cursor is not a cursor this endpoint returned.",
    });
  }
  const config = loadConfig(c.env);
  const options = foldOptionsFromVars(c.env);
  const status = await withControlPlaneClient(config, c.env, "lessor-maintenance", (client) =>
    readMaintenanceStatus(client, options, { before: cursor, limit }),
  );
  return c.json(status);
});
