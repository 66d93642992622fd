/**
 * The tenant pool lifecycle as plain data and functions over `now`. The TenantObject adapter
 * persists this record and performs the I/O each decision asks for; nothing here touches a runtime.
 *
 *     stopped ──start──▶ starting ──ok──▶ ready ──idle──▶ draining ──leases = 0──▶ stopped
 *                           │                                  ▲
 *                           └──fail──▶ failed (retryAt) ───────┘ (next request after retryAt starts again)
 */

export type PoolState = "stopped" | "starting" | "ready" | "draining" | "failed";

/** Why a start failed, classified so an operator can act on it. */
export type FailureReason =
  | "unreachable"
  /** The host took the connection and then said nothing within the connect bound (a blackhole). */
  | "timeout"
  | "auth_failed"
  | "database_missing"
  | "too_many_connections"
  | "control_plane_unavailable"
  | "unknown";

export interface Lifecycle {
  state: PoolState;
  /** Changes on every start; 0 before the first one. */
  generation: number;
  /** Consecutive failed starts, for the backoff. */
  failures: number;
  failureReason: FailureReason | null;
  /** While failed: epoch ms before which no start is attempted. */
  retryAt: number | null;
  /** A schema migration holds the tenant: no new lease is granted, and the pool is never evicted. */
  migrating: boolean;
}

export const initialLifecycle: Lifecycle = {
  state: "stopped",
  generation: 0,
  failures: 0,
  failureReason: null,
  retryAt: null,
  migrating: false,
};

/** What a request for a lease should do, given the lifecycle. */
export type AdmitDecision =
  | { kind: "use" }
  | { kind: "start" }
  | { kind: "join_start" }
  | { kind: "refuse_backoff"; retryAfterMs: number; reason: FailureReason }
  | { kind: "refuse_draining" }
  | { kind: "wait_migration" };

export function admitDecision(lc: Lifecycle, now: number): AdmitDecision {
  if (lc.migrating) return { kind: "wait_migration" };
  switch (lc.state) {
    case "ready":
      return { kind: "use" };
    case "starting":
      return { kind: "join_start" };
    case "draining":
      return { kind: "refuse_draining" };
    case "failed":
      if (lc.retryAt !== null && now < lc.retryAt) {
        return {
          kind: "refuse_backoff",
          retryAfterMs: lc.retryAt - now,
          reason: lc.failureReason ?? "unknown",
        };
      }
      return { kind: "start" };
    case "stopped":
      return { kind: "start" };
  }
}

/** Entering `starting` takes the next generation. */
export function beginStart(lc: Lifecycle): Lifecycle {
  return { ...lc, state: "starting", generation: lc.generation + 1 };
}

/** Moves the generation past `atLeast` (a lost race in the generation ledger). */
export function skipGeneration(lc: Lifecycle, atLeast: number): Lifecycle {
  return { ...lc, generation: Math.max(lc.generation, atLeast) + 1 };
}

/**
 * A start that never opened a connection (the budget refused it or was unreachable) leaves no pool
 * and no failure to back off from: the tenant is simply stopped, and the next request may try again.
 */
export function startRefused(lc: Lifecycle): Lifecycle {
  return lc.state === "starting" ? { ...lc, state: "stopped" } : lc;
}

export function startSucceeded(lc: Lifecycle): Lifecycle {
  return { ...lc, state: "ready", failures: 0, failureReason: null, retryAt: null };
}

export interface BackoffPolicy {
  baseMs: number;
  capMs: number;
}

export const defaultBackoff: BackoffPolicy = { baseMs: 500, capMs: 60_000 };

/**
 * Exponential backoff with jitter: the n-th consecutive failure waits between half and all of
 * min(cap, base·2ⁿ⁻¹). `random` is in [0, 1).
 */
export function backoffDelay(
  failures: number,
  random: number,
  policy: BackoffPolicy = defaultBackoff,
): number {
  const ceiling = Math.min(policy.capMs, policy.baseMs * 2 ** Math.max(0, failures - 1));
  return Math.round(ceiling / 2 + (ceiling / 2) * random);
}

