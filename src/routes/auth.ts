/** Authentication of REST callers: the admin key, or a tenant's own key for its own endpoints. */
import { createMiddleware } from "hono/factory";
import { adminActor } from "../audit/index.ts";
import { loadConfig } from "../config/index.ts";
import type { TenantId } from "../core/tenant-id.ts";
import { hashKey, secretMatches } from "../crypto/keys.ts";
import { verifyTenantKey } from "../crypto/tenant-keys.ts";
import { LessorError } from "../errors/index.ts";
import { callOwner } from "../placement/moves.ts";
import type { KeyProof, Verdict } from "../rpc/tenant.ts";
import { type AppContext, type AppEnv, regionParam } from "./context.ts";

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

/** Where the admin key is: what a refused operator needs to read next. */
const whereTheAdminKeyIs =
  "The admin key is the LESSOR_ADMIN_KEY secret; locally, npm start prints it and keeps it in .lessor/secrets.json (adminKey).";

/**
 * The refusal of a key that is not the admin key: it names a tenant key only when a tenant key
 * (`lsk_…`) was sent, and says where the admin key is. Nothing in it depends on a secret.
 */
export function notTheAdminKey(token: string): string {
  return token.startsWith("lsk_")
    ? `This endpoint needs the admin key; a tenant key (lsk_…) does not open it. ${whereTheAdminKeyIs}`
    : `This endpoint needs the admin key, and the key sent is not it. ${whereTheAdminKeyIs}`;
}

/**
 * Requires `Authorization: Bearer <LESSOR_ADMIN_KEY>`, compared in constant time, and names the
 * caller for the audit log (`c.var.actor`: a fingerprint of the key, never the key).
 */
export const requireAdmin = createMiddleware<AppEnv>(async (c, next) => {
  const token = bearerToken(c);
  if (!(await isAdminKey(c, token))) {
    throw new LessorError("invalid_credentials", { publicMessage: notTheAdminKey(token) });
  }
  c.set("actor", await adminActor(token));
  await next();
});

/**
 * Checks that `key` is a key Lessor minted for `tenantId` (its MAC), in microseconds and before
 * any object, storage or database is touched, and answers what the tenant's object needs to
 * compare. A failure is counted per tenant id: past the limit, failures answer `429` (a valid key
 * is never counted, so the right key is never locked out); otherwise the caller decides the shape
 * of the refusal (`/sql` answers like Postgres, REST with `401`).
 */
export async function proveTenantKey(
  c: AppContext,
  tenantId: TenantId,
  key: string,
): Promise<KeyProof | null> {
  const config = loadConfig(c.env);
  const verified = await verifyTenantKey(config.keyMacRing, tenantId, key);
  // A key names its region inside the MAC; one naming a region this deployment lacks is refused as
  // a forged key is (it reaches no object and no control plane).
  const region = verified ? (verified.region ?? config.defaultRegion) : null;
  if (verified && region !== null && config.regions.has(region)) {
    return { keyId: verified.keyId, keyHash: await hashKey(key), region };
  }
  await countFailedAuthentication(c, tenantId);
  return null;
}

/** Counts a failed authentication against `tenantId`; throws `429` past the limit. */
export async function countFailedAuthentication(c: AppContext, tenantId: string): Promise<void> {
  const { success } = await c.env.AUTH_FAILURES.limit({ key: tenantId });
  if (!success) throw new LessorError("authentication_rate_limited", { retryAfterSeconds: 10 });
}

/** Who a tenant-scoped REST call is from. */
export type Principal = { kind: "admin" } | { kind: "tenant"; tenantId: string; proof: KeyProof };

/**
 * Accepts the admin key, or a key of the tenant `tenantId`. An unknown tenant, a forged key,
 * another tenant's key and a revoked key all get the same `401 invalid_credentials`.
 */
export async function authenticateTenantOrAdmin(c: AppContext, tenantId: TenantId): Promise<Principal> {
  const token = bearerToken(c);
  if (await isAdminKey(c, token)) return { kind: "admin" };
  return { kind: "tenant", tenantId, proof: await requireTenantKey(c, tenantId, token) };
}

/**
 * The region a tenant-scoped call is for: the one the tenant's key names inside its MAC, or, for
 * the admin key, `?region=` (the default region without it).
 */
export function principalRegion(c: AppContext, principal: Principal): string {
  return principal.kind === "tenant" ? principal.proof.region : regionParam(c);
}

/** A proof that `token` is a usable key of `tenantId`, checked at the edge and by its object. */
export async function requireTenantKey(c: AppContext, tenantId: TenantId, token: string): Promise<KeyProof> {
  const proof = await proveTenantKey(c, tenantId, token);
  if (!proof) throw new LessorError("invalid_credentials");
  const { answer: verdict, proof: owner } = await callOwner<Verdict>(
    c.env,
    tenantId,
    proof,
    async (object, asked) => object.verifyKey(tenantId, asked),
  );
  // The proof names the owner's region: the route reads and writes that region's control plane.
  if (verdict.ok) return owner;
  if (verdict.error.code === "invalid_credentials") await countFailedAuthentication(c, tenantId);
  throw LessorError.fromWire(verdict.error);
}
