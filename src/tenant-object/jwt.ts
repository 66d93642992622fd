/**
 * End-user token verification in the tenant's object (docs/adr/012-end-user-jwts.md), with jose:
 * the signature against the tenant's key set, `alg` pinned to the configured list (never `none`, never
 * a symmetric one), `exp` (required), `nbf`, `iss` and `aud`, with the configured clock skew.
 *
 * The key set is the static one, or the tenant's JWKS URL fetched by jose and cached here, bounded:
 * one set per object, refreshed at least every five minutes, re-fetched for an unknown `kid` at most
 * every two seconds (a rotation is picked up at once, a flood of made-up kids costs one fetch per
 * two seconds), 64 KiB and five seconds at most per fetch, no redirects.
 *
 * Only callers whose tenant key already checked out get here, so nobody without a key can make
 * the object fetch anything.
 */
import {
  createLocalJWKSet,
  createRemoteJWKSet,
  customFetch,
  type JWTPayload,
  type JWTVerifyGetKey,
  jwtVerify,
} from "jose";
import { maxJwksKeys, type TenantJwt } from "../core/jwt-config.ts";
import { type ErrorCode, LessorError } from "../errors/index.ts";

/** Bounds of a JWKS URL fetch and of its cache. */
export const jwksBounds = {
  maxBytes: 64 * 1024,
  timeoutMs: 5_000,
  cacheMaxAgeMs: 5 * 60_000,
  cooldownMs: 2_000,
} as const;

/** A verified token: its claims, as the JSON that `auth.session()` returns. */
export interface VerifiedToken {
  claims: string;
  subject: string | null;
}

/** Fetches a JWKS with a size bound (jose bounds the time and refuses redirects). */
async function boundedFetch(
  url: string,
  init: { headers: Headers; method: "GET"; redirect: "manual"; signal: AbortSignal },
): Promise<Response> {
  const response = await fetch(url, init);
  if (!response.ok || !response.body) return response;
  const declared = Number(response.headers.get("content-length") ?? "0");
  if (declared > jwksBounds.maxBytes) throw new Error("JWKS too large");
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > jwksBounds.maxBytes) {
      await reader.cancel().catch(() => undefined);
      throw new Error("JWKS too large");
    }
    chunks.push(value);
  }
  const text = new TextDecoder().decode(concat(chunks, size));
  const parsed: unknown = JSON.parse(text);
  const keys = (parsed as { keys?: unknown }).keys;
  if (Array.isArray(keys) && keys.length > maxJwksKeys) throw new Error("JWKS has too many keys");
  return new Response(text, { status: response.status, headers: { "content-type": "application/json" } });
}

function concat(chunks: Uint8Array[], size: number): Uint8Array {
  const out = new Uint8Array(size);
  let offset = 0;
  for (const chunk of chunks) {
    out.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return out;
}

/** jose's failure codes, as Lessor's stable codes. */
function refusalOf(error: unknown): LessorError {
  const code = (error as { code?: unknown }).code;
  const claim = (error as { claim?: unknown }).claim;
  let lessorCode: ErrorCode = "jwt_invalid";
  switch (code) {
    case "ERR_JWT_EXPIRED":
      lessorCode = "jwt_expired";
      break;
    case "ERR_JWT_CLAIM_VALIDATION_FAILED":
      if (claim === "iss") lessorCode = "jwt_issuer_mismatch";
      else if (claim === "aud") lessorCode = "jwt_audience_mismatch";
      else if (claim === "nbf") lessorCode = "jwt_not_yet_valid";
      break;
    case "ERR_JOSE_ALG_NOT_ALLOWED":
    case "ERR_JOSE_NOT_SUPPORTED":
      lessorCode = "jwt_algorithm_refused";
      break;
    case "ERR_JWKS_NO_MATCHING_KEY":
    case "ERR_JWKS_MULTIPLE_MATCHING_KEYS":
      lessorCode = "jwt_key_unknown";
      break;
    case "ERR_JWKS_TIMEOUT":
    case "ERR_JWKS_INVALID":
      lessorCode = "jwks_unavailable";
      break;
    default:
      // A fetch that failed (network, size bound, not JSON) surfaces as a plain error from jose.
      if (!(typeof code === "string" && code.startsWith("ERR_"))) lessorCode = "jwks_unavailable";
  }
  return new LessorError(lessorCode, {
    internal: `end-user token refused (${String(code ?? "fetch")}${typeof claim === "string" ? ` ${claim}` : ""})`,
    ...(lessorCode === "jwks_unavailable" ? { retryAfterSeconds: 2 } : {}),
  });
}

/** The `alg` of a token's header, if it has a readable one. */
function headerAlgorithm(token: string): string | null {
  const header = token.split(".")[0] ?? "";
  try {
    const decoded: unknown = JSON.parse(atob(header.replaceAll("-", "+").replaceAll("_", "/")));
    const alg = (decoded as { alg?: unknown }).alg;
    return typeof alg === "string" ? alg : null;
  } catch {
    return null;
  }
}

export class TokenVerifier {
  private keys: JWTVerifyGetKey | null = null;
  private keysFor: TenantJwt | null = null;

  /** The key resolver for `config`, kept while the configuration stays the same object. */
  private resolver(config: TenantJwt): JWTVerifyGetKey {
    if (this.keys && this.keysFor === config) return this.keys;
    this.keys = config.jwks
      ? createLocalJWKSet(config.jwks as Parameters<typeof createLocalJWKSet>[0])
      : createRemoteJWKSet(new URL(config.jwksUrl ?? ""), {
          timeoutDuration: jwksBounds.timeoutMs,
          cooldownDuration: jwksBounds.cooldownMs,
          cacheMaxAge: jwksBounds.cacheMaxAgeMs,
          [customFetch]: boundedFetch,
        });
    this.keysFor = config;
    return this.keys;
  }

  /** Verifies `token` for `config`; throws a LessorError with a stable 401 code (503 if keys are unreachable). */
  async verify(config: TenantJwt, token: string): Promise<VerifiedToken> {
    // Refused before any key is looked up: an unsigned token never reaches jose's key resolver.
    const alg = headerAlgorithm(token);
    if (alg === null) throw new LessorError("jwt_invalid", { internal: "token header unreadable" });
    if (!(config.algorithms as string[]).includes(alg)) {
      throw new LessorError("jwt_algorithm_refused", { internal: `token alg ${alg} refused` });
    }
    let payload: JWTPayload;
    try {
      ({ payload } = await jwtVerify(token, this.resolver(config), {
        issuer: config.issuer,
        audience: config.audiences,
        algorithms: config.algorithms,
        clockTolerance: config.clockSkewSeconds,
        requiredClaims: ["exp"],
      }));
    } catch (error) {
      throw refusalOf(error);
    }
    return { claims: JSON.stringify(payload), subject: typeof payload.sub === "string" ? payload.sub : null };
  }
}
