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
 *
 * A key of a tenant outside the default region also names its region (docs/adr/023-regions.md), so
 * the Worker routes it to the region's object and control plane without reading anything. The
 * region is inside the MAC: a key whose region was changed is a forged key.
 *
 *     lsk_ + base64url(48 + n bytes):
 *       [0]      format (2)
 *       [1..31]  as above
 *       [32..47] MAC = HMAC-SHA256(ring key, "lessor-tenant-key|<tenant id>|<region>|" ‖ bytes[0..31])[0..15]
 *       [48..]   the region's name (n bytes of ASCII, 1 to 16)
 */
import { fromBase64, fromBase64Url, toBase64Url, toHex } from "./encoding.ts";

export const tenantKeyPrefix = "lsk_";
const formatVersion = 1;
const regionalFormatVersion = 2;
const keyBytes = 48;
const maxRegionBytes = 16;
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

async function mac(
  secret: string,
  tenantId: string,
  region: string | null,
  signed: Uint8Array,
): Promise<Uint8Array> {
  const label = new TextEncoder().encode(
    region === null ? `lessor-tenant-key|${tenantId}|` : `lessor-tenant-key|${tenantId}|${region}|`,
  );
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

/**
 * Mints a new key for `tenantId` under the ring's current MAC key: naming `region`, or (null) a key
 * of the default region, in the format keys had before regions existed.
 */
export async function mintTenantKey(
  ring: KeyMacRing,
  tenantId: string,
  region: string | null = null,
): Promise<MintedKey> {
  const secret = ring.keys.get(ring.current);
  if (secret === undefined) throw new Error("the current MAC key is not in the ring");
  const regionBytes = new TextEncoder().encode(region ?? "");
  if (region !== null && (regionBytes.byteLength < 1 || regionBytes.byteLength > maxRegionBytes)) {
    throw new Error("a region name is 1 to 16 bytes");
  }
  const bytes = new Uint8Array(keyBytes + regionBytes.byteLength);
  bytes[0] = region === null ? formatVersion : regionalFormatVersion;
  bytes[1] = ring.current;
  bytes.set(crypto.getRandomValues(new Uint8Array(signedBytes - 2)), 2);
  bytes.set(await mac(secret, tenantId, region, bytes.subarray(0, signedBytes)), signedBytes);
  bytes.set(regionBytes, keyBytes);
  return { keyId: keyIdOf(bytes), key: tenantKeyPrefix + toBase64Url(bytes) };
}

function keyIdOf(bytes: Uint8Array): string {
  return `k_${toHex(bytes.subarray(2, 10))}`;
}

/** A region name as it rides in a key: a lowercase slug (src/config, `regionNamePattern`). */
const regionInKey = /^[a-z][a-z0-9-]{0,15}$/;

/**
 * The key's id and region (null: the default region) if `key` is a key Lessor minted for
 * `tenantId` under a MAC key still in the ring, else null. Everything that is not such a key
 * (another format, a forged MAC, another tenant's key, a region changed) takes the same path and
 * the same time. Whether the region exists is the caller's to check.
 */
export async function verifyTenantKey(
  ring: KeyMacRing,
  tenantId: string,
  key: string,
): Promise<{ keyId: string; region: string | null } | null> {
  let bytes: Uint8Array;
  try {
    bytes = key.startsWith(tenantKeyPrefix)
      ? fromBase64Url(key.slice(tenantKeyPrefix.length))
      : new Uint8Array();
  } catch {
    bytes = new Uint8Array();
  }
  let region: string | null = null;
  let wellFormed = bytes.byteLength === keyBytes && bytes[0] === formatVersion;
  if (bytes[0] === regionalFormatVersion && bytes.byteLength > keyBytes) {
    const name = new TextDecoder().decode(bytes.subarray(keyBytes));
    if (bytes.byteLength <= keyBytes + maxRegionBytes && regionInKey.test(name)) {
      region = name;
      wellFormed = true;
    }
  }
  // A malformed key is still checked against a MAC (of zeros), so it costs what a wrong one costs.
  const material = wellFormed ? bytes.subarray(0, keyBytes) : new Uint8Array(keyBytes);
  const secret = ring.keys.get(material[1] ?? -1) ?? ring.keys.get(ring.current) ?? "";
  const expected = await mac(secret, tenantId, region, material.subarray(0, signedBytes));
  const matches = equalBytes(expected, material.subarray(signedBytes));
  return wellFormed && matches && ring.keys.has(material[1] ?? -1)
    ? { keyId: keyIdOf(material), region }
    : null;
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
