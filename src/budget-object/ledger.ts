/**
 * The BudgetObject's ledger in its own SQLite storage (storage-schema.ts, drizzle migrations in
 * drizzle/budget-object/): one row per pool generation holding capacity on the host, and counters.
 */
import { and, eq, lte, sql } from "drizzle-orm";
import { type DrizzleSqliteDODatabase, drizzle } from "drizzle-orm/durable-sqlite";
import { migrate } from "drizzle-orm/durable-sqlite/migrator";
import type { Allocation, AllocationPhase } from "../core/budget.ts";
import type { HostReport } from "../core/host-capabilities.ts";
import { budgetObjectMigrations } from "../migrations/budget-object.gen.ts";
import type { PoolReport, RepairKind } from "../rpc/budget.ts";
import {
  allocations,
  budgetObjectSchema,
  closedTenants,
  counters,
  hostReports,
  maintenance,
} from "./storage-schema.ts";

/** An allocation as stored, with when it last changed (reconcile looks only at quiet ones). */
export interface LedgerRow extends Allocation {
  updatedAt: number;
}

/** Monotonic counters: pools evicted, starts refused for want of capacity, starts granted. */
export type CounterName =
  | "evictions"
  | "saturations"
  | "admissions"
  | "maintenance_granted"
  | "maintenance_refused"
  | "maintenance_expired"
  | "allocations_released"
  | "orphans_terminated"
  | "rotations_admitted"
  | "rotations_refused"
  | "growths"
  | "growths_refused"
  | "shrinks"
  | "reclaim_shrinks"
  /** A tunnel's failed connects (slow: timed out; down: refused or cut), and starts its breaker refused. */
  | "tunnel_slow"
  | "tunnel_down"
  | "tunnel_refused"
  | RepairKind;

/** A maintenance connection's slot of the reserve. */
export interface MaintenanceRow {
  id: string;
  purpose: string;
  tenantId: string | null;
  acquiredAt: number;
  expiresAt: number;
}

export class CapacityLedger {
  private constructor(private readonly db: DrizzleSqliteDODatabase<typeof budgetObjectSchema>) {}

  /** Opens the ledger, creating or upgrading its tables. */
  static async open(storage: DurableObjectStorage): Promise<CapacityLedger> {
    const db = drizzle(storage, { schema: budgetObjectSchema });
    await migrate(db, budgetObjectMigrations);
    return new CapacityLedger(db);
  }

  rows(): LedgerRow[] {
    return this.db
      .select()
      .from(allocations)
      .all()
      .map((row) => ({
        tenantId: row.tenantId,
        generation: row.generation,
        size: row.size,
        phase: row.phase,
        idleSince: row.idleSince,
        leases: row.leases,
        pinned: row.pinned === 1,
        migrating: row.migrating === 1,
        updatedAt: row.updatedAt,
        floor: row.floor,
        startSize: row.startSize ?? row.size,
        recentPeak: row.recentPeak,
      }));
  }

  find(tenantId: string, generation: number): LedgerRow | undefined {
    return this.rows().find((a) => a.tenantId === tenantId && a.generation === generation);
  }

  /** Records a starting pool's reservation; `floor` for an adaptive pool, null for a fixed one. */
  reserve(tenantId: string, generation: number, size: number, floor: number | null = null): void {
    this.db
      .insert(allocations)
      .values({
        tenantId,
        generation,
        size,
        phase: "reserved",
        updatedAt: Date.now(),
        floor,
        startSize: size,
      })
      .run();
  }

  /**
   * Moves a pool's allowance by `delta` connections (a growth admitted: positive; connections given
   * back: negative), never below zero. Relative on purpose: a growth granted while a shrink of the
   * same pool is answered adds up in either order, so the ledger never holds less than the pool.
   */
  resize(tenantId: string, generation: number, delta: number): void {
    this.db
      .update(allocations)
      .set({ size: sql`max(0, ${allocations.size} + ${delta})`, updatedAt: Date.now() })
      .where(and(eq(allocations.tenantId, tenantId), eq(allocations.generation, generation)))
      .run();
  }

