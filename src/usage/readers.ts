/**
 * Exact usage readers. A tenant's usage is its rollup (written only by the fold) plus the deltas
 * the fold has not drained yet. Each reader is one SQL statement, so it reads both relations in
 * one snapshot; the fold moves deltas into the rollup in one statement too, so a reader sees a
 * delta either in the rollup or in the deltas, never in both and never in neither, whenever the
 * fold runs. Deltas at or below a rollup's `folded_seq` are replays of folded flushes and are not
 * counted (the fold drops them).
 *
 * What a TenantObject has counted but not yet flushed (at most one heartbeat's worth) is not in
 * the control plane yet, so it is not in these totals either.
 */
import { sql } from "drizzle-orm";
import type { ControlPlane } from "../control-plane/index.ts";
import type { UsageCounters } from "./index.ts";

export interface TenantUsage {
  tenantId: string;
  usage: UsageCounters;
  /** Deltas not folded yet (their counts are included in `usage`). */
  unfoldedDeltas: number;
  /** When the fold last changed this tenant's rollup; null if it never has. */
  lastFoldedAt: string | null;
  /** The database clock at the reader's snapshot. */
  asOf: string;
}

export interface FleetUsage {
  /**
   * Tenants whose usage the control plane has recorded (a rollup or a delta): not the catalog's
   * tenants, which include those that have not used anything yet (nor flushed it: see above).
   */
  tenantsWithUsage: number;
  usage: UsageCounters;
  unfoldedDeltas: number;
  asOf: string;
}

function num(value: unknown): number {
  return typeof value === "number" ? value : Number(value ?? 0);
}

function iso(value: unknown): string {
  return new Date(num(value)).toISOString();
}

function counters(row: Record<string, unknown>): UsageCounters {
  return {
    queries: num(row.queries),
    rowsReturned: num(row.rows_returned),
    errors: num(row.errors),
    leaseMs: num(row.lease_ms),
    poolStarts: num(row.pool_starts),
  };
}

/** One tenant's exact usage, or null if the catalog has no such tenant. */
export async function readTenantUsage(db: ControlPlane, tenantId: string): Promise<TenantUsage | null> {
  const { rows } = await db.execute<Record<string, unknown>>(sql`
    WITH rollup AS (
      SELECT * FROM usage_rollups WHERE tenant_id = ${tenantId}
    ), pending AS (
      SELECT count(*) AS n,
             coalesce(sum(d.queries), 0) AS queries,
             coalesce(sum(d.rows_returned), 0) AS rows_returned,
             coalesce(sum(d.errors), 0) AS errors,
             coalesce(sum(d.lease_ms), 0) AS lease_ms,
             coalesce(sum(d.pool_starts), 0) AS pool_starts
        FROM usage_deltas d
       WHERE d.tenant_id = ${tenantId}
         AND d.seq > coalesce((SELECT folded_seq FROM rollup), 0)
    )
    SELECT EXISTS (SELECT 1 FROM tenants WHERE id = ${tenantId}) AS known,
           GREATEST(0, coalesce(r.queries, 0) + p.queries)::float8 AS queries,
           GREATEST(0, coalesce(r.rows_returned, 0) + p.rows_returned)::float8 AS rows_returned,
           GREATEST(0, coalesce(r.errors, 0) + p.errors)::float8 AS errors,
           GREATEST(0, coalesce(r.lease_ms, 0) + p.lease_ms)::float8 AS lease_ms,
           GREATEST(0, coalesce(r.pool_starts, 0) + p.pool_starts)::float8 AS pool_starts,
           p.n::float8 AS unfolded,
           (extract(epoch FROM r.folded_at) * 1000)::float8 AS folded_at,
           (extract(epoch FROM now()) * 1000)::float8 AS as_of
      FROM pending p LEFT JOIN rollup r ON true`);
  const row = rows[0];
  if (row?.known !== true) return null;
  return {
    tenantId,
    usage: counters(row),
    unfoldedDeltas: num(row.unfolded),
    lastFoldedAt: row.folded_at === null || row.folded_at === undefined ? null : iso(row.folded_at),
    asOf: iso(row.as_of),
  };
}

/** Fleet totals: the sum, over every tenant, of what `readTenantUsage` answers for it. */
export async function readFleetUsage(db: ControlPlane): Promise<FleetUsage> {
  const { rows } = await db.execute<Record<string, unknown>>(sql`
    WITH pending AS (
      SELECT d.tenant_id,
             count(*) AS n,
             sum(d.queries) AS queries,
             sum(d.rows_returned) AS rows_returned,
             sum(d.errors) AS errors,
             sum(d.lease_ms) AS lease_ms,
             sum(d.pool_starts) AS pool_starts
        FROM usage_deltas d LEFT JOIN usage_rollups r ON r.tenant_id = d.tenant_id
       WHERE d.seq > coalesce(r.folded_seq, 0)
       GROUP BY d.tenant_id
    ), per_tenant AS (
      SELECT GREATEST(0, coalesce(r.queries, 0) + coalesce(p.queries, 0)) AS queries,
             GREATEST(0, coalesce(r.rows_returned, 0) + coalesce(p.rows_returned, 0)) AS rows_returned,
             GREATEST(0, coalesce(r.errors, 0) + coalesce(p.errors, 0)) AS errors,
             GREATEST(0, coalesce(r.lease_ms, 0) + coalesce(p.lease_ms, 0)) AS lease_ms,
             GREATEST(0, coalesce(r.pool_starts, 0) + coalesce(p.pool_starts, 0)) AS pool_starts,
             coalesce(p.n, 0) AS n
        FROM usage_rollups r FULL JOIN pending p ON p.tenant_id = r.tenant_id
    )
    SELECT count(*)::float8 AS tenants_with_usage,
           coalesce(sum(queries), 0)::float8 AS queries,
           coalesce(sum(rows_returned), 0)::float8 AS rows_returned,
           coalesce(sum(errors), 0)::float8 AS errors,
           coalesce(sum(lease_ms), 0)::float8 AS lease_ms,
           coalesce(sum(pool_starts), 0)::float8 AS pool_starts,
           coalesce(sum(n), 0)::float8 AS unfolded,
           (extract(epoch FROM now()) * 1000)::float8 AS as_of
      FROM per_tenant`);
  const row = rows[0] ?? {};
  return {
    tenantsWithUsage: num(row.tenants_with_usage),
    usage: counters(row),
    unfoldedDeltas: num(row.unfolded),
    asOf: iso(row.as_of),
  };
}
