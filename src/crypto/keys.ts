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

/**
 * Comparison of two hex hashes that takes the same time wherever they differ: every character is
 * looked at, with no early exit. (It runs on every request; encoding both strings to bytes for
 * `crypto.subtle.timingSafeEqual` cost more than the comparison itself.)
 */
export function hashesEqual(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let difference = 0;
  for (let i = 0; i < a.length; i++) difference |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return difference === 0;
}

/** Compares a presented secret with the expected one without leaking where they differ. */
export async function secretMatches(presented: string, expected: string): Promise<boolean> {
  const [a, b] = await Promise.all([hashKey(presented), hashKey(expected)]);
  return hashesEqual(a, b);
}
