/**
 * Where Cloudflare creates Lessor's Durable Objects (docs/adr/016-host-kinds.md, "Placement"). An
 * object is created near its first caller unless told otherwise; a location hint (per host, or for
 * the control plane) asks for a region instead, so a host's BudgetObject and its tenants' objects
 * live near the database they talk to. A hint is a preference the platform may not honour, and it
 * matters only when an object is first created: later calls reach the object wherever it is.
 */
import type { LocationHint } from "../config/index.ts";

/** The options of `getByName` for an object that should live near `hint` (none: near its caller). */
export function placementOptions(hint: LocationHint | null): { locationHint?: LocationHint } {
  return hint === null ? {} : { locationHint: hint };
}

/**
 * How long a restarted object waits before it starts its pool again: a random share of a bound, so
 * a deploy (every object restarts) does not bring every tenant's pool back in the same millisecond.
 * `random` is in [0, 1). The bound is a quarter of the admission wait, at most half a second: the
 * first request after a deploy pays at most that, and the budget's FIFO admission does the rest.
 */
export function restartJitterMs(random: number, admissionWaitMs: number): number {
  const bound = Math.min(500, Math.floor(admissionWaitMs / 4));
  return Math.floor(Math.max(0, Math.min(0.999_999, random)) * bound);
}
