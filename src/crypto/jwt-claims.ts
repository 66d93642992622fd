/**
 * What makes an end user's claims unforgeable inside the tenant database
 * (docs/adr/012-end-user-jwts.md).
 *
 * Lessor sets the verified claims with transaction-local settings, which any SQL can overwrite
 * (`set_config('request.jwt.claims', …)` is allowed to everyone). So it also sets
 * `lessor.jwt_claims_mac` = HMAC-SHA256(claims key, "<backend pid>.<claims>"), and `auth.session()`
 * (owned by the host's admin role, reading a key the tenant's roles cannot read) returns the claims
 * only if the MAC matches. Forged claims read as no claims at all.
 *
 * Both the claims key and the end-user login role's password derive from the tenant role's
 * password (like the login guard key), so JWT mode needs no secret of its own.
 */
import { toBase64Url, toHex } from "./encoding.ts";

const claimsLabel = "lessor-jwt-claims-v1";
const loginPasswordLabel = "lessor-jwt-login-v1";

async function hmac(key: BufferSource, message: string): Promise<Uint8Array<ArrayBuffer>> {
  const imported = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, [
    "sign",
  ]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", imported, new TextEncoder().encode(message)));
}

/** The claims key of a tenant whose role password is `password` (32 bytes). */
export function jwtClaimsKey(password: string): Promise<Uint8Array<ArrayBuffer>> {
  return hmac(new TextEncoder().encode(password), claimsLabel);
}

/** The password of the tenant's end-user login role (never shown, never stored). */
export async function jwtLoginPassword(password: string): Promise<string> {
  return toBase64Url(await hmac(new TextEncoder().encode(password), loginPasswordLabel));
}

/**
 * HMAC's inner and outer pads of a key (RFC 2104), so the database computes the MAC with two calls
 * of the built-in `sha256()`: sha256(outer || sha256(inner || message)).
 */
export function hmacPads(key: Uint8Array): { inner: Uint8Array; outer: Uint8Array } {
  if (key.length > 64) throw new Error("an HMAC-SHA256 key longer than a block must be hashed first");
  const inner = new Uint8Array(64).fill(0x36);
  const outer = new Uint8Array(64).fill(0x5c);
  key.forEach((byte, i) => {
    inner[i] = byte ^ 0x36;
    outer[i] = byte ^ 0x5c;
  });
  return { inner, outer };
}

/** Signs claims for one backend: what `auth.session()` checks. */
export async function claimsSigner(
  claimsKey: Uint8Array<ArrayBuffer>,
): Promise<(backendPid: number, claims: string) => Promise<string>> {
  const key = await crypto.subtle.importKey("raw", claimsKey, { name: "HMAC", hash: "SHA-256" }, false, [
    "sign",
  ]);
  return async (backendPid, claims) =>
    toHex(await crypto.subtle.sign("HMAC", key, new TextEncoder().encode(`${backendPid}.${claims}`)));
}
