/**
 * Sealing of tenant database passwords at rest: AES-256-GCM under a key of the `LESSOR_SEAL_KEY`
 * ring (docs/adr/015-seal-key-ring.md).
 *
 * `LESSOR_SEAL_KEY` is one base64 32-byte key (the ring `{k0}`), or a JSON ring of named keys,
 * `{"current": "k2", "keys": {"k1": "<base64>", "k2": "<base64>"}}`. New seals use the current
 * key; a sealed value records the id of the key that sealed it, so the ring may hold old keys
 * until `npm run reseal` has moved every value to the current one.
 *
 * Formats:
 * - `v1.<base64 iv>.<base64 ciphertext+tag>`: key `k0`, the tenant id as associated data. What
 *   the single-key form seals (so a deploy that keeps one key writes what older code reads).
 * - `v2.<key id>.<base64 iv>.<base64 ciphertext+tag>`: the key id and the tenant id both bound
 *   in the associated data, so a value moved to another tenant's row, or relabelled with another
 *   key id, does not open.
 */
import { LessorError } from "../errors/index.ts";
import { fromBase64, toBase64 } from "./encoding.ts";

/** The key id of `v1` values: the single-key `LESSOR_SEAL_KEY`, or the ring's key of that name. */
export const legacySealKeyId = "k0";

/** Key ids: short, and never long enough to hold key material (a base64 key is 44 characters). */
const keyIdPattern = /^[A-Za-z0-9_-]{1,16}$/;

/** `LESSOR_SEAL_KEY` parsed: raw base64 keys by id, and the id new seals use. */
export interface ParsedSealRing {
  current: string;
  keys: ReadonlyMap<string, string>;
  /** The single-key form: new seals are written as `v1` (key `k0`). */
  legacy: boolean;
}

function isSealKey(value: unknown): value is string {
  if (typeof value !== "string") return false;
  try {
    return fromBase64(value.trim()).byteLength === 32;
  } catch {
    return false;
  }
}

/**
 * Parses `LESSOR_SEAL_KEY`, or names its problem. A problem never quotes the secret: not a key,
 * not an invalid key id (which might be a key pasted in the wrong place), not a JSON parse error
 * (V8's quotes the input).
 */
export function parseSealRing(raw: string | undefined): ParsedSealRing | { problem: string } {
  if (!raw?.trim()) return { problem: "is not set" };
  const text = raw.trim();
  if (!text.startsWith("{")) {
    if (!isSealKey(text)) {
      return { problem: 'must be a base64 32-byte key, or a JSON ring {"current": id, "keys": {id: key}}' };
    }
    return { current: legacySealKeyId, keys: new Map([[legacySealKeyId, text]]), legacy: true };
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return { problem: "starts like a JSON key ring but is not valid JSON" };
  }
  const ring = parsed as { current?: unknown; keys?: unknown };
  if (typeof ring.keys !== "object" || ring.keys === null || Array.isArray(ring.keys)) {
    return { problem: "the key ring needs `keys`, an object of key id → base64 32-byte key" };
  }
  const keys = new Map<string, string>();
  for (const [id, value] of Object.entries(ring.keys)) {
    if (!keyIdPattern.test(id)) return { problem: "key ids are 1 to 16 letters, digits, '_' or '-'" };
    if (!isSealKey(value)) return { problem: `key ${id} must be 32 bytes, base64` };
    keys.set(id, value.trim());
  }
  if (keys.size === 0) return { problem: "the key ring holds no key" };
  if (typeof ring.current !== "string" || !keyIdPattern.test(ring.current)) {
    return { problem: "`current` must be the id of a key of the ring" };
  }
  if (!keys.has(ring.current)) {
    return { problem: `\`current\` names ${ring.current}, which is not a key of the ring` };
  }
  return { current: ring.current, keys, legacy: false };
}

interface SealRing {
  current: string;
  keys: ReadonlyMap<string, CryptoKey>;
  legacy: boolean;
}

/** Parsed and imported rings by secret: parsed once per isolate, not per seal. */
const rings = new Map<string, Promise<SealRing>>();
/** A handful of secrets at most live in one isolate (a deploy changes them); this bounds the map. */
const ringCacheLimit = 8;

function loadRing(secret: string): Promise<SealRing> {
  let ring = rings.get(secret);
  if (!ring) {
    ring = (async () => {
      const parsed = parseSealRing(secret);
      if ("problem" in parsed) {
        throw new LessorError("misconfigured", { internal: `LESSOR_SEAL_KEY ${parsed.problem}` });
      }
      const keys = new Map<string, CryptoKey>();
      for (const [id, raw] of parsed.keys) {
        keys.set(
          id,
          await crypto.subtle.importKey("raw", fromBase64(raw), "AES-GCM", false, ["encrypt", "decrypt"]),
        );
      }
      return { current: parsed.current, keys, legacy: parsed.legacy };
    })();
    ring.catch(() => rings.delete(secret));
    if (rings.size >= ringCacheLimit) rings.clear();
    rings.set(secret, ring);
  }
  return ring;
}

function v2AdditionalData(keyId: string, tenantId: string): Uint8Array {
  // The key id cannot hold '|', so the tenant id (last) cannot shift what the key id means.
  return new TextEncoder().encode(`lessor-seal-v2|${keyId}|${tenantId}`);
}

