/**
 * SCRAM-SHA-256 verifiers, as Postgres stores them (`pg_authid.rolpassword`):
 *
 *     SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>      (base64 parts)
 *
 * Lessor sets a tenant role's password by sending the verifier, never the password: a verifier in
 * `ALTER ROLE … PASSWORD` is stored as it is, so the plaintext never travels in SQL, never lands in
 * a server log (`log_statement = ddl`) and never appears in the text of a failed statement.
 * RFC 5802 / RFC 7677; the same derivation as Postgres's `scram_build_secret`.
 */
import { fromBase64, toBase64 } from "./encoding.ts";

/** Postgres's default (`scram_iterations`). */
export const scramIterations = 4096;

async function hmac(key: Uint8Array<ArrayBuffer>, message: string): Promise<Uint8Array<ArrayBuffer>> {
  const imported = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, [
    "sign",
  ]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", imported, new TextEncoder().encode(message)));
}

/** The verifier of `password` with `salt` (16 random bytes unless given) and `iterations`. */
export async function scramVerifier(
  password: string,
  options: { salt?: Uint8Array<ArrayBuffer>; iterations?: number } = {},
): Promise<string> {
  const salt = options.salt ?? crypto.getRandomValues(new Uint8Array(16));
  const iterations = options.iterations ?? scramIterations;
  // Postgres applies SASLprep to the password; Lessor's passwords are base64url, which it leaves alone.
  const material = await crypto.subtle.importKey("raw", new TextEncoder().encode(password), "PBKDF2", false, [
    "deriveBits",
  ]);
  const salted = new Uint8Array(
    await crypto.subtle.deriveBits({ name: "PBKDF2", hash: "SHA-256", salt, iterations }, material, 256),
  );
  const clientKey = await hmac(salted, "Client Key");
  const storedKey = new Uint8Array(await crypto.subtle.digest("SHA-256", clientKey));
  const serverKey = await hmac(salted, "Server Key");
  return `SCRAM-SHA-256$${iterations}:${toBase64(salt)}$${toBase64(storedKey)}:${toBase64(serverKey)}`;
}

/** Whether `text` has the shape of a SCRAM-SHA-256 verifier (so it is never mistaken for a password). */
export function isScramVerifier(text: string): boolean {
  const match = /^SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+):([A-Za-z0-9+/=]+)$/.exec(text);
  if (!match) return false;
  try {
    return fromBase64(match[3] ?? "").byteLength === 32 && fromBase64(match[4] ?? "").byteLength === 32;
  } catch {
    return false;
  }
}
