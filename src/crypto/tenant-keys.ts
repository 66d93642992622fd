/**
 * Tenant keys the Worker can check by itself, in microseconds, before anything else happens: a key
 * carries a MAC over the tenant id it was minted for, under a secret only Lessor holds
 * (`LESSOR_KEY_MAC_KEYS`). A forged key, a key of another tenant and a key for a tenant that never
 * existed all fail here alike, so none of them reaches a Durable Object, storage or a database
 * (docs/adr/008-keys-checked-at-the-edge.md). The tenant's object still compares the key's hash,
 * so revocation and expiry keep working.
 *
 *     lsk_ + base64url(48 bytes):
 *       [0]      format (1)
 *       [1]      index of the MAC key in the ring
 *       [2..9]   key id (public: it names the key in the key list and the audit log)
 *       [10..31] secret (176 bits)
 *       [32..47] MAC = HMAC-SHA256(ring key, "lessor-tenant-key|<tenant id>|" ‖ bytes[0..31])[0..15]
 */
import { fromBase64, fromBase64Url, toBase64Url, toHex } from "./encoding.ts";

export const tenantKeyPrefix = "lsk_";
const formatVersion = 1;
const keyBytes = 48;
const signedBytes = 32;
const macBytes = 16;

/** The MAC keys: raw base64 secrets by index, and the index new keys are minted under. */
export interface KeyMacRing {
  current: number;
  keys: ReadonlyMap<number, string>;
}

const imported = new Map<string, Promise<CryptoKey>>();

function importMacKey(secret: string): Promise<CryptoKey> {
  let key = imported.get(secret);
  if (!key) {
    key = crypto.subtle.importKey("raw", fromBase64(secret), { name: "HMAC", hash: "SHA-256" }, false, [
      "sign",
    ]);
    imported.set(secret, key);
  }
  return key;
}

async function mac(secret: string, tenantId: string, signed: Uint8Array): Promise<Uint8Array> {
  const label = new TextEncoder().encode(`lessor-tenant-key|${tenantId}|`);
  const message = new Uint8Array(label.byteLength + signed.byteLength);
  message.set(label);
  message.set(signed, label.byteLength);
  const full = await crypto.subtle.sign("HMAC", await importMacKey(secret), message);
  return new Uint8Array(full, 0, macBytes);
}

/** Constant-time equality of two byte strings of equal length. */
function equalBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.byteLength !== b.byteLength) return false;
  let diff = 0;
  for (let i = 0; i < a.byteLength; i++) diff |= (a[i] ?? 0) ^ (b[i] ?? 0);
  return diff === 0;
}

export interface MintedKey {
  /** Public name of the key, `k_` + 16 hex digits. */
  keyId: string;
  /** The key itself, shown once. */
  key: string;
}

/** Mints a new key for `tenantId` under the ring's current MAC key. */
export async function mintTenantKey(ring: KeyMacRing, tenantId: string): Promise<MintedKey> {
  const secret = ring.keys.get(ring.current);
  if (secret === undefined) throw new Error("the current MAC key is not in the ring");
  const bytes = new Uint8Array(keyBytes);
  bytes[0] = formatVersion;
  bytes[1] = ring.current;
  bytes.set(crypto.getRandomValues(new Uint8Array(signedBytes - 2)), 2);
  bytes.set(await mac(secret, tenantId, bytes.subarray(0, signedBytes)), signedBytes);
  return { keyId: keyIdOf(bytes), key: tenantKeyPrefix + toBase64Url(bytes) };
}

function keyIdOf(bytes: Uint8Array): string {
  return `k_${toHex(bytes.subarray(2, 10))}`;
}

/**
 * The key's id if `key` is a key Lessor minted for `tenantId` under a MAC key still in the ring,
 * else null. Everything that is not such a key (another format, a forged MAC, another tenant's key)
 * takes the same path and the same time.
 */
export async function verifyTenantKey(
  ring: KeyMacRing,
  tenantId: string,
  key: string,
): Promise<{ keyId: string } | null> {
  let bytes: Uint8Array;
  try {
    bytes = key.startsWith(tenantKeyPrefix)
      ? fromBase64Url(key.slice(tenantKeyPrefix.length))
      : new Uint8Array();
  } catch {
    bytes = new Uint8Array();
  }
  // A malformed key is still checked against a MAC (of zeros), so it costs what a wrong one costs.
  const wellFormed = bytes.byteLength === keyBytes && bytes[0] === formatVersion;
  const material = wellFormed ? bytes : new Uint8Array(keyBytes);
  const secret = ring.keys.get(material[1] ?? -1) ?? ring.keys.get(ring.current) ?? "";
  const expected = await mac(secret, tenantId, material.subarray(0, signedBytes));
  const matches = equalBytes(expected, material.subarray(signedBytes));
  return wellFormed && matches && ring.keys.has(material[1] ?? -1) ? { keyId: keyIdOf(material) } : null;
}

/**
 * Parses `LESSOR_KEY_MAC_KEYS`: a base64 32-byte key (index 1), or a ring
 * `{"current": 2, "keys": {"1": "<base64>", "2": "<base64>"}}`. Null with a problem if malformed.
 */
export function parseKeyMacRing(raw: string | undefined): KeyMacRing | { problem: string } {
  if (!raw) return { problem: "is not set" };
  const isKey = (value: unknown): value is string => {
    if (typeof value !== "string") return false;
    try {
      return fromBase64(value.trim()).byteLength === 32;
    } catch {
      return false;
    }
  };
  if (isKey(raw)) return { current: 1, keys: new Map([[1, raw.trim()]]) };
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    return { problem: "must be a base64 32-byte key or a JSON key ring" };
  }
  const ring = parsed as { current?: unknown; keys?: unknown };
  if (typeof ring.keys !== "object" || ring.keys === null) return { problem: "needs `keys`" };
  const keys = new Map<number, string>();
  for (const [index, value] of Object.entries(ring.keys)) {
    const n = Number(index);
    if (!Number.isInteger(n) || n < 1 || n > 255)
      return { problem: "key indexes are integers from 1 to 255" };
    if (!isKey(value)) return { problem: `key ${index} must be 32 bytes, base64` };
    keys.set(n, value.trim());
  }
  if (typeof ring.current !== "number" || !keys.has(ring.current)) {
    return { problem: "`current` must name a key of the ring" };
  }
  return { current: ring.current, keys };
}
