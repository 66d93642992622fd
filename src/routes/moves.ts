/**
 * Moving a tenant between regions (docs/adr/023-regions.md), an operator action (admin key):
 *
 *     POST /v1/tenants/:id/move[?region=<from>]  {"region": "<to>", "force"?: true}
 *          → 202 {"state":"moving","from","to","stage","startedAt",…} once the fence is closed
 *     GET  /v1/tenants/:id/move[?region=<from>]  → the move's status (moving, or moved and when)
 *
 * `?region=` names the region the tenant is in (the default region without it); the job runs in
 * that region's object of the tenant, which is the only one that may serve it until the switch.
 */
import { Hono } from "hono";
import * as v from "valibot";
import { loadConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { parseTenantId, type TenantId } from "../core/tenant-id.ts";
import { LessorError } from "../errors/index.ts";
import { loadMoveOf, moveStatusOf } from "../move/store.ts";
import { tenantObject } from "../placement/index.ts";
import { requireAdmin } from "./auth.ts";
import { type AppContext, type AppEnv, regionParam } from "./context.ts";
import { jsonBody, jsonObject } from "./validation.ts";

export const moveRoutes = new Hono<AppEnv>();

function tenantParam(c: AppContext): TenantId {
  const id = parseTenantId(c.req.param("id"));
  if (!id) throw new LessorError("invalid_tenant_id");
  return id;
}

const moveBody = jsonObject({
  region: v.string("region (the region to move the tenant to) is required."),
  force: v.optional(v.boolean("force must be true or false."), false),
});

moveRoutes.post(
  "/v1/tenants/:id/move",
  requireAdmin,
  jsonBody(moveBody, { region: "region_unknown" }),
  async (c) => {
    const id = tenantParam(c);
    const from = regionParam(c);
    const { region: to, force } = c.req.valid("json");
    if (!loadConfig(c.env).regions.has(to)) {
      throw new LessorError("region_unknown", {
        publicMessage: `No region is named ${JSON.stringify(to.slice(0, 40))}; this deployment has ${[...loadConfig(c.env).regions.keys()].join(", ")}.`,
      });
    }
    const answer = await tenantObject(c.env, from, id).requestMove(id, to, c.var.actor, force);
    if (!answer.ok) throw LessorError.fromWire(answer.error);
    return c.json(answer.status, answer.status.state === "moving" ? 202 : 200);
  },
);

moveRoutes.get("/v1/tenants/:id/move", requireAdmin, async (c) => {
  const id = tenantParam(c);
  const job = await withControlPlane(loadConfig(c.env), c.env, regionParam(c), (db) => loadMoveOf(db, id));
  if (!job) throw new LessorError("move_not_found");
  return c.json(moveStatusOf(job));
});
