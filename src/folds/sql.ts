/**
 * The fold's SQL, as plain text with positional parameters, so the Worker (Neon driver) and the
 * benchmark (node-postgres, bench/fold.ts) run exactly the same statements.
 */

/**
 * The advisory lock that serializes folds ("LessorFd" as a bigint). Transaction-scoped: it is
 * released by the commit, so a run killed half way never leaves it held.
 */
export const foldLockKey = "5504933059158492772";

/** `$1` lock key → `locked`. */
export const tryFoldLockSql = "SELECT pg_try_advisory_xact_lock($1::bigint) AS locked";

/** `$1` milliseconds: bounds every statement of the fold's transaction. */
export const boundFoldSql = "SELECT set_config('statement_timeout', $1::text, true)";

/**
 * One statement, one moment: the database clock, the fold's own pid and database, and every
 * backend, prepared transaction and replication slot that could hold the horizon back. Each list
 * is JSON text so both drivers hand it over the same way. `unobservable` counts backends whose
 * transaction state our role may not see (it needs `pg_read_all_stats`).
 */
export const observeHorizonSql = `
SELECT
  pg_backend_pid() AS own_pid,
  current_database() AS database,
  (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS now_ms,
  (SELECT coalesce(json_agg(json_build_object(
      'pid', a.pid,
      'database', a.datname,
      'state', a.state,
      'backendXid', a.backend_xid::text,
      'backendXmin', a.backend_xmin::text,
      'xactStart', (extract(epoch FROM a.xact_start) * 1000)::float8,
      -- VACUUM ANALYZE is not excluded: its ANALYZE phase holds an ordinary snapshot.
      'lazyVacuum', a.backend_type = 'autovacuum worker'
                    AND a.query LIKE 'autovacuum: VACUUM %' AND a.query NOT LIKE 'autovacuum: VACUUM ANALYZE %')),
      '[]')::text
     FROM pg_stat_activity a
    WHERE a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL) AS backends,
  (SELECT coalesce(json_agg(json_build_object(
      'gid', p.gid,
      'database', p.database,
      'prepared', (extract(epoch FROM p.prepared) * 1000)::float8)), '[]')::text
     FROM pg_prepared_xacts p) AS prepared,
  (SELECT coalesce(json_agg(json_build_object(
      'slot', s.slot_name,
      'active', s.active,
      'xmin', s.xmin::text,
      'catalogXmin', s.catalog_xmin::text,
      'xminAge', age(s.xmin),
      'inactiveSince', (extract(epoch FROM (to_jsonb(s) ->> 'inactive_since')::timestamptz) * 1000)::float8)),
      '[]')::text
     FROM pg_replication_slots s
    WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL) AS slots,
  (SELECT count(*)::int FROM pg_stat_activity a
    WHERE a.datname = current_database() AND a.query = '<insufficient privilege>') AS unobservable
`;

/**
 * Drains up to `$1` deltas into the rollups, in one statement: the DELETE … RETURNING feeds the
 * upsert, so the deltas leave and the totals grow in the same instant, and a reader's snapshot
 * sees one or the other, never both or neither.
 *
 * - The batch is the first `$1` deltas in (tenant, seq) order, so for each tenant it is a prefix
 *   of what is waiting: everything below the tenant's new `folded_seq` has been folded.
 * - A delta at or below the tenant's `folded_seq` is a flush replayed after its first copy was
 *   folded: it is drained and dropped, not counted twice.
 * - Totals are clamped at zero. The rollup is written only here, under the fold lock, so the new
 *   totals computed from this statement's snapshot are the truth.
 *
 * Returns `drained`, `folded` (counted), `tenants`.
 */