export function startFailed(
  lc: Lifecycle,
  reason: FailureReason,
  now: number,
  random: number,
  policy: BackoffPolicy = defaultBackoff,
): Lifecycle {
  const failures = lc.failures + 1;
  return {
    ...lc,
    state: "failed",
    failures,
    failureReason: reason,
    retryAt: now + backoffDelay(failures, random, policy),
  };
}

/** A pool that starts draining takes no new lease; only a ready pool can start to drain. */
export function beginDrain(lc: Lifecycle): Lifecycle {
  return lc.state === "ready" ? { ...lc, state: "draining" } : lc;
}

/** A drained generation stops only if it is still the one that drained. */
export function stopped(lc: Lifecycle, generation: number): Lifecycle {
  if (lc.generation !== generation) return lc;
  return { ...lc, state: "stopped" };
}

/** A migration holds the tenant: no new lease, and the pool is never evicted. */
export function migrationStarted(lc: Lifecycle): Lifecycle {
  return { ...lc, migrating: true };
}

export function migrationFinished(lc: Lifecycle): Lifecycle {
  return { ...lc, migrating: false };
}

/**
 * An object that restarts has no pool in memory. If its persisted state claims a live pool, that
 * generation is dead: the next request must start a new one.
 */
export function recoverAfterRestart(lc: Lifecycle): { lifecycle: Lifecycle; deadGeneration: number | null } {
  // An interrupted migration is not resumed here: the campaign re-runs it, and the migrator reads
  // the database's own ledger, so nothing is applied twice.
  const base = { ...initialLifecycle, ...lc, migrating: false };
  if (lc.state === "ready" || lc.state === "starting" || lc.state === "draining") {
    return { lifecycle: { ...base, state: "stopped" }, deadGeneration: lc.generation };
  }
  return { lifecycle: base, deadGeneration: null };
}

/** What the idle alarm should do. */
export type IdleDecision = { kind: "drain" } | { kind: "rearm"; at: number } | { kind: "none" };

/**
 * A ready pool with no lease drains once it has been idle for `idleTimeoutMs`. Until then the alarm
 * re-arms, at most `heartbeatMs` ahead, which also keeps the platform from evicting a warm object.
 */
export function idleDecision(input: {
  state: PoolState;
  leases: number;
  idleSince: number | null;
  now: number;
  idleTimeoutMs: number;
  heartbeatMs: number;
}): IdleDecision {
  if (input.state !== "ready") return { kind: "none" };
  if (input.leases > 0 || input.idleSince === null)
    return { kind: "rearm", at: input.now + input.heartbeatMs };
  const deadline = input.idleSince + input.idleTimeoutMs;
  if (input.now >= deadline) return { kind: "drain" };
  return { kind: "rearm", at: Math.min(deadline, input.now + input.heartbeatMs) };
}

/** Classifies a failed connection attempt from the error the driver or Postgres gave. */
export function classifyStartFailure(error: unknown): FailureReason {
  const code = typeof error === "object" && error !== null ? (error as { code?: unknown }).code : undefined;
  switch (code) {
    case "28P01":
    case "28000":
      return "auth_failed";
    case "3D000":
      return "database_missing";
    case "53300":
    case "53400":
      return "too_many_connections";
    case "57P01":
    case "57P02":
    case "57P03":
    case "08001":
    case "08006":
    case "ECONNREFUSED":
      return "unreachable";
  }
  // The driver reports a refused or broken WebSocket as the socket's error event, not an Error.
  if (typeof error === "object" && error !== null && (error as { type?: unknown }).type === "error") {
    return "unreachable";
  }
  const message = error instanceof Error ? error.message : String(error);
  if (/timeout|timed out/i.test(message)) return "timeout";
  if (/websocket|connect|closed|terminat|ECONN/i.test(message)) return "unreachable";
  return "unknown";
}
