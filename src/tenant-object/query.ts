/**
 * `/sql` in the object: authenticate, take a lease on the current generation, run the request on
 * one pooled connection inside the tenant scope and within its bounds (watchdog.ts), answer, and
 * only then reset the connection and return it, so the reset costs the caller no round trip.
 *
 * With an end user's token (JWT mode, docs/adr/012-end-user-jwts.md) the token is verified first
 * (jwt.ts), and the request runs on an end-user connection, its first statement carrying the
 * prelude that sets the signed claims and the configured role for its transaction. A request that
 * fails any check runs nothing: there is no fallback to the tenant role.
 */
import type { PoolClient } from "@neondatabase/serverless";
import type { SqlRequest, Statement } from "../core/neon-protocol.ts";
import { encodeResult } from "../core/result-shape.ts";
import { LessorError } from "../errors/index.ts";
import { tenantMigrations } from "../migrations/tenant.gen.ts";
import { backendPid, cutConnection } from "../postgres/index.ts";
import type { KeyProof, SqlOutcome, TenantRecord } from "../rpc/tenant.ts";
import { requireTenantScope, withTenantScope } from "../tenant-context/index.ts";
import { sqlFailure } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { executeSqlRequest, type RawResult, ResponseBudget } from "./execute.ts";
import { TokenVerifier, type VerifiedToken } from "./jwt.ts";
import { admitHolder } from "./kernel/access.ts";
import {
  isConnectionFatal,
  isIdleOutsideTransaction,
  markEndedOnPurpose,
  resetConnection,
} from "./pool/connection-state.ts";
import { type ConnectionKind, CredentialMoved, type LiveLease, type TenantPool } from "./pool/index.ts";
import type { TenantRuntime } from "./runtime.ts";
import { tenantHooksForTests } from "./test-hooks.ts";
import { StatementWatchdog } from "./watchdog.ts";

/** Sets an end user's claims, their MAC and the configured role, for the transaction only. */
const jwtPreludeSql =
  "SELECT pg_catalog.set_config('request.jwt.claims', $1::pg_catalog.text, true), " +
  "pg_catalog.set_config('lessor.jwt_claims_mac', $2::pg_catalog.text, true), " +
  "pg_catalog.set_config('role', $3::pg_catalog.text, true)";

/** An end user's verified token and the role their statements run as. */
interface EndUser {
  token: VerifiedToken;
  role: string;
}

export class TenantQueries {
  private readonly verifier = new TokenVerifier();

  constructor(
    private readonly rt: TenantRuntime,
    private readonly auth: TenantAuth,
    private readonly pool: TenantPool,
  ) {}

  /** Authenticates the key hash and runs one `/sql` request under a lease. */
  async sql(
    tenantId: string,
    proof: KeyProof,
    request: SqlRequest,
    requiredSchemaVersion: number | null,
    bearer: string | null = null,
  ): Promise<SqlOutcome> {
    let authenticated = false;
    try {
      const { record, scope } = await this.auth.authenticateAny(tenantId, proof);
      authenticated = true;
      const endUser = await this.endUserOf(record, scope, bearer);
      if (requiredSchemaVersion !== null && requiredSchemaVersion > tenantMigrations.length) {
        throw new LessorError("schema_version_unknown", {
          publicMessage: `This request needs schema version ${requiredSchemaVersion}; this deployment bundles versions up to ${tenantMigrations.length}.`,
        });
      }
      if (requiredSchemaVersion !== null && record.schemaVersion < requiredSchemaVersion) {
        // A customer's database changes only through a campaign that includes it, never on demand.
        throw new LessorError("schema_too_old", {
          publicMessage: record.adopted
            ? `The tenant's schema is at version ${record.schemaVersion}; this request needs ${requiredSchemaVersion}. The database is its customer's: Lessor migrates it only in a campaign that includes customers' databases.`
            : `The tenant's schema is at version ${record.schemaVersion}; this request needs ${requiredSchemaVersion}.`,
          ...(record.adopted ? { details: { database: "adopted" } } : {}),
        });
      }
      let results: RawResult[];
      // A flight is a holder (kernel/holders.ts): operations wait for it; nothing cuts it short
      // but its own bounds.
      const leave = admitHolder(this.rt, {
        kind: "flight",
        keyId: proof.keyId,
        leased: () => true,
        end: () => undefined,
      });
      try {
        results = await this.run(record, await this.pool.acquire(record), request, endUser);
      } catch (error) {
        // A rotation switched generations while this request waited for a connection of the old
        // one: nothing ran, so it runs once on the new generation (docs/adr/013).
        if (!(error instanceof CredentialMoved)) throw error;
        results = await this.run(record, await this.pool.acquire(record), request, endUser);
      } finally {
        leave();
      }
      this.rt.usage.queries++;
      this.rt.usage.rowsReturned += results.reduce((n, r) => n + r.rows.length, 0);
      const encoded = results.map(encodeResult);
      return {
        ok: true,
        json: request.kind === "single" ? (encoded[0] ?? "null") : `{"results":[${encoded.join(",")}]}`,
      };
    } catch (error) {
      if (authenticated) {
        this.rt.usage.queries++;
        this.rt.usage.errors++;
      }
      return sqlFailure(this.rt.tenantId, error, authenticated);
    }
  }

