/**
 * A host's own periodic work, in its BudgetObject's alarm (docs/adr/028-a-fleet-that-sleeps.md):
 * the ledger reconcile (its tenants' objects, never the host) every minute while it has pools or
 * maintenance holders; the host work (orphaned backends, hygiene, the capability probe: the only
 * queries to the host outside a pool) when something happened that it must look at, or at its slow
 * visit. A host with no pool and nothing to look at hears nothing from Lessor until that visit, so
 * its Neon compute can suspend. Schedule decisions are pure (core/sweep.ts); the state they read is
 * kept here, in the object's key-value storage, so a restarted object keeps its schedule.
 */
import { loadConfig } from "../config/index.ts";
import {
  type HostSweepState,
  hostSweepJitterMs,
  hostWorkDue,
  type LookAtReason,
  ledgerReconcileEveryMs,
  nextHostAlarmAt,
} from "../core/sweep.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { hostHygiene } from "../tenant-db/hygiene.ts";
import { reapOrphanBackends } from "../tenant-db/orphans.ts";
import { budgetHooksForTests } from "./test-hooks.ts";

const keys = {
  host: "sweep:host",
  lookAt: "sweep:look-at",
  visited: "sweep:visited-at",
  failures: "sweep:failures",
} as const;

/**
 * After a visit that failed, the next try waits a minute, doubling to the sweep's length: a host
 * that cannot be reached, or whose admin lacks what Lessor needs, is not asked every minute.
 */
export function retryDelayMs(failures: number, sweepMs: number): number {
  return Math.min(sweepMs, ledgerReconcileEveryMs * 2 ** Math.max(0, Math.min(20, failures - 1)));
}

/** What one alarm did (the log line, and what tests read through the hook). */
export interface SweepRun {
  host: string;
  reconciled: { checked: number; released: number; maintenanceExpired: number } | null;
  visited: boolean;
  orphansTerminated: number;
  hygiene: { moved: number; preparedRolledBack: number; failed: number } | null;
  failed: string[];
  /** When a failed visit is tried again (null: it did not fail). */
  retryAt: number | null;
  nextAt: number;
}

/** The BudgetObject's side of the sweep: what it is asked to do, and what it counts. */
export interface SweepOwner {
  /** Allocations and maintenance holders in the ledger now. */
  holders(): number;
  reconcile(host: string): Promise<{ checked: number; released: number; maintenanceExpired: number }>;
  recordReconcile(orphansTerminated: number): Promise<void>;
}

export class HostSweep {
  constructor(
    private readonly storage: DurableObjectStorage,
    private readonly env: Env,
    private readonly owner: SweepOwner,
  ) {}

  /** The host this object is for, once a call named it. */
  host(): string | null {
    return (this.storage.kv.get(keys.host) as string | undefined) ?? null;
  }

  private state(host: string): HostSweepState {
    const sweepMs = loadConfig(this.env).sweepMinutes * 60_000;
    return {
      allocations: this.owner.holders(),
      lookAt: (this.storage.kv.get(keys.lookAt) as string[] | undefined) ?? [],
      lastHostVisitAt: (this.storage.kv.get(keys.visited) as number | undefined) ?? null,
      jitterMs: hostSweepJitterMs(host, sweepMs),
    };
  }

  /**
   * Makes sure the object has an alarm (the cron's slow visit, a start, a maintenance slot call
   * this): none is set when the object was never told its host, or its last alarm ended with a
   * failure before it set the next one. Never brings an alarm closer than its schedule says, unless
   * the object has holders now (then within a minute).
   */
  async ensureAlarm(host: string): Promise<number> {
    if (this.host() !== host) this.storage.kv.put(keys.host, host);
    if (budgetHooksForTests.sweep === "off") return 0;
    const sweepMs = loadConfig(this.env).sweepMinutes * 60_000;
    const wanted = nextHostAlarmAt(this.state(host), Date.now(), sweepMs);
    const current = await this.storage.getAlarm();
    if (current === null || current > wanted) await this.storage.setAlarm(wanted);
    return current === null || current > wanted ? wanted : current;
  }

