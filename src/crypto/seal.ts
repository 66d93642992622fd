/**
 * Sealing of tenant database passwords at rest: AES-256-GCM under the `LESSOR_SEAL_KEY` secret,
 * with the tenant id bound as associated data, so a sealed value moved to another tenant's row
 * does not open.
 *
 * Format: `v1.<base64 iv>.<base64 ciphertext+tag>`.
 */
import { LessorError } from "../errors/index.ts";
import { fromBase64, toBase64 } from "./encoding.ts";

const keyCache = new Map<string, Promise<CryptoKey>>();

function importSealKey(secret: string): Promise<CryptoKey> {
  let key = keyCache.get(secret);
  if (!key) {
    key = (async () => {
      let raw: Uint8Array<ArrayBuffer>;
      try {
        raw = fromBase64(secret.trim());
      } catch {
        raw = new Uint8Array();
      }
      if (raw.byteLength !== 32) {
        throw new LessorError("misconfigured", {
          internal: "LESSOR_SEAL_KEY must be 32 bytes, base64-encoded",
        });
      }
      return crypto.subtle.importKey("raw", raw, "AES-GCM", false, ["encrypt", "decrypt"]);
    })();
    key.catch(() => keyCache.delete(secret));
    keyCache.set(secret, key);
  }
  return key;
}

/** Seals `plaintext` for `tenantId`. */
export async function seal(secret: string, tenantId: string, plaintext: string): Promise<string> {
  const key = await importSealKey(secret);
  const iv = crypto.getRandomValues(new Uint8Array(12));
  const ciphertext = await crypto.subtle.encrypt(
    { name: "AES-GCM", iv, additionalData: new TextEncoder().encode(tenantId) },
    key,
    new TextEncoder().encode(plaintext),
  );
  return `v1.${toBase64(iv)}.${toBase64(new Uint8Array(ciphertext))}`;
}

/** Opens a sealed value; fails if it was sealed for another tenant, under another key, or altered. */
export async function unseal(secret: string, tenantId: string, sealed: string): Promise<string> {
  const key = await importSealKey(secret);
  const [version, iv, ciphertext] = sealed.split(".");
  if (version !== "v1" || !iv || !ciphertext) {
    throw new LessorError("misconfigured", { internal: "sealed credential has an unknown format" });
  }
  try {
    const plaintext = await crypto.subtle.decrypt(
      { name: "AES-GCM", iv: fromBase64(iv), additionalData: new TextEncoder().encode(tenantId) },
      key,
      fromBase64(ciphertext),
    );
    return new TextDecoder().decode(plaintext);
  } catch (cause) {
    throw new LessorError("misconfigured", {
      internal: "sealed credential did not open (wrong LESSOR_SEAL_KEY, or sealed for another tenant)",
      cause,
    });
  }
}
