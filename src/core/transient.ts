/**
 * Whether a failure is transient: the connection, the server or the network went away (a killed
 * backend, a restarted or unreachable host, a cut or stalled tunnel, a Durable Object that
 * restarted mid-call), not the work's own fault. Transient work is retried, with backoff; anything
 * else (an error its SQL raised, a bound it reached) is final. Work that may be run twice, and only
 * such work, asks this: a migration (its ledger skips what committed), a provisioning (each of its
 * steps is idempotent).
 */

/** SQLSTATEs of a server or connection that went away, or that refused for now. */
const transientStates = new Set([
  // admin_shutdown, crash_shutdown, cannot_connect_now: a killed backend, a restart.
  "57P01",
  "57P02",
  "57P03",
  // too_many_connections: the host's own limit, for now.
  "53300",
  // serialization_failure, deadlock_detected: the transaction rolled back; running it again is the cure.
  "40001",
  "40P01",
]);

/** Lessor's own codes that mean "not now" rather than "not this". */
const transientCodes = new Set([
  "connection_lost",
  "control_plane_unavailable",
  "object_unavailable",
  "maintenance_busy",
  "capacity_saturated",
]);

/** How a lost connection or network reads in the driver's and the runtime's messages. */
const transientMessage =
  /connection terminated|network connection lost|connection (was )?(reset|refused|closed)|ECONNRESET|ECONNREFUSED|EPIPE|socket hang up|websocket|durable object.*(reset|restart)|promise will never complete|connection timeout/i;

export function isTransientFailure(error: unknown): boolean {
  if (typeof error !== "object" || error === null) return false;
  const { code, type, message, cause } = error as {
    code?: unknown;
    type?: unknown;
    message?: unknown;
    cause?: unknown;
  };
  if (typeof code === "string") {
    // A connection exception (class 08) or one of the states above.
    if (/^08[0-9A-Z]{3}$/.test(code) || transientStates.has(code)) return true;
    if (transientCodes.has(code)) return true;
    // Any other SQLSTATE is the statement's own failure.
    if (/^[0-9A-Z]{5}$/.test(code)) return false;
  }
  // The driver reports a refused or broken WebSocket as the socket's error event, not an Error.
  if (type === "error") return true;
  if (typeof message === "string" && transientMessage.test(message)) return true;
  return cause !== undefined && cause !== error && isTransientFailure(cause);
}
