/** Authentication of REST callers: the admin key, or a tenant's own key for its own endpoints. */
import { bearerAuth } from "hono/bearer-auth";
import { createMiddleware } from "hono/factory";
import { parseTenantId } from "../core/tenant-id.ts";
import { hashKey, secretMatches } from "../crypto/keys.ts";
import { errorCatalog, LessorError } from "../errors/index.ts";
import type { AppContext, AppEnv } from "./context.ts";

const missing = { code: "missing_credentials", message: errorCatalog.missing_credentials.message };
const malformed = { code: "invalid_request", message: "Send the key as `Authorization: Bearer <key>`." };
const invalid = { code: "invalid_credentials", message: "Invalid key." };

function isAdminKey(c: AppContext, token: string): Promise<boolean> | boolean {
  return c.env.LESSOR_ADMIN_KEY ? secretMatches(token, c.env.LESSOR_ADMIN_KEY) : false;
}

/** Requires `Authorization: Bearer <LESSOR_ADMIN_KEY>`, compared in constant time. */
export const requireAdmin = createMiddleware<AppEnv>((c, next) =>
  bearerAuth<AppEnv>({
    verifyToken: (token) => isAdminKey(c, token),
    noAuthenticationHeader: { message: missing },
    // Hono answers a malformed header with 400: that is an invalid request, not a wrong key.
    invalidAuthenticationHeader: { message: malformed },
    invalidToken: { message: invalid },
  })(c, next),
);

/** Who a tenant-scoped REST call is from. */
export type Principal = { kind: "admin" } | { kind: "tenant"; tenantId: string };

/**
 * Accepts the admin key, or the key of the tenant named by the `:id` path parameter (checked by
 * that tenant's object, so no control-plane read). An unknown tenant and another tenant's key get
 * the same 404, so a tenant key cannot probe which tenants exist.
 */
export async function authenticateTenantOrAdmin(c: AppContext): Promise<Principal> {
  const header = c.req.header("Authorization");
  const token = header?.match(/^Bearer\s+(\S+)$/i)?.[1];
  if (!header) throw new LessorError("missing_credentials");
  if (!token) throw new LessorError("invalid_credentials");
  if (await isAdminKey(c, token)) return { kind: "admin" };
  const tenantId = parseTenantId(c.req.param("id"));
  if (!tenantId) throw new LessorError("invalid_tenant_id");
  const verdict = await c.env.TENANTS.getByName(tenantId).verifyKey(tenantId, await hashKey(token));
  if (verdict.ok) return { kind: "tenant", tenantId };
  if (verdict.error.code === "invalid_credentials") throw new LessorError("tenant_not_found");
  throw LessorError.fromWire(verdict.error);
}
