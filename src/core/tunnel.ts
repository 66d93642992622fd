/**
 * Customer tunnels as plain data (docs/adr/018-customer-databases-behind-tunnels.md): the name a
 * tunnel's budget goes by, and its health, a circuit breaker kept by the tunnel's BudgetObject.
 *
 * A tunnel is how Lessor reaches a database it did not create: a customer's Cloudflare Tunnel, a
 * private link or a bastion, ending in a WebSocket proxy in the customer's network. It has a
 * capacity of its own (the connections it carries), budgeted by a BudgetObject of its own, apart
 * from every host. When it is full, slow or down, only the tenants behind it are refused, with
 * `tunnel_unavailable`; the breaker makes the refusal immediate once the tunnel has failed twice in
 * a row, until a cool-down passes and the next start tries it again.
 */
import { backoffDelay, type FailureReason } from "./lifecycle.ts";

/** The prefix of a tunnel's budget name: never a host's name (host names are slugs, no colon). */
export const tunnelBudgetPrefix = "tunnel:";

/** The name a tunnel's BudgetObject and its tenants' `host` go by: `tunnel:<name>`. */
export function tunnelBudgetName(tunnel: string): string {
  return `${tunnelBudgetPrefix}${tunnel}`;
}

/** The tunnel a budget name names, or null for a host. */
export function tunnelOfBudgetName(budgetName: string): string | null {
  return budgetName.startsWith(tunnelBudgetPrefix) ? budgetName.slice(tunnelBudgetPrefix.length) : null;
}

/** Why a tunnel refuses: no room in its budget, it answers too slowly, or it does not answer. */
export type TunnelFault = "full" | "slow" | "down";

/** What one connection attempt through the tunnel taught: it carried us, or it failed how. */
export type TunnelOutcome = "ok" | "slow" | "down";

export interface TunnelHealth {
  /** `up` until a failure; then the kind of the last failure, until a success. */
  state: "up" | "slow" | "down";
  /** Failures in a row; the breaker opens at `breakerThreshold`. */
  consecutiveFailures: number;
  /** While open: epoch ms before which starts are refused without trying. */
  openUntil: number | null;
  lastOkAt: number | null;
  lastFailureAt: number | null;
}

export const initialTunnelHealth: TunnelHealth = {
  state: "up",
  consecutiveFailures: 0,
  openUntil: null,
  lastOkAt: null,
  lastFailureAt: null,
};

/** Failures in a row that open the breaker (one failure may be a tenant's, two are the tunnel's). */
export const breakerThreshold = 2;

/** How long the breaker stays open: 1 s, doubling per further failure, at most 30 s (with jitter). */
export const breakerBackoff = { baseMs: 1_000, capMs: 30_000 };

/**
 * The failure kind a start's failure says about the tunnel: a connect that timed out is a slow (or
 * frozen) tunnel, one that was refused or cut is a tunnel that is down. Anything the server itself
 * answered (a credential it refused, a database it does not have) says the tunnel works: null.
 */
export function tunnelFaultOf(reason: FailureReason): "slow" | "down" | null {
  if (reason === "timeout") return "slow";
  if (reason === "unreachable") return "down";
  return null;
}

/** The health after one attempt's outcome. `random` is in [0, 1) (the breaker's jitter). */
export function tunnelOutcome(
  health: TunnelHealth,
  outcome: TunnelOutcome,
  now: number,
  random: number,
): TunnelHealth {
  if (outcome === "ok") {
    return { ...health, state: "up", consecutiveFailures: 0, openUntil: null, lastOkAt: now };
  }
  const consecutiveFailures = health.consecutiveFailures + 1;
  const open = consecutiveFailures >= breakerThreshold;
  return {
    ...health,
    state: outcome,
    consecutiveFailures,
    openUntil: open
      ? now + backoffDelay(consecutiveFailures - breakerThreshold + 1, random, breakerBackoff)
      : health.openUntil,
    lastFailureAt: now,
  };
}

export type TunnelAdmission =
  | { kind: "allow" }
  | { kind: "refuse"; fault: "slow" | "down"; retryAfterMs: number };

/**
 * Whether a start may try the tunnel now. While the breaker is open it is refused at once, naming
 * the last failure; once the cool-down passed, starts try again (the next outcome closes the breaker
 * or opens it for longer).
 */
export function tunnelAdmission(health: TunnelHealth, now: number): TunnelAdmission {
  if (health.openUntil !== null && now < health.openUntil && health.state !== "up") {
    return { kind: "refuse", fault: health.state, retryAfterMs: health.openUntil - now };
  }
  return { kind: "allow" };
}
