/**
 * `/sql` in the object: authenticate, take a lease on the current generation, run the request on
 * one pooled connection inside the tenant scope and within its bounds (watchdog.ts), answer, and
 * only then reset the connection and return it, so the reset costs the caller no round trip.
 */
import type { PoolClient } from "@neondatabase/serverless";
import type { SqlRequest } from "../core/neon-protocol.ts";
import { shapeResult } from "../core/result-shape.ts";
import { LessorError } from "../errors/index.ts";
import { tenantMigrations } from "../migrations/tenant.gen.ts";
import type { KeyProof, SqlOutcome, TenantRecord } from "../rpc/tenant.ts";
import { requireTenantScope, withTenantScope } from "../tenant-context/index.ts";
import { sqlFailure } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { isConnectionFatal, markEndedOnPurpose, resetConnection } from "./connection-state.ts";
import { executeSqlRequest, type RawResult, ResponseBudget } from "./execute.ts";
import type { LiveLease, TenantPool } from "./pool.ts";
import type { TenantRuntime } from "./runtime.ts";
import { StatementWatchdog } from "./watchdog.ts";

export class TenantQueries {
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
  ): Promise<SqlOutcome> {
    let authenticated = false;
    try {
      const record = await this.auth.authenticate(tenantId, proof);
      authenticated = true;
      if (requiredSchemaVersion !== null && requiredSchemaVersion > tenantMigrations.length) {
        throw new LessorError("schema_version_unknown", {
          publicMessage: `This request needs schema version ${requiredSchemaVersion}; this deployment bundles versions up to ${tenantMigrations.length}.`,
        });
      }
      if (requiredSchemaVersion !== null && record.schemaVersion < requiredSchemaVersion) {
        throw new LessorError("schema_too_old", {
          publicMessage: `The tenant's schema is at version ${record.schemaVersion}; this request needs ${requiredSchemaVersion}.`,
        });
      }
      const lease = await this.pool.acquire(record);
      const results = await this.run(record, lease, request);
      const shaped = results.map((result) => shapeResult(result, request.output));
      this.rt.usage.queries++;
      this.rt.usage.rowsReturned += results.reduce((n, r) => n + r.rows.length, 0);
      const body = request.kind === "single" ? shaped[0] : { results: shaped };
      return { ok: true, json: JSON.stringify(body) };
    } catch (error) {
      if (authenticated) {
        this.rt.usage.queries++;
        this.rt.usage.errors++;
      }
      return sqlFailure(this.rt.tenantId, error);
    }
  }

  /** Runs the request on one connection of the lease; the lease ends when the connection is back. */
  private async run(record: TenantRecord, lease: LiveLease, request: SqlRequest): Promise<RawResult[]> {
    const leasedAt = Date.now();
    let client: PoolClient;
    try {
      this.auth.refuseIfDisabled();
      client = await this.pool.checkout(lease.pool);
    } catch (error) {
      this.endLease(leasedAt);
      throw error;
    }
    const watchdog = new StatementWatchdog(this.rt, this.pool.credentials, record, lease.target, client);
    const budget = new ResponseBudget(this.rt.config.maxResponseBytes);
    let broken: Error | undefined;
    watchdog.arm();
    try {
      return await withTenantScope(
        { tenantId: record.tenantId, generation: lease.generation, leaseId: "sql" },
        () => {
          requireTenantScope(record.tenantId);
          return executeSqlRequest(client, request, budget, watchdog.onOverrun);
        },
      );
    } catch (error) {
      const refusal = watchdog.refusal();
      if (refusal) throw refusal;
      if (!(error instanceof LessorError) && isConnectionFatal(error)) {
        broken = error instanceof Error ? error : new Error("query failed");
        throw new LessorError("connection_lost", { internal: "connection failed mid-query", cause: error });
      }
      throw error;
    } finally {
      watchdog.disarm();
      this.giveBack(
        client,
        watchdog.connectionSuspect ? (broken ?? new Error("statement stopped")) : broken,
        leasedAt,
      );
    }
  }

  /**
   * Ends the lease with the answer, and returns the connection after it: a broken one is destroyed,
   * a sound one is reset first, off the caller's path. A stop that comes meanwhile waits for it:
   * the pool ends only once every connection is back, and only then is the budget released.
   */
  private giveBack(client: PoolClient, broken: Error | undefined, leasedAt: number): void {
    this.endLease(leasedAt);
    if (broken) {
      markEndedOnPurpose(client);
      client.release(broken);
      return;
    }
    this.rt.ctx.waitUntil(resetConnection(client).then((failed) => client.release(failed)));
  }

  private endLease(leasedAt: number): void {
    this.rt.usage.leaseMs += Date.now() - leasedAt;
    this.pool.release();
  }
}
