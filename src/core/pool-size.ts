/**
 * Largest pool a tenant may hold: a bound on the configuration, not the platform's. Cloudflare
 * bounds how many of an object's connections are opening at once (six, src/postgres/opening-gate.ts),
 * not how many it holds, since 2026-04-09; the host's budget decides what is admitted
 * (docs/adr/030-pools-larger-than-six.md).
 */
export const maxPoolSize = 32;
