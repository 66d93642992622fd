/**
 * A schema migration of the tenant's database, run under the object: the tenant enters
 * `migrating` (new leases wait, bounded, then get `tenant_migrating`; the pool is never evicted),
 * held leases get up to `drainTimeoutMs` to finish (else the migration is skipped), and the
 * migrator applies each pending step in a transaction of its own under its advisory lock.
 */
import { eq, sql } from "drizzle-orm";
import { type ControlPlane, withControlPlane } from "../control-plane/index.ts";
import { tenants } from "../control-plane/schema.ts";
import { migrationFinished, migrationStarted } from "../core/lifecycle.ts";
import { postgresErrorBody } from "../core/neon-protocol.ts";
import { isTransientFailure } from "../core/transient.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { tenantMigrations } from "../migrations/tenant.gen.ts";
import { DeadlineExceeded } from "../postgres/index.ts";
import type { MigrateOutcome, TenantRecord } from "../rpc/tenant.ts";
import { requireTenantScope, withTenantScope } from "../tenant-context/index.ts";
import { MigrationError, migrateTenantDatabase, readSchemaVersion } from "../tenant-db/migrator.ts";
import type { TenantAuth } from "./auth.ts";
import type { TenantPool } from "./pool/index.ts";
import type { TenantRuntime } from "./runtime.ts";

export class SchemaMigration {
  private running: Promise<void> | null = null;

  constructor(
    private readonly rt: TenantRuntime,
    private readonly auth: TenantAuth,
    private readonly pool: TenantPool,
  ) {}

  /** Settles when the running migration ends; null when none runs. */
  get done(): Promise<void> | null {
    return this.running;
  }

  async migrate(tenantId: string, targetVersion: number, drainTimeoutMs: number): Promise<MigrateOutcome> {
    const rt = this.rt;
    let record: TenantRecord | null;
    try {
      record = await this.auth.resolve(tenantId);
    } catch (error) {
      // The lookup failed, not the tenant: a later tick tries again (docs/scaling.md, defect 3).
      logEvent("warn", "migration_lookup_failed", { tenant: tenantId, failure: describeFailure(error) });
      return { outcome: "skipped", reason: "control_plane_unavailable" };
    }
    if (!record) return { outcome: "skipped", reason: "tenant_unknown" };
    if (rt.erasing) return { outcome: "skipped", reason: "tenant_erasing" };
    if (rt.lifecycle.migrating) return { outcome: "skipped", reason: "already_migrating" };
    let finish: () => void = () => undefined;
    this.running = new Promise<void>((resolve) => {
      finish = resolve;
    });
    rt.apply(migrationStarted(rt.lifecycle), "migration_started");
    let reached: number | null = null;
    try {
      await this.pool.reportToBudget();
      if (!(await this.pool.waitForNoLeases(drainTimeoutMs))) {
        return { outcome: "skipped", reason: "leases_held", leases: this.pool.leases };
      }
      const run = await withTenantScope(
        { tenantId, generation: rt.lifecycle.generation, leaseId: "migrate" },
        () =>
          this.pool.opener.withDedicatedConnection(record, "migrate", async (client) => {
            requireTenantScope(tenantId);
            try {
              return await migrateTenantDatabase(client, tenantMigrations, targetVersion);
            } catch (error) {
              // Earlier steps may have applied: remember the version the database really reached.
              reached = await readSchemaVersion(client).catch(() => null);
              throw error;
            }
          }),
      );
      // The tenant's database is the truth: what it reached is reported, whatever the catalog does.
      await this.recordSchemaVersion(record, run.toVersion);
      return { outcome: "migrated", ...run };
    } catch (error) {
      if (error instanceof LessorError && error.code === "maintenance_busy") {
        // No maintenance connection free on the host: deferred, not failed.
        return { outcome: "skipped", reason: "maintenance_busy" };
      }
      const version = error instanceof MigrationError ? error.version : null;
      const cause = error instanceof MigrationError ? error.cause : error;
      if (!(cause instanceof DeadlineExceeded) && isTransientFailure(cause)) {
        // Not the migration's fault (a killed backend, a restarted host, a cut network): its step
        // rolled back, and the campaign runs it again after a backoff. Steps that committed are in
        // the database's own ledger, so nothing is applied twice.
        logEvent("warn", "tenant_migration_interrupted", {
          tenant: tenantId,
          version,
          failure: describeFailure(cause),
        });
        if (reached !== null && reached !== record.schemaVersion) {
          await this.recordSchemaVersion(record, reached).catch(() => undefined);
        }
        return { outcome: "skipped", reason: "interrupted" };
      }
      const summary =
        cause instanceof DeadlineExceeded
          ? `migration ${cause.message} (LESSOR_MIGRATION_TIMEOUT_MS); its step rolled back`
          : `${error instanceof Error ? error.message : "migration failed"}${
              postgresErrorBody(cause) ? `: ${describeFailure(cause)}` : ""
            }`;
      logEvent("warn", "tenant_migration_failed", {
        tenant: tenantId,
        version,
        failure: describeFailure(cause),
      });
      if (reached !== null && reached !== record.schemaVersion) {
        await this.recordSchemaVersion(record, reached).catch(() => undefined);
      }
      return { outcome: "failed", version, summary: summary.slice(0, 500) };
    } finally {
      rt.apply(migrationFinished(rt.lifecycle), "migration_finished");
      finish();
      this.running = null;
      await this.pool.reportToBudget().catch(() => undefined);
    }
  }

  /**
   * Records the schema version the tenant database reached: in the object first, then in the
   * catalog. A catalog write that fails (a control-plane blip) leaves the version pending; the next
   * outbox flush writes it (`flushOutboxes`), so the catalog is repaired on the next contact.
   */
  private async recordSchemaVersion(record: TenantRecord, version: number): Promise<void> {
    const rt = this.rt;
    rt.record = { ...(rt.record ?? record), schemaVersion: version };
    rt.storage.write("record", rt.record);
    rt.storage.write("pendingCatalogSchemaVersion", version);
    try {
      await withControlPlane(rt.config, rt.env, rt.region, (db) =>
        writeCatalogSchemaVersion(db, record.tenantId, version),
      );
      rt.storage.forget("pendingCatalogSchemaVersion");
    } catch (error) {
      logEvent("warn", "schema_version_catalog_write_deferred", {
        tenant: record.tenantId,
        version,
        failure: describeFailure(error),
      });
    }
  }
}

/** Raises the catalog's schema version to `version` (never lowers it: steps only go forward). */
export async function writeCatalogSchemaVersion(
  db: ControlPlane,
  tenantId: string,
  version: number,
): Promise<void> {
  await db
    .update(tenants)
    .set({ schemaVersion: sql`GREATEST(${tenants.schemaVersion}, ${version})`, updatedAt: sql`now()` })
    .where(eq(tenants.id, tenantId));
}