  setPhase(tenantId: string, generation: number, phase: AllocationPhase, report: PoolReport | null): void {
    const facts = report
      ? {
          leases: report.leases,
          idleSince: report.idleSince,
          pinned: report.pinned ? 1 : 0,
          migrating: report.migrating ? 1 : 0,
          ...(report.recentPeak === undefined ? {} : { recentPeak: report.recentPeak }),
        }
      : {};
    this.db
      .update(allocations)
      .set({ phase, ...facts, updatedAt: Date.now() })
      .where(and(eq(allocations.tenantId, tenantId), eq(allocations.generation, generation)))
      .run();
  }

  remove(tenantId: string, generation: number): void {
    this.db
      .delete(allocations)
      .where(and(eq(allocations.tenantId, tenantId), eq(allocations.generation, generation)))
      .run();
  }

  /** Removes every allocation of a tenant, whatever its generation; says how many there were. */
  removeTenant(tenantId: string): number {
    return this.db
      .delete(allocations)
      .where(eq(allocations.tenantId, tenantId))
      .returning({ generation: allocations.generation })
      .all().length;
  }

  isClosed(tenantId: string): boolean {
    return (
      this.db
        .select({ tenantId: closedTenants.tenantId })
        .from(closedTenants)
        .where(eq(closedTenants.tenantId, tenantId))
        .get() !== undefined
    );
  }

  close(tenantId: string): void {
    this.db.insert(closedTenants).values({ tenantId, closedAt: Date.now() }).onConflictDoNothing().run();
  }

  /** Reopens a tenant; says whether it was closed. */
  reopen(tenantId: string): boolean {
    return (
      this.db
        .delete(closedTenants)
        .where(eq(closedTenants.tenantId, tenantId))
        .returning({ tenantId: closedTenants.tenantId })
        .all().length > 0
    );
  }

  maintenanceRows(): MaintenanceRow[] {
    return this.db.select().from(maintenance).all();
  }

  holdMaintenance(row: MaintenanceRow): void {
    this.db.insert(maintenance).values(row).run();
  }

  /** Frees a maintenance slot; true if it was held. */
  releaseMaintenance(id: string): boolean {
    return this.db.delete(maintenance).where(eq(maintenance.id, id)).returning().all().length > 0;
  }

  /** Moves a held slot's expiry to `expiresAt`: the slot's purpose, or null if it is no longer held. */
  renewMaintenance(id: string, expiresAt: number): string | null {
    const [row] = this.db
      .update(maintenance)
      .set({ expiresAt })
      .where(eq(maintenance.id, id))
      .returning()
      .all();
    return row?.purpose ?? null;
  }

  /** Frees the slots whose holders outlived their deadline (they died): how many. */
  expireMaintenance(now: number): number {
    return this.db.delete(maintenance).where(lte(maintenance.expiresAt, now)).returning().all().length;
  }

  hostReport(host: string): HostReport | null {
    const row = this.db.select().from(hostReports).where(eq(hostReports.host, host)).get();
    return row ? (JSON.parse(row.report) as HostReport) : null;
  }

  recordHostReport(host: string, report: HostReport): void {
    const values = { host, report: JSON.stringify(report), probedAt: report.probedAt };
    this.db
      .insert(hostReports)
      .values(values)
      .onConflictDoUpdate({ target: hostReports.host, set: values })
      .run();
  }

  counter(name: CounterName): number {
    return (
      this.db.select({ value: counters.value }).from(counters).where(eq(counters.name, name)).get()?.value ??
      0
    );
  }

  bump(name: CounterName, by = 1): void {
    this.db
      .insert(counters)
      .values({ name, value: by })
      .onConflictDoUpdate({ target: counters.name, set: { value: sql`${counters.value} + ${by}` } })
      .run();
  }
}
