/**
 * `GET /v1/audit` (admin): the audit log, newest first, paged (`cursor` is the last row's id),
 * filtered by `tenant` and by `action` (one, or several separated by commas).
 */
import { Hono } from "hono";
import * as v from "valibot";
import { auditActions, listAudit, publicAuditRow } from "../audit/index.ts";
import { loadConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { requireAdmin } from "./auth.ts";
import { type AppEnv, regionParam } from "./context.ts";
import { integerCursor, pageLimit, query, tenantIdSchema } from "./validation.ts";

export const auditRoutes = new Hono<AppEnv>();

const actionList = v.pipe(
  v.string(),
  v.transform((raw: string) => raw.split(",").map((action) => action.trim())),
  v.check(
    (actions: string[]) =>
      actions.length > 0 && actions.every((action) => (auditActions as readonly string[]).includes(action)),
    `action must be one or more (comma-separated) of ${auditActions.join(", ")}.`,
  ),
);

const auditPage = v.object({
  limit: pageLimit,
  cursor: integerCursor(1),
  tenant: v.optional(tenantIdSchema),
  action: v.optional(actionList),
});

auditRoutes.get("/v1/audit", requireAdmin, query(auditPage, { tenant: "invalid_tenant_id" }), async (c) => {
  const { limit, cursor, tenant, action } = c.req.valid("query");
  const rows = await withControlPlane(loadConfig(c.env), c.env, regionParam(c), (db) =>
    listAudit(db, {
      tenantId: tenant ?? null,
      actions: action ?? null,
      before: cursor ?? null,
      limit: limit + 1,
    }),
  );
  const page = rows.slice(0, limit);
  return c.json({
    entries: page.map(publicAuditRow),
    nextCursor: rows.length > limit ? String(page.at(-1)?.id ?? "") : null,
  });
});
