/**
 * The host's maintenance reserve, a room of the BudgetObject: one slot per connection Lessor opens
 * outside a pool (migrations, creates, admin statements), granted FIFO within the host's `reserve`
 * with a bounded wait, held until released or until its holder's deadline passes (a dead holder's
 * slot comes back then, or sooner once the reconcile learns that a killed object no longer holds
 * it). Pools never use the reserve and maintenance never uses the pools' share, so the two together
 * never exceed the host's connections. The slots live in the ledger, so they survive a restart.
 */
import type { BudgetSubject } from "../config/index.ts";
import { maintenanceFits } from "../core/budget.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { tenantObjectOnHost } from "../placement/index.ts";
import type { CapacityStatus, MaintenanceGrant, MaintenanceRequest } from "../rpc/budget.ts";
import type { CapacityLedger } from "./ledger.ts";
import { budgetHooksForTests } from "./test-hooks.ts";
import { WaitQueue } from "./wait-queue.ts";

export class MaintenanceSlots {
  private waiters: WaitQueue<MaintenanceRequest, MaintenanceGrant>;
  private expiryTimer: ReturnType<typeof setTimeout> | null = null;
  private expiryAt = 0;

  constructor(
    private readonly env: Env,
    private readonly ledger: () => CapacityLedger,
    maxWaiters: number,
  ) {
    this.waiters = new WaitQueue(maxWaiters);
  }

  /** A slot now if the reserve has room and nobody waits; else waits up to `waitMs` in FIFO order. */
  acquire(
    host: Pick<BudgetSubject, "budget">,
    request: MaintenanceRequest,
  ): Promise<MaintenanceGrant> | MaintenanceGrant {
    this.expire();
    if (this.waiters.length === 0 && maintenanceFits(this.ledger().maintenanceRows().length, host.budget)) {
      return this.grant(request);
    }
    if (request.waitMs <= 0 || this.waiters.full) {
      this.ledger().bump("maintenance_refused");
      return { granted: false, retryAfterMs: 1_000 };
    }
    const grant = this.waiters.wait(request, request.waitMs, () => {
      this.ledger().bump("maintenance_refused");
      return { granted: false, retryAfterMs: 1_000 };
    });
    this.scheduleExpiry(host);
    return grant;
  }

  /**
   * The holder is alive: its slot now expires `holdMs` from now. False if the slot is gone (it
   * expired: the holder was presumed dead).
   */
  renew(leaseId: string, holdMs: number): boolean {
    const purpose = this.ledger().renewMaintenance(leaseId, Date.now() + holdMs);
    budgetHooksForTests.onMaintenanceRenewed?.(leaseId, purpose !== null, purpose);
    return purpose !== null;
  }

  /** The slot's connection is closed. Idempotent. */
  release(host: Pick<BudgetSubject, "budget">, leaseId: string): void {
    this.ledger().releaseMaintenance(leaseId);
    this.serve(host);
  }

  /** For the reconcile: frees expired slots and those a killed migration left; says how many. */
  async reclaim(host: Pick<BudgetSubject, "budget" | "name">, cutoff: number): Promise<number> {
    const freed = this.expire() + (await this.reclaimMigrationSlots(host.name, cutoff));
    this.serve(host);
    return freed;
  }

  status(): CapacityStatus["maintenance"] {
    const rows = this.ledger()
      .maintenanceRows()
      .filter((row) => row.expiresAt > Date.now());
    const byPurpose: Record<string, number> = {};
    for (const row of rows) byPurpose[row.purpose] = (byPurpose[row.purpose] ?? 0) + 1;
    return { inUse: rows.length, waiting: this.waiters.length, byPurpose };
  }

  /**
   * Frees the migration slots (held by a TenantObject for up to LESSOR_MIGRATION_TIMEOUT_MS) whose
   * object no longer holds them: it was killed (a deploy, a crash) and the next instance never knew
   * them. Without this a deploy in the middle of a campaign held the host's whole reserve for ten
   * minutes: no create, erase or orphan reaping meanwhile. A migration's connection dies with its
   * object; its last statement may still finish on the host, then its transaction rolls back.
   * Slots granted after `cutoff` are left alone (their holder may not have noted them yet).
   */
  private async reclaimMigrationSlots(hostName: string, cutoff: number): Promise<number> {
    let reclaimed = 0;
    for (const row of this.ledger().maintenanceRows()) {
      if (row.purpose !== "migrate" || row.tenantId === null || row.acquiredAt >= cutoff) continue;
      let held = true;
      try {
        held = await tenantObjectOnHost(this.env, hostName, row.tenantId).holdsMaintenance(row.id);
      } catch (error) {
        logEvent("warn", "budget_reconcile_probe_failed", {
          tenant: row.tenantId,
          failure: describeFailure(error),
        });
        continue;
      }
      if (!held && this.ledger().releaseMaintenance(row.id)) {
        this.ledger().bump("maintenance_expired");
        reclaimed++;
      }
    }
    if (reclaimed > 0) logEvent("warn", "maintenance_slot_reclaimed", { reclaimed });
    return reclaimed;
  }

  private grant(request: MaintenanceRequest): MaintenanceGrant {
    const now = Date.now();
    const row = {
      id: crypto.randomUUID(),
      purpose: request.purpose,
      tenantId: request.tenantId,
      acquiredAt: now,
      expiresAt: now + request.holdMs,
    };
    this.ledger().holdMaintenance(row);
    this.ledger().bump("maintenance_granted");
    return { granted: true, leaseId: row.id, expiresAt: row.expiresAt };
  }

  /** Grants maintenance waiters in FIFO order while the reserve has room. */
  private serve(host: Pick<BudgetSubject, "budget">): void {
    this.expire();
    this.waiters.serveWhile((request) =>
      maintenanceFits(this.ledger().maintenanceRows().length, host.budget) ? this.grant(request) : null,
    );
    if (this.waiters.length > 0) this.scheduleExpiry(host);
    else if (this.expiryTimer) {
      // Nobody waits: no timer keeps the object busy.
      clearTimeout(this.expiryTimer);
      this.expiryTimer = null;
    }
  }

  /** Frees the slots of holders that outlived their deadline: they died, and so did their connections. */
  private expire(): number {
    const expired = this.ledger().expireMaintenance(Date.now());
    for (let i = 0; i < expired; i++) this.ledger().bump("maintenance_expired");
    if (expired > 0) logEvent("warn", "maintenance_slot_expired", { expired });
    return expired;
  }

  /** While someone waits, wakes up when the earliest held slot expires (its holder may be dead). */
  private scheduleExpiry(host: Pick<BudgetSubject, "budget">): void {
    const earliest = Math.min(
      ...this.ledger()
        .maintenanceRows()
        .map((row) => row.expiresAt),
    );
    if (!Number.isFinite(earliest)) return;
    // A timer already set for that moment or sooner will do; a later one is replaced.
    if (this.expiryTimer && this.expiryAt <= earliest) return;
    if (this.expiryTimer) clearTimeout(this.expiryTimer);
    this.expiryAt = earliest;
    this.expiryTimer = setTimeout(
      () => {
        this.expiryTimer = null;
        this.serve(host);
      },
      Math.max(0, earliest - Date.now()) + 10,
    );
  }
}
