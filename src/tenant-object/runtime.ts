/**
 * What every room of the TenantObject shares: the runtime handles, the tenant's record, its
 * lifecycle and its usage counters. The lifecycle changes only through `apply`, which takes a
 * state decided by core/lifecycle.ts, persists it and records the transition in the outbox, in one
 * storage transaction. Rooms never build a lifecycle by hand.
 */

import { type LessorConfig, loadConfig } from "../config/index.ts";
import { initialLifecycle, type Lifecycle } from "../core/lifecycle.ts";
import { parseTenantObjectName } from "../core/placement.ts";
import { budgetObject } from "../placement/index.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import { isZeroUsage, type UsageCounters, zeroUsage } from "../usage/index.ts";
import { Deadlines } from "./deadlines.ts";
import { AlarmSchedule } from "./kernel/alarm.ts";
import { HolderRegistry } from "./kernel/holders.ts";
import { TenantStorage } from "./storage.ts";
import type { EraseGate, MoveGate } from "./storage-schema.ts";

export type { EraseGate, MoveGate };

import { tenantHooksForTests } from "./test-hooks.ts";

/** Alarm cadence while a pool is warm: keeps the object resident, checks idleness, reports to the budget. */
export const heartbeatMs = 30_000;

/** The longest an answered request's usage waits before it is saved (one write per interval at most). */
export const usageSaveIntervalMs = 1_000;

export class TenantRuntime {
  private readonly loadedConfig: LessorConfig;
  readonly storage: TenantStorage;
  lifecycle: Lifecycle = initialLifecycle;
  record: TenantRecord | null = null;
  pinned = false;
  /**
   * Usage since the last stage into the durable usage outbox (the alarm stages it). Saved to storage
   * at most once per `usageSaveIntervalMs` after it changes (`noteUsage`), never per request: an
   * object killed between two heartbeats loses at most that interval's counts.
   */
  usage: UsageCounters = { ...zeroUsage };
  /** What storage holds under the unstaged-usage key, as JSON: a save that changes nothing writes nothing. */
  private savedUsage = JSON.stringify(zeroUsage);
  /** The save `noteUsage` scheduled, if one is pending. */
  private usageSave: ReturnType<typeof setTimeout> | null = null;
  /** Session leases reclaimed because their owner went away (for status). */
  reclaimedLeases = 0;
  /**
   * The object restarted while a generation was live: that generation's backends may still run.
   * The next start ends them before it serves (persisted, so a second restart still fences).
   */
  fencePending = false;
  /**
   * Maintenance slots this instance holds (its migrations' dedicated connections). In memory on
   * purpose: a killed instance's slots are unknown to the next one, so the budget reconcile frees them.
   */
  readonly maintenanceHeld = new Set<string>();
  /** Minute (epoch ms, floored) each key was last used in, not yet written to the catalog. */
  readonly keyUses = new Map<string, number>();
  /** The statements' deadlines, with at most one timer armed (deadlines.ts). */
  readonly deadlines = new Deadlines();
  /** Every holder of the tenant: flights, session leases, wire connections (kernel/holders.ts). */
  readonly holders = new HolderRegistry();
  /** The object's one alarm: the only caller of `setAlarm` (kernel/alarm.ts). */
  readonly alarms: AlarmSchedule;
  /** Set once an erase of this tenant started; null otherwise. */
  erase: EraseGate | null = null;
  /** Set once a move of this tenant to another region started; null otherwise. */
  move: MoveGate | null = null;

  /** Whether a move holds the fence closed: nothing new may start here. */
  get moving(): boolean {
    return this.move?.state === "moving";
  }

  /** Whether an erase holds the gate closed: nothing new may start. */
  get erasing(): boolean {
    return this.erase?.state === "erasing";
  }

  /**
   * The region this object serves its tenant in, from the object's own name (src/core/placement.ts):
   * it reads and writes only this region's control plane (docs/adr/023-regions.md).
   */
  readonly region: string;

  constructor(
    readonly ctx: DurableObjectState,
    readonly env: Env,
  ) {
    this.loadedConfig = loadConfig(env);
    this.storage = new TenantStorage(ctx.storage);
    this.alarms = new AlarmSchedule(ctx.storage);
    const named = ctx.id.name === undefined ? null : parseTenantObjectName(ctx.id.name).region;
    this.region = named ?? this.loadedConfig.defaultRegion;
  }

  /** The deployment's configuration (with a test's settings for this tenant: test-hooks.ts). */
  get config(): LessorConfig {
    const overrides = tenantHooksForTests.config?.(this.tenantId);
    return overrides ? { ...this.loadedConfig, ...overrides } : this.loadedConfig;
  }

