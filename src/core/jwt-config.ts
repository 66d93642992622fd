/**
 * A tenant's end-user JWT configuration (docs/adr/012-end-user-jwts.md), as pure data: what an
 * operator may set, the checks it must pass, and the names Lessor derives from it. No runtime here;
 * the verification itself is jose's (src/tenant-object/jwt.ts).
 */

/**
 * Asymmetric algorithms only: a shared HMAC secret would have to live in Lessor and in the identity
 * provider alike, and `none` is never a choice.
 */
export const jwtAlgorithms = [
  "RS256",
  "RS384",
  "RS512",
  "PS256",
  "PS384",
  "PS512",
  "ES256",
  "ES384",
  "ES512",
  "EdDSA",
] as const;

export type JwtAlgorithm = (typeof jwtAlgorithms)[number];

/** What Neon's proxy accepts, and what most identity providers sign with. */
export const defaultJwtAlgorithms: readonly JwtAlgorithm[] = ["RS256", "ES256"];

/** The role statements of a verified token run as, unless the operator names another. */
export const defaultJwtRole = "authenticated";

/** Seconds of leeway on `exp` and `nbf` (Neon's proxy allows 30). */
export const defaultClockSkewSeconds = 30;
export const maxClockSkewSeconds = 300;

/** A JSON Web Key as far as Lessor looks at it; jose checks the rest. */
export interface JsonWebKeyRecord {
  kty: string;
  kid?: string;
  alg?: string;
  use?: string;
  [parameter: string]: unknown;
}

export interface JsonWebKeySetRecord {
  keys: JsonWebKeyRecord[];
}

/** The configuration as the operator sets it and the catalog keeps it. */
export interface JwtConfig {
  issuer: string;
  audiences: string[];
  /** A static key set; null when keys come from `jwksUrl`. */
  jwks: JsonWebKeySetRecord | null;
  /** Where the identity provider publishes its keys; null for a static set. */
  jwksUrl: string | null;
  /** The NOLOGIN role statements run as (`SET LOCAL ROLE`). */
  role: string;
  algorithms: JwtAlgorithm[];
  clockSkewSeconds: number;
}

/** What a TenantObject carries in its record: the configuration and the login role it uses. */
export interface TenantJwt extends JwtConfig {
  /** The tenant's own login role for end-user statements (`<tenant role>_jwt`, no privileges). */
  loginRole: string;
}

/** Keys a static set may hold; a remote set larger than this is refused too. */
export const maxJwksKeys = 32;

/** The login role of a tenant's end-user connections: its own, so the tenant role is never a member. */
export function jwtLoginRoleName(tenantRole: string): string {
  return `${tenantRole}_jwt`;
}

/**
 * Names an operator may not choose for the end-user role: Postgres's own, Lessor's own (tenant and
 * login roles are `t_…`/`tenant_…`), and the words SQL treats specially.
 */
const reservedRoleNames = new Set([
  "public",
  "none",
  "postgres",
  "current_user",
  "current_role",
  "session_user",
  "user",
  "all",
  "default",
]);

/** Why a role name is refused, or null if it may be used. */
export function jwtRoleProblem(role: string): string | null {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(role)) {
    return "role must be 1 to 63 lowercase letters, digits or underscores, not starting with a digit.";
  }
  if (reservedRoleNames.has(role) || /^(pg_|t_|tenant_|lessor|neon)/.test(role)) {
    return `role ${role} is reserved; choose another name (for example authenticated).`;
  }
  return null;
}

/**
 * Why a JWKS URL is refused, or null. HTTPS only, except on the loopback interface (a local
 * identity provider, the tests); no credentials in the URL.
 */
export function jwksUrlProblem(raw: string): string | null {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return "jwksUrl must be an absolute URL.";
  }
  if (url.username || url.password) return "jwksUrl must not carry credentials.";
  const loopback = url.hostname === "127.0.0.1" || url.hostname === "localhost" || url.hostname === "[::1]";
  if (url.protocol !== "https:" && !(url.protocol === "http:" && loopback)) {
    return "jwksUrl must be https:// (plain http only on the loopback interface).";
  }
  return null;
}

/** Why a static key set is refused, or null: public keys only, each with a `kid`, a bounded number. */
export function jwksProblem(jwks: unknown): string | null {
  if (typeof jwks !== "object" || jwks === null || !Array.isArray((jwks as { keys?: unknown }).keys)) {
    return 'jwks must be a JSON Web Key Set: {"keys": [...]}.';
  }
  const keys = (jwks as { keys: unknown[] }).keys;
  if (keys.length === 0 || keys.length > maxJwksKeys) return `jwks must hold 1 to ${maxJwksKeys} keys.`;
  for (const key of keys) {
    if (typeof key !== "object" || key === null) return "every key of jwks must be an object.";
    const record = key as Record<string, unknown>;
    if (typeof record.kty !== "string") return "every key of jwks needs kty.";
    if (record.kty === "oct") return "jwks must hold public keys only (no symmetric oct keys).";
    // A private key's parameters: an operator pasted the wrong half of a key pair.
    if (["d", "p", "q", "dp", "dq", "qi", "k"].some((parameter) => parameter in record)) {
      return "jwks must hold public keys only: remove the private parameters (d, p, q, …).";
    }
  }
  return null;
}
