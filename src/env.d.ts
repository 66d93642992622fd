// Secrets are not in wrangler.toml, so `wrangler types` cannot see them; they are declared here.
interface LessorSecrets {
  /** Bearer key for operator endpoints. */
  LESSOR_ADMIN_KEY: string;
  /**
   * The AES-GCM key that seals tenant database passwords (src/crypto/seal.ts): 32 random bytes,
   * base64, or a ring `{"current": "k2", "keys": {"k1": "<base64>", "k2": "<base64>"}}`.
   */
  LESSOR_SEAL_KEY: string;
  /** Connection string of the control-plane database. */
  LESSOR_CONTROL_PLANE_URL: string;
  /** JSON object: database host name → admin connection string used to provision tenants on it. */
  LESSOR_HOSTS: string;
  /**
   * The MAC keys tenant keys are minted and checked under (src/crypto/tenant-keys.ts): a base64
   * 32-byte key, or a ring `{"current": n, "keys": {"n": "<base64>", …}}`.
   */
  LESSOR_KEY_MAC_KEYS: string;
  /** Optional bearer key for `GET /metrics` alone, so a scraper need not hold the admin key. */
  LESSOR_METRICS_KEY?: string;
}

interface Env extends LessorSecrets {}

declare namespace Cloudflare {
  interface Env extends LessorSecrets {}
}