export const foldDeltasSql = `
WITH drained AS (
  DELETE FROM usage_deltas
   WHERE ctid = ANY (ARRAY(
     SELECT ctid FROM usage_deltas ORDER BY tenant_id, seq LIMIT $1::int))
  RETURNING tenant_id, seq, queries, rows_returned, errors, lease_ms, pool_starts
),
fresh AS (
  SELECT d.*, d.seq > coalesce(r.folded_seq, 0) AS counted
    FROM drained d LEFT JOIN usage_rollups r ON r.tenant_id = d.tenant_id
),
per_tenant AS (
  SELECT f.tenant_id,
         max(f.seq) AS last_seq,
         count(*) AS drained,
         count(*) FILTER (WHERE f.counted) AS folded,
         coalesce(sum(f.queries) FILTER (WHERE f.counted), 0) AS queries,
         coalesce(sum(f.rows_returned) FILTER (WHERE f.counted), 0) AS rows_returned,
         coalesce(sum(f.errors) FILTER (WHERE f.counted), 0) AS errors,
         coalesce(sum(f.lease_ms) FILTER (WHERE f.counted), 0) AS lease_ms,
         coalesce(sum(f.pool_starts) FILTER (WHERE f.counted), 0) AS pool_starts
    FROM fresh f
   GROUP BY f.tenant_id
),
upserted AS (
  INSERT INTO usage_rollups AS r
         (tenant_id, queries, rows_returned, errors, lease_ms, pool_starts, folded_seq, folded_at)
  SELECT p.tenant_id,
         GREATEST(0, coalesce(o.queries, 0) + p.queries),
         GREATEST(0, coalesce(o.rows_returned, 0) + p.rows_returned),
         GREATEST(0, coalesce(o.errors, 0) + p.errors),
         GREATEST(0, coalesce(o.lease_ms, 0) + p.lease_ms),
         GREATEST(0, coalesce(o.pool_starts, 0) + p.pool_starts),
         GREATEST(coalesce(o.folded_seq, 0), p.last_seq),
         now()
    FROM per_tenant p LEFT JOIN usage_rollups o ON o.tenant_id = p.tenant_id
  ON CONFLICT (tenant_id) DO UPDATE
     SET queries = excluded.queries,
         rows_returned = excluded.rows_returned,
         errors = excluded.errors,
         lease_ms = excluded.lease_ms,
         pool_starts = excluded.pool_starts,
         folded_seq = excluded.folded_seq,
         folded_at = excluded.folded_at
  RETURNING 1
)
SELECT coalesce(sum(p.drained), 0)::int AS drained,
       coalesce(sum(p.folded), 0)::int AS folded,
       (SELECT count(*) FROM upserted)::int AS tenants
  FROM per_tenant p
`;

/**
 * Trims up to `$2` generation-ledger rows older than `$1` days, never a tenant's highest
 * generation: a start's insert-only race detection (a primary-key conflict) and the loser's
 * recovery (`highestGeneration`) both need it. Returns `trimmed`.
 */
export const trimGenerationLedgerSql = `
WITH trimmed AS (
  DELETE FROM generation_ledger
   WHERE ctid = ANY (ARRAY(
     SELECT g.ctid FROM generation_ledger g
      WHERE g.started_at < now() - $1::float8 * interval '1 day'
        AND g.generation < (SELECT max(h.generation) FROM generation_ledger h WHERE h.tenant_id = g.tenant_id)
      LIMIT $2::int))
  RETURNING 1
)
SELECT count(*)::int AS trimmed FROM trimmed
`;

/** Trims up to `$2` lifecycle events older than `$1` days. Returns `trimmed`. */
export const trimLifecycleEventsSql = `
WITH trimmed AS (
  DELETE FROM lifecycle_events
   WHERE ctid = ANY (ARRAY(
     SELECT ctid FROM lifecycle_events WHERE at < now() - $1::float8 * interval '1 day' LIMIT $2::int))
  RETURNING 1
)
SELECT count(*)::int AS trimmed FROM trimmed
`;

/** Trims up to `$2` fold outcomes older than `$1` days. Returns `trimmed`. */
export const trimFoldOutcomesSql = `
WITH trimmed AS (
  DELETE FROM fold_outcomes
   WHERE ctid = ANY (ARRAY(
     SELECT ctid FROM fold_outcomes WHERE started_at < now() - $1::float8 * interval '1 day' LIMIT $2::int))
  RETURNING 1
)
SELECT count(*)::int AS trimmed FROM trimmed
`;

/** Appends one run's outcome. Returns `id`. */
export const appendFoldOutcomeSql = `
INSERT INTO fold_outcomes
  (scheduled_at, duration_ms, outcome, folded_rows, replayed_rows, backlog_remains,
   trimmed_generations, trimmed_events, trimmed_outcomes,
   pin_kind, pin_pid, pin_gid, pin_slot, pin_seconds, message)
VALUES (to_timestamp($1::float8 / 1000), $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
RETURNING id::text AS id
`;
