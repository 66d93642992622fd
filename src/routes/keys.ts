/**
 * A tenant's keys (the admin key, or one of the tenant's own keys):
 *
 *     POST   /v1/tenants/:id/keys            {"expiresAt"?, "scope"?}  → 201 {keyId, key, scope, createdAt, expiresAt, connectionString}
 *     GET    /v1/tenants/:id/keys                            → {keys: [{keyId, scope, createdAt, lastUsedAt, expiresAt}]}
 *     DELETE /v1/tenants/:id/keys/:keyId     [?force=true]   → 204
 *
 * A key is shown once; its hash is never shown. Revocation is immediate: the tenant's object gets
 * its new key list before the answer, so no request with the key succeeds afterwards, on any route,
 * and a session lease opened with it ends.
 *
 * A key's scope is `full` (the default: the tenant role, every route) or `jwt`: an end-user key,
 * safe to ship to a browser, that opens `/sql` only and only with a valid end-user token
 * (docs/adr/012-end-user-jwts.md).
 */
import { Hono } from "hono";
import * as v from "valibot";
import { keyRegionOf, loadConfig } from "../config/index.ts";
import { loadTenantRecord, withControlPlane } from "../control-plane/index.ts";
import { issueKey, listKeys, revokeKey } from "../control-plane/keys.ts";
import { parseTenantId, type TenantId } from "../core/tenant-id.ts";
import { hashKey } from "../crypto/keys.ts";
import { mintTenantKey } from "../crypto/tenant-keys.ts";
import { LessorError } from "../errors/index.ts";
import { tenantObject } from "../placement/index.ts";
import { authenticateTenantOrAdmin, principalRegion } from "./auth.ts";
import type { AppContext, AppEnv } from "./context.ts";
import { jsonBody, jsonObject, query } from "./validation.ts";

export const keyRoutes = new Hono<AppEnv>();

/** Keys expire at most this far ahead (a longer life is no expiry at all: leave it out). */
const maxKeyLifeMs = 10 * 365 * 24 * 3600_000;

function tenantParam(c: AppContext): TenantId {
  const id = parseTenantId(c.req.param("id"));
  if (!id) throw new LessorError("invalid_tenant_id");
  return id;
}

/** Hands the tenant's object its current keys: what makes a revocation immediate. */
async function refreshObject(c: AppContext, region: string, tenantId: TenantId): Promise<void> {
  const config = loadConfig(c.env);
  const record = await withControlPlane(config, c.env, region, (db) =>
    loadTenantRecord(db, config, tenantId),
  );
  if (record) await tenantObject(c.env, region, tenantId).configure(record);
}

const issueBody = jsonObject({
  scope: v.optional(v.picklist(["full", "jwt"], "scope must be full or jwt."), "full"),
  expiresAt: v.optional(
    v.pipe(
      v.string("expiresAt must be an ISO 8601 time."),
      v.isoTimestamp("expiresAt must be an ISO 8601 time with a time zone, e.g. 2027-01-31T00:00:00Z."),
      v.transform((raw: string) => new Date(raw)),
      v.check(
        (at: Date) => at.getTime() > Date.now() && at.getTime() < Date.now() + maxKeyLifeMs,
        "expiresAt must be in the future, and within ten years.",
      ),
    ),
  ),
});

keyRoutes.post("/v1/tenants/:id/keys", jsonBody(issueBody), async (c) => {
  const tenantId = tenantParam(c);
  const region = principalRegion(c, await authenticateTenantOrAdmin(c, tenantId));
  const { expiresAt, scope } = c.req.valid("json");
  const config = loadConfig(c.env);
  // A new key names the tenant's region inside its MAC, as the tenant's first key did.
  const minted = await mintTenantKey(config.keyMacRing, tenantId, keyRegionOf(config, region));
  const row = await withControlPlane(config, c.env, region, async (db) =>
    issueKey(
      db,
      {
        tenantId,
        keyId: minted.keyId,
        keyHash: await hashKey(minted.key),
        expiresAt: expiresAt ?? null,
        scope,
      },
      config.maxKeysPerTenant,
    ),
  );
  await refreshObject(c, region, tenantId);
  return c.json(
    {
      keyId: row.keyId,
      key: minted.key,
      scope: row.scope,
      createdAt: row.createdAt.toISOString(),
      expiresAt: row.expiresAt?.toISOString() ?? null,
      // As POST /v1/tenants gives it: what an app (or a browser, for an end-user key) connects with.
      connectionString: `postgres://${tenantId}:${minted.key}@${new URL(c.req.url).host}/${tenantId}`,
    },
    201,
  );
});

keyRoutes.get("/v1/tenants/:id/keys", async (c) => {
  const tenantId = tenantParam(c);
  const region = principalRegion(c, await authenticateTenantOrAdmin(c, tenantId));
  const rows = await withControlPlane(loadConfig(c.env), c.env, region, (db) => listKeys(db, tenantId));
  return c.json({
    keys: rows.map((row) => ({
      keyId: row.keyId,
      scope: row.scope,
      createdAt: row.createdAt.toISOString(),
      lastUsedAt: row.lastUsedAt?.toISOString() ?? null,
      expiresAt: row.expiresAt?.toISOString() ?? null,
    })),
  });
});

const revokeQuery = v.object({
  force: v.optional(v.picklist(["true", "false"], "force must be true or false."), "false"),
});

keyRoutes.delete("/v1/tenants/:id/keys/:keyId", query(revokeQuery), async (c) => {
  const tenantId = tenantParam(c);
  const region = principalRegion(c, await authenticateTenantOrAdmin(c, tenantId));
  const keyId = c.req.param("keyId");
  if (!/^k_[0-9a-f]{16}$/.test(keyId)) throw new LessorError("key_not_found");
  const force = c.req.valid("query").force === "true";
  await withControlPlane(loadConfig(c.env), c.env, region, (db) => revokeKey(db, tenantId, keyId, force));
  await refreshObject(c, region, tenantId);
  return c.body(null, 204);
});
