/**
 * The environment every local `wrangler dev` gets: nothing in it phones home.
 *
 * Left alone, wrangler fetches a `Request.cf` sample from workers.cloudflare.com on every start
 * and reload (offline, that printed `getaddrinfo ENOTFOUND workers.cloudflare.com` with a stack,
 * twice per start), sends usage metrics and error reports, and asks npm for a newer wrangler while
 * it prints its banner. Lessor reads nothing of `request.cf`, so the built-in placeholder is all it
 * needs; `send_metrics = false` in wrangler.toml also covers `wrangler deploy`. A value already set
 * in the environment wins, so `CLOUDFLARE_CF_FETCH_ENABLED=true npm start` fetches it again.
 */
export const quietWranglerDefaults: Readonly<Record<string, string>> = {
  CLOUDFLARE_CF_FETCH_ENABLED: "false",
  WRANGLER_SEND_METRICS: "false",
  WRANGLER_SEND_ERROR_REPORTS: "false",
  // The banner is the version line and the npm update check behind it.
  WRANGLER_HIDE_BANNER: "true",
};

/** `env` (the process's by default) with {@link quietWranglerDefaults} under it. */
export function quietWranglerEnv(
  env: Record<string, string | undefined> = process.env,
): Record<string, string | undefined> {
  return { ...quietWranglerDefaults, ...env };
}
