/**
 * A pooled connection's transaction status, from the ReadyForQuery messages Postgres sends ('I'
 * idle, 'T' in a transaction, 'E' in a failed transaction), so a connection is never returned to
 * the pool inside a transaction; and the reset that leaves it as a fresh one would be. The state
 * lives on the connection itself (`ConnectionState`, src/postgres/clients.ts).
 */
import type { PoolClient } from "@neondatabase/serverless";
import { connectionState } from "../../postgres/index.ts";
import { onReadyForQuery } from "../../postgres/internals.ts";

/** Marks a connection Lessor is about to destroy (a cancelled or cut statement, a forced drain). */
export function markEndedOnPurpose(client: PoolClient): void {
  connectionState(client).endedOnPurpose = true;
}

/** Whether Lessor destroyed this connection on purpose (its closing errors are not news). */
export function wasEndedOnPurpose(client: object | undefined): boolean {
  return client !== undefined && connectionState(client).endedOnPurpose;
}

/**
 * Starts tracking (once per connection). Also gives the connection an error listener of its own:
 * the pool listens only to idle connections, and a checked-out connection whose backend dies
 * (terminated, database restarted) would otherwise raise an uncaught error in the object. The
 * failure still reaches whoever uses the connection next, through its query.
 */
export function trackTransactionStatus(client: PoolClient, onError: (error: Error) => void): void {
  const state = connectionState(client);
  if (state.transactionStatus !== null) return;
  state.transactionStatus = "I";
  client.on("error", (error: Error) => {
    if (!state.endedOnPurpose) onError(error);
  });
  onReadyForQuery(client, (message) => {
    if (typeof message.status === "string") state.transactionStatus = message.status;
  });
}

/**
 * Records the status of a ReadyForQuery the driver did not see (the wire endpoint relays a leased
 * connection's traffic itself, src/tenant-object/wire.ts), so the reset's check reads the truth.
 */
export function noteTransactionStatus(client: PoolClient, status: "I" | "T" | "E"): void {
  connectionState(client).transactionStatus = status;
}

/** True if the last ReadyForQuery said the connection is idle outside any transaction. */
export function isIdleOutsideTransaction(client: PoolClient): boolean {
  return (connectionState(client).transactionStatus ?? "I") === "I";
}

/**
 * Whether the connection is gone after `error`: anything that is not a Postgres error (a broken
 * socket), or a Postgres error of severity FATAL or PANIC (the backend ended the session). An
 * ordinary ERROR, whatever its class (08P01 from a Bind with the wrong parameter count, 57014
 * from a cancel), leaves the connection usable.
 */
export function isConnectionFatal(error: unknown): boolean {
  if (typeof error !== "object" || error === null) return true;
  const { severity, code } = error as { severity?: unknown; code?: unknown };
  if (typeof severity !== "string" || typeof code !== "string") return true;
  return severity === "FATAL" || severity === "PANIC";
}

/**
 * Everything a session can hold besides its transaction, undone (the reset Neon's own pool runs):
 * cursors, the role, every setting (back to the connection's startup values), prepared statements,
 * LISTEN, session advisory locks, temporary tables, sequence state. Its one function is named with
 * its schema: the tenant chooses its role's `search_path` and fills `public`.
 */
const resetAfterTransaction =
  "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DEALLOCATE ALL; UNLISTEN *; " +
  "SELECT pg_catalog.pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES";

/**
 * The reset sent after every request, whatever it ran, so no state can pass to the next request: a
 * reset by construction, with no guess about what a statement might have changed. One round trip,
 * and it needs no knowledge of the transaction status: the pipelined reset is written before the
 * statement's ReadyForQuery has come back.
 *
 * It opens with `BEGIN; ROLLBACK`, not `ROLLBACK`: on an idle connection (nearly every request) a
 * bare `ROLLBACK` makes Postgres write `WARNING: there is no transaction in progress` to the
 * tenant's server log, once per request (and costs the backend more than the two statements do).
 * `BEGIN` on an idle connection opens a transaction for `ROLLBACK` to end; inside a transaction the
 * statement left open it warns once and `ROLLBACK` ends the tenant's. In a failed transaction (a
 * single statement's flight cannot leave one) `BEGIN` fails, and the reset with it: the connection
 * is destroyed, never reused.
 */
export const sessionResetSql = `BEGIN; ROLLBACK; ${resetAfterTransaction}`;

/** The reset for a connection whose status the driver saw: nothing to end when it is idle. */
export function resetSqlFor(client: PoolClient): string {
  const status = connectionState(client).transactionStatus;
  if (status === "I") return resetAfterTransaction;
  if (status === "T" || status === "E") return `ROLLBACK; ${resetAfterTransaction}`;
  return sessionResetSql;
}

/**
 * Leaves the connection as a fresh one would be. Returns an error if it cannot be made clean, so the
 * pool destroys it instead of reusing it.
 */
export async function resetConnection(client: PoolClient): Promise<Error | undefined> {
  try {
    await client.query(resetSqlFor(client));
    return isIdleOutsideTransaction(client) ? undefined : new Error("reset left a transaction open");
  } catch (error) {
    return error instanceof Error ? error : new Error("reset failed");
  }
}
