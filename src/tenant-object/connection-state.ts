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
