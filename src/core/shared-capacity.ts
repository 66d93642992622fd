/**
 * The capacity arithmetic of a tenant generation's two kinds of connection (the tenant's own pool,
 * and its end users' pool in JWT mode: docs/adr/012-end-user-jwts.md) sharing one maximum: pure
 * decisions over counts the pool reads off its driver pools (src/tenant-object/pool/index.ts), so that the
 * promises hold by construction and are unit-tested without workerd
 * (test/unit/shared-capacity.test.ts):
 *
 * - never more connections of the two kinds together, plus those being closed, than the maximum;
 * - an idle connection is counted on by one checkout at most (a claim holds it until handed over);
 * - room for one kind is made by closing an idle connection of the other, never a leased one;
 * - a give-back to the host's budget lowers the maximum first and closes only idle connections; a
 *   connection checked out meanwhile keeps its share of the maximum.
 */

/** One driver pool's counts, as the pool reads them at a decision. */
export interface SideCounts {
  /** Connections it holds, idle or checked out. */
  total: number;
  /** Of those, idle. */
  idle: number;
  /** Idle connections a checkout in flight already counts on (handed over on the next tick). */
  claimed: number;
}

/** Idle connections no checkout counts on yet. */
export function freeIdle(side: SideCounts): number {
  return Math.max(0, side.idle - side.claimed);
}

/**
 * What a checkout of one kind does next:
 * - `take`: an idle connection of its own kind is free, or its kind has none idle and the two kinds
 *   together (with those being closed) are under the maximum, so its driver pool may open one;
 * - `close_other`: the other kind holds a free idle connection: close it, then decide again;
 * - `wait`: everything is leased; wait for a connection to come back.
 *
 * A kind with idle connections that are all claimed waits rather than opening another: the claims
 * are handed over on the next tick, and opening one more would count twice on the same room.
 */
export function checkoutStep(
  own: SideCounts,
  other: SideCounts,
  closing: number,
  max: number,
): "take" | "close_other" | "wait" {
  const used = own.total + other.total + closing;
  if (freeIdle(own) > 0 || (own.idle === 0 && used < max)) return "take";
  if (freeIdle(other) > 0) return "close_other";
  return "wait";
}

/** How far a give-back lowers the maximum: up to `want`, never below `lowest`, never negative. */
export function giveBackAmount(want: number, max: number, lowest: number): number {
  return Math.max(0, Math.min(want, max - lowest));
}

/** Which kind an idle connection is closed from to honour a lowered maximum: the tenant's first. */
export function giveBackFrom(tenant: SideCounts, jwt: SideCounts | null): "tenant" | "jwt" | null {
  if (freeIdle(tenant) > 0) return "tenant";
  if (jwt && freeIdle(jwt) > 0) return "jwt";
  return null;
}

/**
 * After a give-back closed what it could: of the `lowered` allowance, how much the generation keeps
 * because connections checked out meanwhile are still open (`open` of them, against the lowered
 * `max`). What it gives back to the budget is `lowered` less this.
 */
export function keptAfterGiveBack(lowered: number, open: number, max: number): number {
  return Math.min(lowered, Math.max(0, open - max));
}