  /**
   * Who the request runs as: null for the tenant role (a full key, no token); the verified end user
   * otherwise. A token without JWT mode, an end-user key without a token, and a token that fails
   * verification are refused here, before any lease.
   */
  private async endUserOf(
    record: TenantRecord,
    scope: "full" | "jwt",
    bearer: string | null,
  ): Promise<EndUser | null> {
    const jwt = record.jwt ?? null;
    if (bearer === null) {
      if (scope === "jwt") throw new LessorError("jwt_required");
      return null;
    }
    if (!jwt) throw new LessorError("jwt_not_configured");
    return { token: await this.verifier.verify(jwt, bearer), role: jwt.role };
  }

  /** The prelude of an end user's first statement, signed for the backend it runs on. */
  private async preludeFor(client: PoolClient, endUser: EndUser): Promise<Statement> {
    const pid = backendPid(client);
    if (pid === null)
      throw new LessorError("connection_lost", { internal: "end-user connection has no backend pid" });
    const mac = await this.pool.signClaims(pid, endUser.token.claims);
    return { query: jwtPreludeSql, params: [endUser.token.claims, mac, endUser.role] };
  }

  /** Runs the request on one connection of the lease; the lease ends when the connection is back. */
  private async run(
    record: TenantRecord,
    lease: LiveLease,
    request: SqlRequest,
    endUser: EndUser | null,
  ): Promise<RawResult[]> {
    const leasedAt = Date.now();
    const kind: ConnectionKind = endUser ? "jwt" : "tenant";
    let client: PoolClient;
    let prelude: Statement | null = null;
    try {
      this.auth.refuseIfDisabled();
      client = await this.pool.checkout(lease, kind);
    } catch (error) {
      this.endLease(lease, leasedAt);
      throw error;
    }
    // A lease reclaimed as overdue (its work never settled) cuts the connection it ran on.
    this.pool.onAbandon(lease, () => {
      markEndedOnPurpose(client);
      cutConnection(client);
    });
    const watchdog = new StatementWatchdog(this.rt, this.pool.credentials, record, lease.target, client);
    const budget = new ResponseBudget(this.rt.config.maxResponseBytes, request.output);
    let broken: Error | undefined;
    let reset: Promise<Error | undefined> | null = null;
    watchdog.arm();
    try {
      if (endUser) prelude = await this.preludeFor(client, endUser);
      return await withTenantScope(
        { tenantId: record.tenantId, generation: lease.generation, leaseId: "sql" },
        () => {
          requireTenantScope(record.tenantId);
          return executeSqlRequest(client, request, budget, watchdog.onOverrun, prelude, (done) => {
            reset = done;
          });
        },
      );
    } catch (error) {
      const refusal = watchdog.refusal(error);
      if (refusal) throw refusal;
      if (!(error instanceof LessorError) && isConnectionFatal(error)) {
        broken = error instanceof Error ? error : new Error("query failed");
        throw new LessorError("connection_lost", { internal: "connection failed mid-query", cause: error });
      }
      // Its clean-up ran statements after the pipelined reset: the connection is not reused.
      if (error instanceof LessorError && error.code === "prepared_transaction_refused") {
        broken = new Error("a prepared transaction was rolled back on it");
      }
      throw error;
    } finally {
      watchdog.disarm();
      this.giveBack(
        client,
        watchdog.connectionSuspect ? (broken ?? new Error("statement stopped")) : broken,
        lease,
        leasedAt,
        reset,
      );
    }
  }

  /**
   * Ends the lease with the answer, and returns the connection after it: a broken one is destroyed,
   * a sound one once it is reset, off the caller's path: the reset that rode in the statement's
   * flight (`reset`), or one sent now. A stop that comes meanwhile waits for it: the pool ends only
   * once every connection is back, and only then is the budget released.
   */
  private giveBack(
    client: PoolClient,
    broken: Error | undefined,
    lease: LiveLease,
    leasedAt: number,
    reset: Promise<Error | undefined> | null,
  ): void {
    this.endLease(lease, leasedAt);
    if (broken) {
      markEndedOnPurpose(client);
      client.release(broken);
      return;
    }
    this.rt.ctx.waitUntil(this.resetAndReturn(client, reset));
  }

  private async resetAndReturn(
    client: PoolClient,
    pipelined: Promise<Error | undefined> | null,
  ): Promise<void> {
    if (tenantHooksForTests.beforeReturn) await tenantHooksForTests.beforeReturn(this.rt.tenantId, client);
    if (pipelined === null) {
      client.release(await resetConnection(client));
      return;
    }
    const failed = await pipelined;
    client.release(
      failed ?? (isIdleOutsideTransaction(client) ? undefined : new Error("reset left a transaction open")),
    );
  }

  private endLease(lease: LiveLease, leasedAt: number): void {
    this.rt.usage.leaseMs += Date.now() - leasedAt;
    this.pool.release(lease);
  }
}
