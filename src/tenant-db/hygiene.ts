/**
 * A host's hygiene, one bounded pass at a time (the `host-hygiene` cron job): what no request
 * repairs by itself.
 *
 * - Ownership (issue 24): a tenant database its tenant role owned (provisioned before Lessor's
 *   admin owned every tenant database) is taken over by the admin, its owner-set flags cleared, and
 *   the tenant given back what it needs to own its objects. The state lives in Postgres (who owns
 *   the database, whether the tenant holds CREATE on it: the last grant of the move), so a pass
 *   killed at any statement is finished by the next one.
 * - Prepared transactions: one a tenant left (its connection died between `PREPARE TRANSACTION` and
 *   Lessor's rollback) holds its locks and pins the horizon forever; older than a bound, it is rolled
 *   back through the admin role.
 *
 * Only databases the catalog says are tenants' on this host are touched.
 */
import { and, eq, inArray, ne } from "drizzle-orm";
import type { DatabaseHost, LessorConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { tenants } from "../control-plane/schema.ts";
import { tenantObjectNamePattern } from "../core/names.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { openTenantDatabase, rollBackAllPreparedTransactions, takeDatabaseOwnership } from "./host-admin.ts";
import { withAdminConnection, withMaintenanceSlot } from "./maintenance.ts";

/** Databases one pass moves, or clears of prepared transactions, at most. */
export const hygieneBatch = 10;

/** The bound of one hygiene pass, and of its maintenance slot: inside the cron job's own 45 s. */
export const hygieneDeadlineMs = 40_000;
/** A prepared transaction younger than this may still be on its way to Lessor's own rollback. */
export const preparedTransactionGraceMs = 60_000;

export interface HygieneReport {
  /** Tenant databases moved to the admin's ownership (or finished moving) in this pass. */
  moved: number;
  /** Prepared transactions rolled back. */
  preparedRolledBack: number;
  /** Databases that could not be handled this pass (retried on the next). */
  failed: number;
}

interface Candidate {
  database: string;
  role: string;
}

/** Tenant-named databases that need their ownership moved, and those with stale prepared transactions. */
const candidatesSql = `
SELECT d.datname AS database, 'move' AS need
  FROM pg_catalog.pg_database d
 WHERE d.datname OPERATOR(pg_catalog.~) $1::pg_catalog.text
   AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) d.datname)
   AND (-- its tenant owns it
        pg_catalog.pg_get_userbyid(d.datdba) OPERATOR(pg_catalog.=) d.datname
        -- or this admin does, and the move did not finish
        OR (pg_catalog.pg_has_role(d.datdba, 'USAGE')
            AND (NOT pg_catalog.has_database_privilege(d.datname::pg_catalog.text, d.oid, 'CREATE')
                 OR d.datistemplate OR NOT d.datallowconn)))
UNION ALL
SELECT DISTINCT x.database::pg_catalog.text, 'prepared'
  FROM pg_catalog.pg_prepared_xacts x
 WHERE x.database OPERATOR(pg_catalog.~) $1::pg_catalog.text
   AND x.prepared OPERATOR(pg_catalog.<)
       (pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => $2::pg_catalog.float8))`;

/** One pass of hygiene on `host`, within one maintenance slot, on pinned admin connections. */
export async function hostHygiene(
  env: Env,
  config: LessorConfig,
  host: DatabaseHost,
  graceMs: number = preparedTransactionGraceMs,
): Promise<HygieneReport> {
  const report: HygieneReport = { moved: 0, preparedRolledBack: 0, failed: 0 };
  // Held for no longer than the cron job that runs it may live (45 s): a tick killed mid-pass gives
  // its slot back then, not five minutes later (the chaos soak: with a reserve of 2, a dead hygiene
  // slot held every create and migration of the host off for minutes; issue 32).
  const slot = { purpose: "hygiene", tenantId: null, deadlineMs: hygieneDeadlineMs };
  await withMaintenanceSlot(env, config, host.name, slot, async (knownReport) => {
    const found = await withAdminConnection(
      env,
      config,
      host,
      { purpose: "hygiene", knownReport },
      async (admin) => {
        const { rows } = await admin.query(candidatesSql, [tenantObjectNamePattern.source, graceMs / 1_000]);
        return rows as { database: string; need: "move" | "prepared" }[];
      },
    );
    if (found.length === 0) return;
    // Only what the catalog places on this host, and is not being erased (the erase does its own).
    const names = [...new Set(found.map((row) => row.database))];
    const owned = await withControlPlane(config, env, host.region, (db) =>
      db
        .select({ database: tenants.databaseName, role: tenants.roleName })
        .from(tenants)
        .where(
          and(
            eq(tenants.host, host.name),
            inArray(tenants.databaseName, names),
            ne(tenants.status, "erasing"),
          ),
        ),
    );
    const tenantOf = new Map<string, Candidate>(owned.map((t) => [t.database, t]));
    const connect = <T>(database: string | undefined, work: Parameters<typeof withAdminConnection<T>>[4]) =>
      withAdminConnection(
        env,
        config,
        host,
        { purpose: "hygiene", knownReport, ...(database ? { database } : {}) },
        work,
      );

    // Work left when half the pass's bound is spent waits for the next pass (a minute later).
    const stopAt = Date.now() + hygieneDeadlineMs / 2;
    for (const row of found.filter((r) => r.need === "move").slice(0, hygieneBatch)) {
      if (Date.now() >= stopAt) break;
      const tenant = tenantOf.get(row.database);
      if (!tenant) continue;
      try {
        await connect(undefined, (admin) => takeDatabaseOwnership(admin, tenant.database, tenant.role));
        // The tenant's rights in its database come back last: holding CREATE marks the move done.
        await connect(tenant.database, (admin) => openTenantDatabase(admin, tenant.database, tenant.role));
        report.moved++;
        logEvent("warn", "tenant_database_taken_over", { host: host.name, database: tenant.database });
      } catch (error) {
        report.failed++;
        logEvent("warn", "tenant_database_takeover_failed", {
          host: host.name,
          failure: describeFailure(error),
        });
      }
    }
    for (const row of found.filter((r) => r.need === "prepared").slice(0, hygieneBatch)) {
      if (Date.now() >= stopAt) break;
      const tenant = tenantOf.get(row.database);
      if (!tenant) continue;
      try {
        report.preparedRolledBack += await connect(tenant.database, rollBackAllPreparedTransactions);
      } catch (error) {
        report.failed++;
        logEvent("warn", "prepared_transaction_rollback_failed", {
          host: host.name,
          failure: describeFailure(error),
        });
      }
    }
  });
  return report;
}
