/** Authentication of REST callers: the admin key, or a tenant's own key for its own endpoints. */
import { createMiddleware } from "hono/factory";
import { parseTenantId } from "../core/tenant-id.ts";
import { hashKey, secretMatches } from "../crypto/keys.ts";
import { LessorError } from "../errors/index.ts";
import type { AppContext, AppEnv } from "./context.ts";

/**
 * The token of `Authorization: Bearer <token>`: `missing_credentials` without the header,
 * `invalid_request` for a header of another form (that is a malformed request, not a wrong key).
 */
export function bearerToken(c: AppContext): string {
  const header = c.req.header("Authorization");
  if (!header) throw new LessorError("missing_credentials");
  const token = /^Bearer +(\S+)$/i.exec(header.trim())?.[1];
  if (!token) {
    throw new LessorError("invalid_request", {
      publicMessage: "Send the key as `Authorization: Bearer <key>`.",
    });
  }
  return token;
}

function isAdminKey(c: AppContext, token: string): Promise<boolean> | boolean {
  return c.env.LESSOR_ADMIN_KEY ? secretMatches(token, c.env.LESSOR_ADMIN_KEY) : false;
}

/** Requires `Authorization: Bearer <LESSOR_ADMIN_KEY>`, compared in constant time. */
export const requireAdmin = createMiddleware<AppEnv>(async (c, next) => {
  if (!(await isAdminKey(c, bearerToken(c)))) {
    throw new LessorError("invalid_credentials", { publicMessage: "Invalid key." });
  }
  await next();
});

/** The hex SHA-256 of the bearer token: what a tenant's object compares with its key hash. */
export async function tenantKeyHash(c: AppContext): Promise<string> {
  return hashKey(bearerToken(c));
}

/** Who a tenant-scoped REST call is from. */
export type Principal = { kind: "admin" } | { kind: "tenant"; tenantId: string };

/**
 * Accepts the admin key, or the key of the tenant named by the `:id` path parameter (checked by
 * that tenant's object, so no control-plane read). An unknown tenant and another tenant's key get
 * the same 404, so a tenant key cannot probe which tenants exist.
 */
export async function authenticateTenantOrAdmin(c: AppContext): Promise<Principal> {
  const token = bearerToken(c);
  if (await isAdminKey(c, token)) return { kind: "admin" };
  const tenantId = parseTenantId(c.req.param("id"));
  if (!tenantId) throw new LessorError("invalid_tenant_id");
  const verdict = await c.env.TENANTS.getByName(tenantId).verifyKey(tenantId, await hashKey(token));
  if (verdict.ok) return { kind: "tenant", tenantId };
  if (verdict.error.code === "invalid_credentials") throw new LessorError("tenant_not_found");
  throw LessorError.fromWire(verdict.error);
}