interface SealedParts {
  keyId: string;
  iv: string;
  ciphertext: string;
  additionalData: Uint8Array;
}

function parseSealed(sealed: string, tenantId: string): SealedParts | null {
  const parts = sealed.split(".");
  if (parts[0] === "v1" && parts.length === 3) {
    const [, iv = "", ciphertext = ""] = parts;
    if (!iv || !ciphertext) return null;
    return { keyId: legacySealKeyId, iv, ciphertext, additionalData: new TextEncoder().encode(tenantId) };
  }
  if (parts[0] === "v2" && parts.length === 4) {
    const [, keyId = "", iv = "", ciphertext = ""] = parts;
    if (!keyIdPattern.test(keyId) || !iv || !ciphertext) return null;
    return { keyId, iv, ciphertext, additionalData: v2AdditionalData(keyId, tenantId) };
  }
  return null;
}

/** The id of the key that sealed `sealed` (`k0` for `v1`), or null if it is not a sealed value. */
export function sealKeyIdOf(sealed: string): string | null {
  return parseSealed(sealed, "")?.keyId ?? null;
}

/** What a ring holds, by id only (never key material). */
export interface SealRingSummary {
  /** The key new seals use. */
  current: string;
  keyIds: readonly string[];
  /**
   * Prefixes of the values sealed under the current key, for the catalog query that finds the
   * ones still to reseal (`v1.` counts when the current key is `k0`).
   */
  currentPrefixes: readonly string[];
}

/** The ring of `secret` by ids; `misconfigured` if it does not parse. */
export async function sealRingSummary(secret: string): Promise<SealRingSummary> {
  const ring = await loadRing(secret);
  return {
    current: ring.current,
    keyIds: [...ring.keys.keys()],
    currentPrefixes: [`v2.${ring.current}.`, ...(ring.current === legacySealKeyId ? ["v1."] : [])],
  };
}

/** Seals `plaintext` for `tenantId` under the ring's current key. */
export async function seal(secret: string, tenantId: string, plaintext: string): Promise<string> {
  const ring = await loadRing(secret);
  const key = ring.keys.get(ring.current);
  if (!key)
    throw new LessorError("misconfigured", {
      internal: "LESSOR_SEAL_KEY: the current key is not in the ring",
    });
  const iv = crypto.getRandomValues(new Uint8Array(12));
  const additionalData = ring.legacy
    ? new TextEncoder().encode(tenantId)
    : v2AdditionalData(ring.current, tenantId);
  const ciphertext = await crypto.subtle.encrypt(
    { name: "AES-GCM", iv, additionalData },
    key,
    new TextEncoder().encode(plaintext),
  );
  const body = `${toBase64(iv)}.${toBase64(new Uint8Array(ciphertext))}`;
  return ring.legacy ? `v1.${body}` : `v2.${ring.current}.${body}`;
}

/**
 * Opens a sealed value under the key it names. Fails `misconfigured` (never a crash) if that key
 * left the ring (the message names it), or if the value was sealed for another tenant or altered.
 */
export async function unseal(secret: string, tenantId: string, sealed: string): Promise<string> {
  const ring = await loadRing(secret);
  const parts = parseSealed(sealed, tenantId);
  if (!parts) {
    throw new LessorError("misconfigured", { internal: "sealed credential has an unknown format" });
  }
  const key = ring.keys.get(parts.keyId);
  if (!key) {
    const legacy = parts.keyId === legacySealKeyId ? "; a v1 value, from the single-key form" : "";
    throw new LessorError("misconfigured", {
      internal: `sealed credential was sealed with key ${parts.keyId}, which LESSOR_SEAL_KEY no longer holds (it holds ${[...ring.keys.keys()].join(", ")}${legacy}); put ${parts.keyId} back into the ring, then run npm run reseal before removing it`,
    });
  }
  let iv: Uint8Array<ArrayBuffer>;
  let ciphertext: Uint8Array<ArrayBuffer>;
  try {
    iv = fromBase64(parts.iv);
    ciphertext = fromBase64(parts.ciphertext);
  } catch {
    throw new LessorError("misconfigured", { internal: "sealed credential has an unknown format" });
  }
  try {
    const plaintext = await crypto.subtle.decrypt(
      { name: "AES-GCM", iv, additionalData: parts.additionalData },
      key,
      ciphertext,
    );
    return new TextDecoder().decode(plaintext);
  } catch (cause) {
    throw new LessorError("misconfigured", {
      internal: `sealed credential did not open under key ${parts.keyId} (altered, sealed for another tenant, or ${parts.keyId} holds another key than the one that sealed it)`,
      cause,
    });
  }
}

/**
 * The value re-sealed under the ring's current key, or null if it is already under it. Fails like
 * `unseal` if it cannot be opened.
 */
export async function resealUnderCurrentKey(
  secret: string,
  tenantId: string,
  sealed: string,
): Promise<string | null> {
  const { currentPrefixes } = await sealRingSummary(secret);
  if (currentPrefixes.some((prefix) => sealed.startsWith(prefix))) return null;
  return seal(secret, tenantId, await unseal(secret, tenantId, sealed));
}
