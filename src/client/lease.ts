/**
 * Session leases: one pinned connection across requests, for interactive transactions.
 *
 *     POST   /v1/tenants/:id/leases   {ttlMs}          → 201 {lease, generation, expiresAt}
 *     POST   /v1/leases/:lease/sql    {query, params}  → the /sql single-result shape
 *     DELETE /v1/leases/:lease                         → 204
 *
 * A statement on a lease is sent by the Neon driver itself (the lease route speaks `/sql`'s single
 * query protocol), so parameters are encoded and rows parsed by the driver's own code and type
 * parsers: `lease.query` returns exactly what `neon()`'s `query` returns.
 */
import { type HTTPQueryOptions, type NeonQueryFunction, neon } from "@neondatabase/serverless";
import { LessorResponseError, readErrorAnswer, unexpectedResponseCode } from "./errors.ts";
import { guardQueryFunction, type SendSettings, send, type Transport, transportKey } from "./transport.ts";

/** Options of `client.lease()`. */
export interface LeaseOptions {
  /** Milliseconds the lease lives between uses (Lessor's default 30 000, at most `LESSOR_LEASE_MAX_TTL_MS`). */
  ttlMs?: number;
}

/** Options of `lease.transaction()`, spelled as the Neon driver's `transaction()` options. */
export interface LeaseTransactionOptions {
  isolationLevel?: "ReadUncommitted" | "ReadCommitted" | "RepeatableRead" | "Serializable";
  readOnly?: boolean;
  deferrable?: boolean;
}

/** What a transaction's callback gets: statements on the lease's connection. */
export interface LeaseQueries {
  /**
   * Runs one statement with `$1`, `$2`… placeholders on the lease's connection. Resolves as the Neon
   * driver's `sql.query()` does: rows as objects (or arrays with `{ arrayMode: true }`, the full
   * result with `{ fullResults: true }`), values parsed by the driver's type parsers.
   */
  readonly query: NeonQueryFunction<false, false>["query"];
}

/** An open session lease. Release it when done; an abandoned one is reclaimed after its TTL. */
export interface Lease extends LeaseQueries {
  /** The lease token (`lsl_…`); only the tenant's key can use it. */
  readonly id: string;
  /** The pool generation the lease is bound to. */
  readonly generation: number;
  /** When the lease expires unless used, as Lessor answered at open (each use extends it). */
  readonly expiresAt: Date;
  /**
   * Runs `work` between `BEGIN` and `COMMIT` on the lease's connection, and `ROLLBACK`s if it throws.
   * Resolves with what `work` returned once the commit succeeded.
   */
  transaction<T>(work: (tx: LeaseQueries) => Promise<T>, options?: LeaseTransactionOptions): Promise<T>;
  /** Releases the lease: Lessor rolls back anything open and discards the session. Safe to call twice. */
  release(): Promise<void>;
}

/** What `openLease` needs from its client. */
export interface LeaseContext {
  baseUrl: string;
  tenantId: string;
  key: string;
  connectionString: string;
  settings: SendSettings;
  /** Driver options that shape results (custom type parsers, the browser warning). */
  driverOptions: Pick<HTTPQueryOptions<false, false>, "types" | "disableWarningInBrowsers">;
}

/** Answers that mean a lease no longer holds anything: releasing it has nothing left to do. */
const leaseGoneCodes: ReadonlySet<string> = new Set([
  "lease_not_found",
  "lease_expired",
  "lease_lost",
  "stale_generation",
]);

