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

/** Starts tracking (once per connection). */
export function trackTransactionStatus(client: PoolClient): void {
  if (statusOf.has(client)) return;
  statusOf.set(client, "I");
  const connection = (client as unknown as { connection?: MessageSource }).connection;
  connection?.on("readyForQuery", (message) => {
    if (typeof message.status === "string") statusOf.set(client, message.status);
  });
}

/** True if the last ReadyForQuery said the connection is idle outside any transaction. */
export function isIdleOutsideTransaction(client: PoolClient): boolean {
  return (statusOf.get(client) ?? "I") === "I";
}
