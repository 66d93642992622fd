/**
 * Tenant erase (admin key), docs/adr/011-erase-stage-order.md:
 *
 *     DELETE /v1/tenants/:id?confirm=:id[&force=true]  → 202 {"state":"erasing","stage","startedAt"}
 *     GET    /v1/tenants/:id/erase                     → {"state":"erasing","stage","startedAt","attempts","lastError"}
 *                                                        | {"state":"erased","erasedAt"[,"database":"detached"]}
 *
 * The tenant's object closes the gate and runs the job; the answer comes once the gate is closed.
 * Sending the DELETE again while the erase runs answers the same job.
 */
import { Hono } from "hono";
import * as v from "valibot";
import { loadConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { parseTenantId, type TenantId } from "../core/tenant-id.ts";
import { eraseStatusOf, loadEraseOf } from "../erase/store.ts";
import { LessorError } from "../errors/index.ts";
import { tenantObject } from "../placement/index.ts";
import { requireAdmin } from "./auth.ts";
import { type AppContext, type AppEnv, regionParam } from "./context.ts";
import { query } from "./validation.ts";

export const eraseRoutes = new Hono<AppEnv>();

function tenantParam(c: AppContext): TenantId {
  const id = parseTenantId(c.req.param("id"));
  if (!id) throw new LessorError("invalid_tenant_id");
  return id;
}

const eraseQuery = v.object({
  confirm: v.optional(v.string()),
  force: v.optional(v.picklist(["true", "false"], "force must be true or false."), "false"),
});

eraseRoutes.delete("/v1/tenants/:id", requireAdmin, query(eraseQuery), async (c) => {
  const id = tenantParam(c);
  const { confirm, force } = c.req.valid("query");
  if (confirm !== id) throw new LessorError("confirm_mismatch");
  const answer = await tenantObject(c.env, regionParam(c), id).requestErase(
    id,
    c.var.actor,
    force === "true",
  );
  if (!answer.ok) throw LessorError.fromWire(answer.error);
  return c.json(answer.status, answer.status.state === "erasing" ? 202 : 200);
});

eraseRoutes.get("/v1/tenants/:id/erase", requireAdmin, async (c) => {
  const id = tenantParam(c);
  const job = await withControlPlane(loadConfig(c.env), c.env, regionParam(c), (db) => loadEraseOf(db, id));
  if (!job) throw new LessorError("erase_not_found");
  return c.json(eraseStatusOf(job));
});
