/**
 * A local identity provider in a few lines, for `lessorctl jwt dev`: an ES256 key pair, the JWT
 * configuration that trusts its public half as a static key set, and tokens for named users. Only
 * jose, no Node or Workers API, so the stack tests mint docs/rls.md's tokens with the same code
 * (test/integration/examples.test.ts). Never for production: a deployed tenant's tokens come from
 * its identity provider (`PUT /v1/tenants/:id/jwt` with its `jwksUrl`).
 */
import { exportJWK, generateKeyPair, importJWK, type JWK, SignJWT } from "jose";

/** The issuer every dev token names (any string will do; this one says where the token came from). */
export const devIssuer = "https://lessorctl.invalid/jwt-dev";
/** The audience every dev token names. */
export const devAudience = "lessor-dev";
export const devAlgorithm = "ES256";

/** The dev key pair as it is kept between runs (`.lessor/jwt-dev/<tenant>.json`). */
export interface DevSigningKey {
  kid: string;
  privateJwk: JWK;
  publicJwk: JWK;
}

/** The body of `PUT /v1/tenants/:id/jwt` that trusts `key`. */
export interface DevJwtConfig {
  issuer: string;
  audience: string;
  jwks: { keys: JWK[] };
  algorithms: string[];
}

/** A user name a token can carry as `sub` and a shell variable can be named after. */
const userPattern = /^[A-Za-z][A-Za-z0-9_-]{0,39}$/;

/** A fresh ES256 key pair with a random key id. */
export async function newDevSigningKey(): Promise<DevSigningKey> {
  const { publicKey, privateKey } = await generateKeyPair(devAlgorithm, { extractable: true });
  const kid = `dev-${crypto.randomUUID().slice(0, 8)}`;
  return {
    kid,
    privateJwk: { ...(await exportJWK(privateKey)), kid, alg: devAlgorithm },
    publicJwk: { ...(await exportJWK(publicKey)), kid, alg: devAlgorithm, use: "sig" },
  };
}

/** Whether `value` is a dev key as {@link newDevSigningKey} made it (a kept file may be anything). */
export function isDevSigningKey(value: unknown): value is DevSigningKey {
  const key = value as Partial<DevSigningKey> | null;
  return (
    typeof key === "object" &&
    key !== null &&
    typeof key.kid === "string" &&
    typeof key.privateJwk?.d === "string" &&
    typeof key.publicJwk?.x === "string"
  );
}

export function devJwtConfig(key: DevSigningKey): DevJwtConfig {
  return {
    issuer: devIssuer,
    audience: devAudience,
    jwks: { keys: [key.publicJwk] },
    algorithms: [devAlgorithm],
  };
}

/** Why `user` cannot be a dev token's user, or null if it can. */
export function userProblem(user: string): string | null {
  return userPattern.test(user)
    ? null
    : `user ${JSON.stringify(user)}: 1-40 letters, digits, _ and -, starting with a letter`;
}

/** The shell variable a user's token is exported as: `alice` → `LESSOR_ALICE_TOKEN`. */
export function tokenVariable(user: string): string {
  return `LESSOR_${user.toUpperCase().replaceAll("-", "_")}_TOKEN`;
}

/** A token for `user` (its `sub`), valid for `ttlSeconds` from `nowMs`. */
export async function mintDevToken(
  key: DevSigningKey,
  user: string,
  ttlSeconds: number,
  nowMs = Date.now(),
): Promise<{ token: string; expiresAt: string }> {
  const problem = userProblem(user);
  if (problem) throw new Error(problem);
  const issuedAt = Math.floor(nowMs / 1000);
  const expiresAt = issuedAt + ttlSeconds;
  const token = await new SignJWT({})
    .setProtectedHeader({ alg: devAlgorithm, kid: key.kid, typ: "JWT" })
    .setSubject(user)
    .setIssuer(devIssuer)
    .setAudience(devAudience)
    .setIssuedAt(issuedAt)
    .setExpirationTime(expiresAt)
    .sign(await importJWK(key.privateJwk, devAlgorithm));
  return { token, expiresAt: new Date(expiresAt * 1000).toISOString() };
}