  /** The tenant id, for logs: empty while the object does not know its tenant. */
  get tenantId(): string {
    return this.record?.tenantId ?? "";
  }

  /** The state an event names: `migrating` overlays the pool state. */
  private static stateName(lc: Lifecycle): string {
    return lc.migrating ? "migrating" : lc.state;
  }

  /**
   * Moves to `next` (decided by core/lifecycle.ts): persists it and appends the transition to the
   * outbox, in one storage transaction. A decision that changes nothing records nothing.
   */
  apply(next: Lifecycle, reason: string): void {
    const previous = this.lifecycle;
    if (next === previous) return;
    this.lifecycle = next;
    this.storage.transaction(() => {
      this.storage.write("lifecycle", next);
      const from = TenantRuntime.stateName(previous);
      const to = TenantRuntime.stateName(next);
      if (from !== to || previous.generation !== next.generation) {
        this.storage.appendEvent(next.generation, from, to, reason);
      }
    });
  }

  /**
   * Deletes the object's storage and its memory of the tenant with it (an erase's `object` stage):
   * record, lifecycle, pin, usage, key uses. The only change of the lifecycle outside `apply`, and
   * it records nothing: there is no storage left to record in. The gates stay, in memory.
   */
  async wipe(): Promise<void> {
    await this.ctx.storage.deleteAll();
    this.storage.forgetTables();
    this.record = null;
    this.lifecycle = initialLifecycle;
    this.pinned = false;
    this.fencePending = false;
    this.discardUsage();
    this.keyUses.clear();
  }

  /** Appends an event that is not a transition (an overdue drain, say). */
  note(reason: string): void {
    const state = TenantRuntime.stateName(this.lifecycle);
    this.storage.appendEvent(this.lifecycle.generation, state, state, reason);
  }

  /** Notes that `keyId` was used now (the catalog keeps last use to the minute). */
  noteKeyUse(keyId: string): void {
    this.keyUses.set(keyId, Math.floor(Date.now() / 60_000) * 60_000);
  }

  /**
   * Usage changed (a request was counted): it is saved within `usageSaveIntervalMs`, off the request
   * path, in one write however many requests it covers (Durable Object storage bills each row
   * written, and a write on the request path holds its answer behind the output gate). An object
   * killed in between loses at most that interval's counts (docs/adr/019-usage-saved-in-batches.md).
   */
  noteUsage(): void {
    if (this.usageSave !== null) return;
    this.usageSave = setTimeout(() => {
      this.usageSave = null;
      this.saveUsage();
    }, usageSaveIntervalMs);
  }

  /**
   * Saves the usage counted since the last stage, now (the heartbeat, and `noteUsage`'s timer). The
   * next instance restores it (`restoreUsage`) and its heartbeat flushes it.
   */
  saveUsage(): void {
    if (this.usageSave !== null) {
      clearTimeout(this.usageSave);
      this.usageSave = null;
    }
    if (!this.storage.isOpen) return;
    const now = JSON.stringify(this.usage);
    if (now === this.savedUsage) return;
    this.storage.write("usage", this.usage);
    this.savedUsage = now;
    tenantHooksForTests.onUsageSaved?.(this.tenantId, this.usage.queries);
  }

  /** Loads the usage a previous instance saved but did not stage; whether there is any. */
  restoreUsage(): boolean {
    const saved = this.storage.read("usage");
    if (!saved) return false;
    this.usage = { ...zeroUsage, ...saved };
    this.savedUsage = JSON.stringify(this.usage);
    return !isZeroUsage(this.usage);
  }

  /**
   * Moves the usage counted so far into the durable usage outbox, clearing the saved counts in the
   * same storage transaction: a kill between the two can neither lose nor double any of it.
   */
  stageUsage(): void {
    if (isZeroUsage(this.usage) || !this.storage.isOpen) return;
    const counters = this.usage;
    this.storage.transaction(() => {
      this.storage.stageUsage(counters);
      this.storage.write("usage", zeroUsage);
    });
    this.usage = { ...zeroUsage };
    this.savedUsage = JSON.stringify(zeroUsage);
  }

  /** Forgets the usage counted and not yet staged (an erase: it is the tenant's, and goes with it). */
  discardUsage(): void {
    this.usage = { ...zeroUsage };
    if (this.storage.isOpen) this.storage.write("usage", zeroUsage);
    this.savedUsage = JSON.stringify(zeroUsage);
  }

  /** Records that a dead generation must be fenced before the next one serves. */
  requireFence(): void {
    this.fencePending = true;
    this.storage.write("fence", true);
  }

  clearFence(): void {
    this.fencePending = false;
    this.storage.write("fence", false);
  }

  /** The BudgetObject of a database host. */
  budget(host: string) {
    return budgetObject(this.env, host);
  }
}
