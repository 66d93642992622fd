/**
 * Tracks each pooled connection's transaction status from the ReadyForQuery messages Postgres
 * sends ('I' idle, 'T' in a transaction, 'E' in a failed transaction), so a connection is never
 * returned to the pool inside a transaction.
 */
import type { PoolClient } from "@neondatabase/serverless";

interface MessageSource {
  on(event: "readyForQuery", listener: (message: { status?: string }) => void): void;
}

const statusOf = new WeakMap<object, string>();

/**
 * Starts tracking (once per connection). Also gives the connection an error listener of its own:
 * the pool listens only to idle connections, and a checked-out connection whose backend dies
 * (terminated, database restarted) would otherwise raise an uncaught error in the object. The
 * failure still reaches whoever uses the connection next, through its query.
 */
export function trackTransactionStatus(client: PoolClient, onError: (error: Error) => void): void {
  if (statusOf.has(client)) return;
  statusOf.set(client, "I");
  client.on("error", onError);
  const connection = (client as unknown as { connection?: MessageSource }).connection;
  connection?.on("readyForQuery", (message) => {
    if (typeof message.status === "string") statusOf.set(client, message.status);
  });
}

/** True if the last ReadyForQuery said the connection is idle outside any transaction. */
export function isIdleOutsideTransaction(client: PoolClient): boolean {
  return (statusOf.get(client) ?? "I") === "I";
}

/** SQLSTATE classes after which the connection cannot be reused (terminated, protocol trouble). */
export function isConnectionFatal(error: unknown): boolean {
  const code = (error as { code?: unknown }).code;
  return typeof code === "string" && (code.startsWith("57P") || code.startsWith("08"));
}

/**
 * Leaves the connection as a fresh one would be: outside any transaction and, where the work may
 * have set session state, without it. Returns an error if the connection cannot be made clean, so
 * the pool destroys it instead of reusing it.
 */
export async function resetConnection(
  client: PoolClient,
  discardSessionState: boolean,
): Promise<Error | undefined> {
  try {
    if (!isIdleOutsideTransaction(client)) await client.query("ROLLBACK");
    if (discardSessionState) await client.query("DISCARD ALL");
    return undefined;
  } catch (error) {
    return error instanceof Error ? error : new Error("reset failed");
  }
}
