/**
 * The tenant pool lifecycle as plain data and functions over `now`. The TenantObject adapter
 * persists this record and performs the I/O each decision asks for; nothing here touches a runtime.
 *
 *     stopped ──start──▶ starting ──ok──▶ ready ──idle──▶ draining ──leases = 0──▶ stopped
 *                           │                                  ▲
 *                           └──fail──▶ failed (retryAt) ───────┘ (next request after retryAt starts again)
 *
 * A credential rotation overlaps two generations of a ready pool (docs/adr/013): `rotatingTo`
 * names the generation being prepared under the new credential while the current one keeps
 * serving; at the switch it becomes current and the old one is `retiring`, serving only the
 * leases it already holds, until it stops.
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
  /**
   * Lessor's own configuration cannot start the tenant (its sealed credential names a key that
   * left `LESSOR_SEAL_KEY`, say): the operator must act; clients see `misconfigured`.
   */
  | "misconfigured"
  /**
   * A customer's database (adopted, docs/adr/018) refused the credential its customer issued: it was
   * revoked or changed on their side. Lessor cannot repair it (it does not own the role); an
   * operator must supply a new one. Clients see `credential_revoked`, never `unreachable`.
   */
  | "credential_revoked"
  /** The host offered no TLS, or a certificate that failed verification (docs/adr/027). */
  | "tls_refused"
  /** The host asked for a password method other than SCRAM (docs/adr/027). */
  | "auth_method_refused"
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
  /** The generation a credential rotation is preparing (not yet serving), if one is. */
  rotatingTo: number | null;
  /** The previous generation after a rotation: serves only the leases it holds, then stops. */
  retiring: number | null;
}

export const initialLifecycle: Lifecycle = {
  state: "stopped",
  generation: 0,
  failures: 0,
  failureReason: null,
  retryAt: null,
  migrating: false,
  rotatingTo: null,
  retiring: null,
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

/** The next unused generation number (past one a rotation may be preparing). */
export function nextGeneration(lc: Lifecycle): number {
  return Math.max(lc.generation, lc.rotatingTo ?? 0, lc.retiring ?? 0) + 1;
}

/** Entering `starting` takes the next generation. */
export function beginStart(lc: Lifecycle): Lifecycle {
  return { ...lc, state: "starting", generation: nextGeneration(lc) };
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
export function recoverAfterRestart(lc: Lifecycle): {
  lifecycle: Lifecycle;
  deadGeneration: number | null;
  /** Every generation that may still hold budget or backends: current, retiring, being prepared. */
  deadGenerations: number[];
} {
  // An interrupted migration is not resumed here: the campaign re-runs it, and the migrator reads
  // the database's own ledger, so nothing is applied twice. An interrupted rotation is not resumed
  // either: both of its generations died with the object (no two live generations are left), and
  // the credential is whichever the control plane holds (the next start repairs the role to it).
  const base = { ...initialLifecycle, ...lc, migrating: false, rotatingTo: null, retiring: null };
  const side = [lc.retiring, lc.rotatingTo].filter((g): g is number => typeof g === "number");
  if (lc.state === "ready" || lc.state === "starting" || lc.state === "draining") {
    return {
      lifecycle: { ...base, state: "stopped", generation: Math.max(lc.generation, ...side) },
      deadGeneration: lc.generation,
      deadGenerations: [lc.generation, ...side],
    };
  }
  return {
    lifecycle: { ...base, generation: Math.max(lc.generation, ...side) },
    deadGeneration: side.length > 0 ? lc.generation : null,
    deadGenerations: side,
  };
}

/** What a credential rotation should do, given the lifecycle. */
export type RotationDecision =
  /** No pool runs: set the new credential; the next start uses it. */
  | { kind: "update_credential" }
  /** A ready pool: prepare a new generation under the new credential, then switch. */
  | { kind: "overlap" }
  | { kind: "refuse"; code: "tenant_migrating" | "tenant_draining" | "tenant_busy" | "rotation_in_progress" };

export function rotationDecision(lc: Lifecycle): RotationDecision {
  if (lc.rotatingTo !== null || lc.retiring !== null) return { kind: "refuse", code: "rotation_in_progress" };
  if (lc.migrating) return { kind: "refuse", code: "tenant_migrating" };
  switch (lc.state) {
    case "stopped":
    case "failed":
      return { kind: "update_credential" };
    case "ready":
      return { kind: "overlap" };
    case "starting":
      return { kind: "refuse", code: "tenant_busy" };
    case "draining":
      return { kind: "refuse", code: "tenant_draining" };
  }
}

/**
 * A stopped tenant's credential was replaced (a rotation, or a credential its customer supplied):
 * a tenant backing off after a failed start (a revoked credential, say) may start again at once.
 */
export function credentialReplaced(lc: Lifecycle): Lifecycle {
  if (lc.state !== "failed") return lc;
  return { ...lc, state: "stopped", failures: 0, failureReason: null, retryAt: null };
}

/** A rotation reserves the next generation for the pool it prepares; the current one keeps serving. */
export function beginRotation(lc: Lifecycle): Lifecycle {
  return { ...lc, rotatingTo: nextGeneration(lc) };
}

/**
 * The prepared generation is ready: it becomes current, and `from` retires. Null when the pool is
 * no longer the ready generation `from` (drained, evicted or restarted meanwhile): the rotation
 * then abandons its new pool rather than resurrect a tenant that stopped.
 */
export function rotationSwitched(lc: Lifecycle, from: number): Lifecycle | null {
  if (lc.rotatingTo === null || lc.state !== "ready" || lc.generation !== from || lc.migrating) return null;
  return { ...lc, generation: lc.rotatingTo, rotatingTo: null, retiring: from };
}

/** The rotation gave up before its switch: nothing was prepared that serves. */
export function rotationAbandoned(lc: Lifecycle): Lifecycle {
  return lc.rotatingTo === null ? lc : { ...lc, rotatingTo: null };
}

/** The retiring generation's last lease ended and its pool is closed. */
export function retired(lc: Lifecycle, generation: number): Lifecycle {
  return lc.retiring === generation ? { ...lc, retiring: null } : lc;
}

/**
 * Beyond what legitimately holds a lease: a `/sql` request waits for a connection (10 s), runs
 * within the statement bound, gets a cancel's grace and a cut's (2 s each), and answers; a session
 * lease lives at most its lifetime and is reclaimed by the next alarm after it.
 */
export const leaseOverdueMarginMs = 60_000;

/**
 * How long a lease may be held before it is overdue: a lease still counted then lost its release
 * (a request whose work will never settle), and is reclaimed rather than keep its generation busy
 * for ever.
 */
export function leaseOverdueAfterMs(
  kind: "sql" | "session",
  bounds: { statementTimeoutMs: number; leaseMaxLifetimeMs: number },
): number {
  return (kind === "sql" ? bounds.statementTimeoutMs : bounds.leaseMaxLifetimeMs) + leaseOverdueMarginMs;
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
    case "misconfigured":
      return "misconfigured";
    case "host_tls_refused":
      return "tls_refused";
    case "host_auth_refused":
      return "auth_method_refused";
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
