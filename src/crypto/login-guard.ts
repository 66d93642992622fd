/**
 * One-time login tokens for a tenant role (docs/adr/007-tenant-containment.md).
 *
 * Every connection Lessor opens as a tenant role carries `-c lessor.login=<token>` in its startup
 * options. The tenant database's login event trigger (src/tenant-db/login-guard.ts) refuses any
 * login of that role without a valid, unexpired, unspent token, so a password the tenant sets for
 * itself (`ALTER ROLE CURRENT_USER PASSWORD …`) buys it no direct login.
 *
 *     token = <nonce hex>.<expires, unix seconds>.<HMAC-SHA256(guard key, "<role>.<nonce>.<expires>") hex>
 *
 * The guard key is derived from the role's password (which only Lessor knows, sealed), so it needs
 * no secret of its own; the database holds a copy where the tenant cannot read it.
 */
import { randomHex, toHex } from "./encoding.ts";

const guardLabel = "lessor-login-guard-v1";

/** How long a token is accepted: long enough for a slow connect, short enough to be worthless later. */
export const loginTokenTtlMs = 120_000;

/** The guard key of a role whose password is `password` (32 bytes). */
export async function loginGuardKey(password: string): Promise<Uint8Array<ArrayBuffer>> {
  const key = await crypto.subtle.importKey(
    "raw",
    new TextEncoder().encode(password),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, new TextEncoder().encode(guardLabel)));
}

/** A token minter for one role, with its key imported once. */
export async function loginTokenMinter(
  role: string,
  guardKey: Uint8Array<ArrayBuffer>,
): Promise<(now?: number) => Promise<string>> {
  const key = await crypto.subtle.importKey("raw", guardKey, { name: "HMAC", hash: "SHA-256" }, false, [
    "sign",
  ]);
  return async (now = Date.now()) => {
    const nonce = randomHex(16);
    const expires = Math.floor((now + loginTokenTtlMs) / 1000);
    const mac = await crypto.subtle.sign(
      "HMAC",
      key,
      new TextEncoder().encode(`${role}.${nonce}.${expires}`),
    );
    return `${nonce}.${expires}.${toHex(mac)}`;
  };
}