  /** Something happened on the host that it should be looked at for, at the next alarm (within a minute). */
  async lookAt(host: string, reason: LookAtReason): Promise<void> {
    const now = (this.storage.kv.get(keys.lookAt) as string[] | undefined) ?? [];
    if (!now.includes(reason)) this.storage.kv.put(keys.lookAt, [...now, reason]);
    await this.ensureAlarm(host);
  }

  /** The alarm: what is due now, then the next alarm. Never throws (a failure is retried in a minute). */
  async run(): Promise<SweepRun | null> {
    const host = this.host();
    if (host === null || budgetHooksForTests.sweep === "off") return null;
    const config = loadConfig(this.env);
    const sweepMs = config.sweepMinutes * 60_000;
    const due = hostWorkDue(this.state(host), Date.now(), sweepMs);
    const run: SweepRun = {
      host,
      reconciled: null,
      visited: false,
      orphansTerminated: 0,
      hygiene: null,
      failed: [],
      retryAt: null,
      nextAt: 0,
    };
    // The ledger: its tenants' objects answer, the host is not asked. Maintenance holders count too.
    if (due.ledger || due.host) {
      try {
        run.reconciled = await this.owner.reconcile(host);
      } catch (error) {
        run.failed.push(`reconcile: ${describeFailure(error)}`);
      }
    }
    const dbHost = config.hosts.get(host);
    if (due.host) {
      let ok = true;
      // A tunnel's server is the customer's: Lessor has no admin there, only the ledger.
      if (dbHost) {
        try {
          const orphans = await reapOrphanBackends(this.env, config, dbHost);
          run.orphansTerminated = orphans.terminated;
          if (orphans.terminated > 0) await this.owner.recordReconcile(orphans.terminated);
        } catch (error) {
          ok = false;
          run.failed.push(`orphans: ${describeFailure(error)}`);
        }
        try {
          run.hygiene = await hostHygiene(this.env, config, dbHost);
          if (run.hygiene.failed > 0) ok = false;
        } catch (error) {
          ok = false;
          run.failed.push(`hygiene: ${describeFailure(error)}`);
        }
      }
      run.visited = true;
      // A visit that failed keeps its reasons, so it is tried again, later each time.
      if (ok) {
        this.storage.kv.delete(keys.lookAt);
        this.storage.kv.delete(keys.failures);
        this.storage.kv.put(keys.visited, Date.now());
      } else {
        const failures = ((this.storage.kv.get(keys.failures) as number | undefined) ?? 0) + 1;
        this.storage.kv.put(keys.failures, failures);
        run.retryAt = Date.now() + retryDelayMs(failures, sweepMs);
      }
    }
    run.nextAt = nextHostAlarmAt(this.state(host), Date.now(), sweepMs);
    // A failed visit: its retry (the ledger still every minute while there are pools).
    if (run.retryAt !== null)
      run.nextAt =
        this.owner.holders() > 0 ? Math.min(run.nextAt, Date.now() + ledgerReconcileEveryMs) : run.retryAt;
    await this.storage.setAlarm(run.nextAt);
    const changed =
      (run.reconciled?.released ?? 0) +
      (run.reconciled?.maintenanceExpired ?? 0) +
      run.orphansTerminated +
      (run.hygiene ? run.hygiene.moved + run.hygiene.preparedRolledBack : 0);
    if (changed > 0 || run.failed.length > 0) {
      logEvent(run.failed.length > 0 || changed > 0 ? "warn" : "info", "host_sweep", {
        host,
        visited: run.visited,
        released: run.reconciled?.released ?? 0,
        maintenanceExpired: run.reconciled?.maintenanceExpired ?? 0,
        orphansTerminated: run.orphansTerminated,
        moved: run.hygiene?.moved ?? 0,
        preparedRolledBack: run.hygiene?.preparedRolledBack ?? 0,
        failed: run.failed,
        nextAt: new Date(run.nextAt).toISOString(),
      });
    }
    budgetHooksForTests.onSweep?.(run);
    return run;
  }
}
