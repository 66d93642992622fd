/**
 * SCRAM-SHA-256 (RFC 5802, RFC 7677): the verifiers Lessor sets, and the client's side of a login.
 *
 * Verifiers, as Postgres stores them (`pg_authid.rolpassword`):
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

const encoder = new TextEncoder();

async function hmac(key: Uint8Array<ArrayBuffer>, message: string): Promise<Uint8Array<ArrayBuffer>> {
  const imported = await crypto.subtle.importKey("raw", key, { name: "HMAC", hash: "SHA-256" }, false, [
    "sign",
  ]);
  return new Uint8Array(await crypto.subtle.sign("HMAC", imported, encoder.encode(message)));
}

/** Hi(password, salt, iterations) of RFC 5802: PBKDF2 with HMAC-SHA-256, 32 bytes, in one native call. */
async function saltedPassword(
  password: string,
  salt: Uint8Array<ArrayBuffer>,
  iterations: number,
): Promise<Uint8Array<ArrayBuffer>> {
  // Postgres applies SASLprep to the password; Lessor's passwords are base64url, which it leaves alone.
  const material = await crypto.subtle.importKey("raw", encoder.encode(password), "PBKDF2", false, [
    "deriveBits",
  ]);
  return new Uint8Array(
    await crypto.subtle.deriveBits({ name: "PBKDF2", hash: "SHA-256", salt, iterations }, material, 256),
  );
}

/** The verifier of `password` with `salt` (16 random bytes unless given) and `iterations`. */
export async function scramVerifier(
  password: string,
  options: { salt?: Uint8Array<ArrayBuffer>; iterations?: number } = {},
): Promise<string> {
  const salt = options.salt ?? crypto.getRandomValues(new Uint8Array(16));
  const iterations = options.iterations ?? scramIterations;
  const salted = await saltedPassword(password, salt, iterations);
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

// ── The client's side of a login ─────────────────────────────────────────────────────────────────

/**
 * The driver's SASL session, as its SASLContinue handler reads and writes it: `message` names the
 * last step, `response` is what the client sends next, `serverSignature` what SASLFinal must carry.
 */
export interface ScramClientSession {
  message: string;
  clientNonce: string;
  response?: string;
  serverSignature?: string;
}

/**
 * The most iterations a server may ask for. The count comes from the server (a customer's database
 * behind its tunnel included), and the derivation runs on the object's thread: an absurd count
 * would stall every object sharing it. Postgres's default is 4,096; OWASP's advice for
 * PBKDF2-HMAC-SHA-256 is 600,000.
 */
export const scramMaxIterations = 1_000_000;

/** Salted passwords already derived, by iterations, salt and password (bounded). */
const saltedPasswords = new Map<string, Uint8Array<ArrayBuffer>>();
const saltedPasswordsLimit = 256;

/**
 * The client-final step of a login, as the Neon driver's Client computes it (its
 * `_handleAuthSASLContinue`: every check, message and field below is its own), with one change:
 * the salted password comes from the platform's PBKDF2 in one native call, and is kept for the next
 * connection with the same password, salt and iteration count. The driver derives it with one
 * awaited HMAC per iteration (4,096 by Postgres's default), each followed by a buffer XOR in
 * JavaScript: about 15 ms of the isolate's CPU for every new connection, on the one thread a
 * tenant's object has. What reaches the server, and the server signature the driver checks at
 * SASLFinal, are the same.
 */
export async function scramClientFinal(
  session: ScramClientSession,
  password: unknown,
  serverFirst: unknown,
): Promise<void> {
  if (
    session.message !== "SASLInitialResponse" ||
    typeof password !== "string" ||
    typeof serverFirst !== "string"
  ) {
    throw new Error("SASL: protocol error");
  }
  const attributes = new Map<string, string>();
  for (const pair of serverFirst.split(",")) {
    if (!/^.=/.test(pair)) throw new Error("SASL: Invalid attribute pair entry");
    attributes.set(pair.charAt(0), pair.substring(2));
  }
  const nonce = attributes.get("r");
  const salt = attributes.get("s");
  const iterationsText = attributes.get("i");
  if (!nonce || !/^[!-+--~]+$/.test(nonce)) {
    throw new Error("SASL: SCRAM-SERVER-FIRST-MESSAGE: nonce missing/unprintable");
  }
  if (!salt || !/^(?:[a-zA-Z0-9+/]{4})*(?:[a-zA-Z0-9+/]{2}==|[a-zA-Z0-9+/]{3}=)?$/.test(salt)) {
    throw new Error("SASL: SCRAM-SERVER-FIRST-MESSAGE: salt missing/not base64");
  }
  if (!iterationsText || !/^[1-9][0-9]*$/.test(iterationsText)) {
    throw new Error("SASL: SCRAM-SERVER-FIRST-MESSAGE: missing/invalid iteration count");
  }
  if (!nonce.startsWith(session.clientNonce)) {
    throw new Error("SASL: SCRAM-SERVER-FIRST-MESSAGE: server nonce does not start with client nonce");
  }
  if (nonce.length === session.clientNonce.length) {
    throw new Error("SASL: SCRAM-SERVER-FIRST-MESSAGE: server nonce is too short");
  }
  const iterations = Number.parseInt(iterationsText, 10);
  if (!(iterations <= scramMaxIterations)) {
    throw new Error(`SASL: SCRAM-SERVER-FIRST-MESSAGE: iteration count above ${scramMaxIterations}`);
  }
  const cacheKey = `${iterations}\u0000${salt}\u0000${password}`;
  let salted = saltedPasswords.get(cacheKey);
  if (!salted) {
    salted = await saltedPassword(password, fromBase64(salt), iterations);
    if (saltedPasswords.size >= saltedPasswordsLimit) saltedPasswords.clear();
    saltedPasswords.set(cacheKey, salted);
  }
  const clientKey = await hmac(salted, "Client Key");
  const storedKey = new Uint8Array(await crypto.subtle.digest("SHA-256", clientKey));
  const clientFinalWithoutProof = `c=biws,r=${nonce}`;
  const authMessage = `n=*,r=${session.clientNonce},r=${nonce},s=${salt},i=${iterations},${clientFinalWithoutProof}`;
  const clientSignature = await hmac(storedKey, authMessage);
  const proof = clientKey.map((byte, i) => byte ^ (clientSignature[i] ?? 0));
  const serverKey = await hmac(salted, "Server Key");
  session.message = "SASLResponse";
  session.serverSignature = toBase64(await hmac(serverKey, authMessage));
  session.response = `${clientFinalWithoutProof},p=${toBase64(proof)}`;
}
