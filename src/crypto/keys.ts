/**
 * Secrets and their hashes: database passwords, and the SHA-256 under which keys are stored (a
 * high-entropy key needs no slow hash: there is nothing to guess). Tenant keys themselves are
 * minted in tenant-keys.ts.
 */

import { toBase64Url, toHex } from "./encoding.ts";

/** A random password for a tenant's Postgres role (256 bits, URL-safe). */
export function generateDatabasePassword(): string {
  return toBase64Url(crypto.getRandomValues(new Uint8Array(32)));
}

/** Hex SHA-256 of a key: what the catalog and the TenantObject store. */
export async function hashKey(key: string): Promise<string> {
  return toHex(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(key)));
}

/** Constant-time comparison of two hex hashes of equal length. */
export function hashesEqual(a: string, b: string): boolean {
  const encoder = new TextEncoder();
  const left = encoder.encode(a);
  const right = encoder.encode(b);
  if (left.byteLength !== right.byteLength) return false;
  return crypto.subtle.timingSafeEqual(left, right);
}

/** Compares a presented secret with the expected one without leaking where they differ. */
export async function secretMatches(presented: string, expected: string): Promise<boolean> {
  const [a, b] = await Promise.all([hashKey(presented), hashKey(expected)]);
  return hashesEqual(a, b);
}
