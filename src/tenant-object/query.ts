/**
 * `/sql` in the object: authenticate, take a lease on the current generation, run the request on
 * one pooled connection inside the tenant scope, return the connection clean, count the usage.
 */
import { postgresErrorBody, type SqlRequest, type SqlResponseBody } from "../core/neon-protocol.ts";
import { LessorError } from "../errors/index.ts";
import type { SqlOutcome } from "../rpc/tenant.ts";
import { requireTenantScope, withTenantScope } from "../tenant-context/index.ts";
import { sqlFailure } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { isConnectionFatal, resetConnection } from "./connection-state.ts";
import { executeSqlRequest, mayLeaveSessionState } from "./execute.ts";
import type { LiveLease, TenantPool } from "./pool.ts";
import type { TenantRuntime } from "./runtime.ts";

export class TenantQueries {
  constructor(
    private readonly rt: TenantRuntime,
    private readonly auth: TenantAuth,
    private readonly pool: TenantPool,
  ) {}

  /** Authenticates the key hash and runs one `/sql` request under a lease. */
  async sql(
    tenantId: string,
    keyHash: string,
    request: SqlRequest,
    requiredSchemaVersion: number | null,
  ): Promise<SqlOutcome> {
    let authenticated = false;
    try {
      const record = await this.auth.authenticate(tenantId, keyHash);
      authenticated = true;
      if (requiredSchemaVersion !== null && record.schemaVersion < requiredSchemaVersion) {
        throw new LessorError("schema_too_old", {
          publicMessage: `The tenant's schema is at version ${record.schemaVersion}; this request needs ${requiredSchemaVersion}.`,
        });
      }
      const lease = await this.pool.acquire(record);
      const leasedAt = Date.now();
      try {
        this.auth.refuseIfDisabled();
        const body = await this.run(record.tenantId, lease, request);
        this.rt.usage.queries++;
        this.rt.usage.rowsReturned +=
          "results" in body ? body.results.reduce((n, r) => n + r.rows.length, 0) : body.rows.length;
        return { ok: true, json: JSON.stringify(body) };
      } finally {
        this.rt.usage.leaseMs += Date.now() - leasedAt;
        this.pool.release();
      }
    } catch (error) {
      if (authenticated) {
        this.rt.usage.queries++;
        this.rt.usage.errors++;
      }
      return sqlFailure(this.rt.tenantId, error);
    }
  }

  private async run(tenantId: string, lease: LiveLease, request: SqlRequest): Promise<SqlResponseBody> {
    const client = await this.pool.checkout(lease.pool);
    let broken: Error | undefined;
    try {
      return await withTenantScope({ tenantId, generation: lease.generation, leaseId: "sql" }, () => {
        requireTenantScope(tenantId);
        return executeSqlRequest(client, request);
      });
    } catch (error) {
      if (!postgresErrorBody(error) || isConnectionFatal(error)) {
        broken = error instanceof Error ? error : new Error("query failed");
        if (error instanceof LessorError) throw error;
        throw new LessorError("connection_lost", { internal: "connection failed mid-query", cause: error });
      }
      throw error;
    } finally {
      if (!broken) broken = await resetConnection(client, mayLeaveSessionState(request));
      client.release(broken);
    }
  }
}
