/**
 * Tenant ids are validated slugs, checked before anything (a Durable Object, a catalog row, a
 * database name) is derived from them. Arbitrary strings never select connection parameters.
 */

const tenantIdPattern = /^[a-z0-9](?:[a-z0-9-]{0,38}[a-z0-9])?$/;

/** A string that passed `parseTenantId`. */
export type TenantId = string & { readonly __brand: "TenantId" };

/** Returns the id if it is a valid slug (lowercase letters, digits, inner hyphens, ≤ 40), else null. */
export function parseTenantId(raw: unknown): TenantId | null {
  return typeof raw === "string" && tenantIdPattern.test(raw) ? (raw as TenantId) : null;
}