/** Opens a session lease (retrying refusals as any request). */
export async function openLease(context: LeaseContext, options: LeaseOptions = {}): Promise<Lease> {
  const { baseUrl, key, settings } = context;
  const authorization = `Bearer ${key}`;
  const response = await send(
    `${baseUrl}/v1/tenants/${encodeURIComponent(context.tenantId)}/leases`,
    {
      method: "POST",
      headers: { Authorization: authorization, "content-type": "application/json" },
      body: JSON.stringify(options.ttlMs === undefined ? {} : { ttlMs: options.ttlMs }),
    },
    settings,
    false,
  );
  if (!response.ok) throw new LessorResponseError(await readErrorAnswer(response, settings.clock.now()));
  const opened = openedLease(await response.json().catch(() => undefined));
  if (opened === undefined) {
    throw new LessorResponseError({
      status: response.status,
      code: unexpectedResponseCode,
      message: "Lessor's answer to opening a lease has no lease, generation and expiresAt.",
      retryAfter: undefined,
    });
  }

  const leaseUrl = `${baseUrl}/v1/leases/${encodeURIComponent(opened.lease)}`;
  const transport: Transport = (init) => {
    const headers = new Headers(init.headers);
    // The lease route authenticates with the bearer key alone; the key need not travel twice.
    headers.delete("Neon-Connection-String");
    headers.set("Authorization", authorization);
    return send(`${leaseUrl}/sql`, { ...init, headers }, settings, true);
  };
  const sql = guardQueryFunction(
    neon(context.connectionString, { ...context.driverOptions, fetchOptions: { [transportKey]: transport } }),
  );
  const query = sql.query;
  let released = false;

  return {
    id: opened.lease,
    generation: opened.generation,
    expiresAt: new Date(opened.expiresAt),
    query,
    async transaction<T>(work: (tx: LeaseQueries) => Promise<T>, txOptions: LeaseTransactionOptions = {}) {
      await query(beginStatement(txOptions));
      let result: T;
      try {
        result = await work({ query });
      } catch (error) {
        // The original failure is what the caller needs; a lease that is gone has rolled back anyway.
        await query("ROLLBACK").catch(() => undefined);
        throw error;
      }
      const commit = await query("COMMIT", [], { fullResults: true });
      // Postgres answers COMMIT of a failed transaction with a ROLLBACK tag, not an error: a statement
      // failed inside `work` and its error was caught there.
      if (commit.command === "ROLLBACK") {
        throw new Error(
          "The transaction was rolled back, not committed: a statement in it failed (and its error was caught inside the transaction).",
        );
      }
      return result;
    },
    async release() {
      if (released) return;
      try {
        await send(leaseUrl, { method: "DELETE", headers: { Authorization: authorization } }, settings, true);
      } catch (error) {
        if (!(error instanceof LessorResponseError && leaseGoneCodes.has(error.code))) throw error;
      }
      released = true;
    },
  };
}

const isolationLevels: Record<NonNullable<LeaseTransactionOptions["isolationLevel"]>, string> = {
  ReadUncommitted: "READ UNCOMMITTED",
  ReadCommitted: "READ COMMITTED",
  RepeatableRead: "REPEATABLE READ",
  Serializable: "SERIALIZABLE",
};

/** `BEGIN` with the driver's transaction options, in SQL. */
export function beginStatement(options: LeaseTransactionOptions): string {
  const modes: string[] = [];
  if (options.isolationLevel !== undefined) {
    modes.push(`ISOLATION LEVEL ${isolationLevels[options.isolationLevel]}`);
  }
  if (options.readOnly !== undefined) modes.push(options.readOnly ? "READ ONLY" : "READ WRITE");
  if (options.deferrable !== undefined) modes.push(options.deferrable ? "DEFERRABLE" : "NOT DEFERRABLE");
  return modes.length === 0 ? "BEGIN" : `BEGIN ${modes.join(", ")}`;
}

function openedLease(body: unknown): { lease: string; generation: number; expiresAt: string } | undefined {
  if (typeof body !== "object" || body === null) return undefined;
  const { lease, generation, expiresAt } = body as Record<string, unknown>;
  return typeof lease === "string" && typeof generation === "number" && typeof expiresAt === "string"
    ? { lease, generation, expiresAt }
    : undefined;
}
