/**
 * The generations a tenant's pool holds: the current one (new leases go to it), the one a rotation
 * replaced (it serves only the leases it held at the switch and stops when the last one ends,
 * docs/adr/013), and those whose connections are still closing. A generation is installed (a start)
 * or switched to (a rotation), then retired or stopped, each once; its budget allocation is released
 * only after its connections are closed. One generation's connections are generation.ts.
 */
import { beginDrain, retired, stopped } from "../../core/lifecycle.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { endPool } from "../../postgres/index.ts";
import type { TenantRecord } from "../../rpc/tenant.ts";
import type { TenantRuntime } from "../runtime.ts";
import type { TenantCredentials, UnsealedCredential } from "./credentials.ts";
import { Generation, type GenerationHost, type GenerationParts } from "./generation.ts";
import type { LeaseBook } from "./leases.ts";
import type { GenerationOpener } from "./open.ts";
import type { PoolSizing } from "./sizing.ts";
import type { StartedGeneration } from "./start.ts";

/** A generation a rotation prepared: its pool, where it points, and its end users' credential. */
export type PreparedGeneration = GenerationParts;

/** A repair the pool made to its own accounting, for the host's repair counters. */
export type PoolRepair = "lease_reclaimed" | "close_forced";

export interface GenerationsHooks {
  /** A credential change in progress, if one is. */
  credentialChange: () => Promise<unknown> | null;
  /** A retiring generation stopped: its credential's guard key may go. */
  onRetired: (generation: number) => void;
  /** The pool repaired its own accounting (counted on the host's budget, logged as an event). */
  onRepair: (repair: PoolRepair, count: number) => void;
  /** A generation began to serve: installed by a start, or switched to by a rotation. */
  onServe: (how: "start" | "switch") => void;
  /** The current generation stops serving: before its connections close. */
  onStopping: () => void;
}

/** A repair's event reaches the control plane soon rather than at the next heartbeat. */
export function flushEventsSoon(rt: TenantRuntime): void {
  rt.ctx.waitUntil(rt.alarms.wakeBy(Date.now() + 1_000).catch(() => undefined));
}

export class Generations implements GenerationHost {
  /** The generation new leases go to; null unless the lifecycle is ready or draining. */
  private live: Generation | null = null;
  /** The generation last installed (kept after it stopped: its size is the next rotation's). */
  private last: Generation | null = null;
  private replaced: Generation | null = null;
  /** Generations whose connections are still closing (their budget is not yet released). */
  private readonly closing = new Set<number>();

  constructor(
    readonly rt: TenantRuntime,
    readonly credentials: TenantCredentials,
    readonly opener: GenerationOpener,
    readonly sizing: PoolSizing,
    private readonly leaseBook: LeaseBook,
    private readonly hooks: GenerationsHooks,
  ) {}

  // GenerationHost: what a generation asks of the pool that holds it.
  current(): Generation | null {
    return this.live;
  }

  retiring(): Generation | null {
    return this.replaced;
  }

  credentialChange(): Promise<unknown> | null {
    return this.hooks.credentialChange();
  }

  onPoolError(generation: number, error: Error): void {
    // A pool that is being ended on purpose reports its closing sockets: not news.
    if (generation !== this.live?.number) return;
    // An idle pooled connection died (backend killed, database restarted). The pool replaces it on
    // the next checkout; the generation itself stays valid.
    logEvent("warn", "pool_connection_error", {
      tenant: this.rt.tenantId,
      generation,
      failure: describeFailure(error),
    });
  }

  /** The generation last installed, open or not (its number and size outlive its stop). */
  get latest(): Generation | null {
    return this.last;
  }

  /** Whether this object still holds connections (or budget) of `generation`: live, retiring, being prepared, or closing. */
  holds(generation: number): boolean {
    const lc = this.rt.lifecycle;
    const live =
      lc.generation === generation &&
      (lc.state === "starting" || lc.state === "ready" || lc.state === "draining");
    return (
      live ||
      this.closing.has(generation) ||
      this.replaced?.number === generation ||
      lc.rotatingTo === generation
    );
  }

  /** Whether a lease of `generation` may still run: the current open pool's, or the retiring one's. */
  serves(generation: number): boolean {
    return this.live?.number === generation || this.replaced?.number === generation;
  }

  /** The retiring generation and the leases it still holds (for status). */
  get retiringStatus(): { generation: number; leases: number } | null {
    return this.replaced
      ? { generation: this.replaced.number, leases: this.leaseBook.retiringSize ?? 0 }
      : null;
  }

  /** Whether `generation` is still closing its connections. */
  isClosing(generation: number): boolean {
    return this.closing.has(generation);
  }

  /** A started generation becomes the one leases go to (start.ts, in the turn it came up). */
  install(started: StartedGeneration): void {
    this.serve(new Generation(this, started.generation, started), "start");
  }

  private serve(generation: Generation, how: "start" | "switch"): void {
    this.live = generation;
    this.last = generation;
    this.sizing.onStart();
    this.hooks.onServe(how);
  }

  // ── Rotation ───────────────────────────────────────────────────────────────────────────────────

  /**
   * Opens the pool of a rotation's new generation under its new credential and proves it with one
   * query. Nothing routes to it until `switchTo`.
   */
  async prepare(
    record: TenantRecord,
    generation: number,
    credential: UnsealedCredential,
    size: number,
  ): Promise<PreparedGeneration> {
    const jwtCredential = await this.credentials.openJwt(record, credential);
    const pool = this.opener.open(record, generation, credential, size);
    try {
      await pool.query("SELECT 1");
    } catch (error) {
      await endPool(pool);
      throw error;
    }
    return { pool, target: credential.target, jwtCredential, size };
  }

  /**
   * The size a rotation's new generation is admitted and opened at: the current generation's
   * allowance (a grown or shrunk pool keeps its size through a rotation), or the start size.
   */
  rotationSize(record: TenantRecord): number {
    return this.live ? this.live.allowance : this.sizing.bounds(record).start;
  }

  /**
   * Makes a prepared generation current (the caller applies `rotationSwitched` in the same turn):
   * new leases go to it from now on; the old generation keeps the leases it holds and retires when
   * the last one ends. No await, so no lease can be taken between the two.
   */
  switchTo(prepared: PreparedGeneration, generation: number): void {
    const old = this.live;
    // The new generation opens its own end-user pool on first use, under the new credential's
    // derived login password and claims key (src/tenant-object/credentials.ts `changePassword`).
    this.serve(new Generation(this, generation, prepared), "switch");
    this.replaced = old;
    // The old generation keeps its leases; whoever waited for them (a drain) now watches the new one's.
    const retiringLeases = this.leaseBook.retireCurrent();
    if (old && retiringLeases === 0) this.rt.ctx.waitUntil(this.retire(old));
  }

  /** The retiring generation's last lease ended (or was reclaimed): it stops now. */
  retiringDrained(): void {
    const old = this.replaced;
    if (old) this.rt.ctx.waitUntil(this.retire(old));
  }

  /** Stops a retiring generation: closes its pools, then releases its budget allocation. */
  private async retire(old: Generation): Promise<void> {
    if (this.replaced !== old) return;
    this.replaced = null;
    this.leaseBook.endRetiring();
    this.closing.add(old.number);
    try {
      await this.closeGeneration(old);
    } finally {
      this.closing.delete(old.number);
    }
    const rt = this.rt;
    rt.apply(retired(rt.lifecycle, old.number), "retired");
    rt.note(`rotation_retired: generation ${old.number} stopped`);
    // The alarm flushes the events soon rather than at the next heartbeat.
    await rt.alarms.wakeBy(Date.now() + 1_000).catch(() => undefined);
    await this.releaseBudget(old.number);
    this.hooks.onRetired(old.number);
  }

  // ── Stop ───────────────────────────────────────────────────────────────────────────────────────

  /**
   * Stops the current generation's pool: the generation ends at once (new requests start a new
   * one), its connections close, and only then is its budget allocation released. It stops only
   * the generation it was called for.
   */
  async stop(reason: string): Promise<void> {
    const rt = this.rt;
    const live = this.live;
    if (!live || rt.lifecycle.generation !== live.number) return;
    const generation = live.number;
    this.live = null;
    this.sizing.onStop();
    this.closing.add(generation);
    rt.apply(beginDrain(rt.lifecycle), reason);
    rt.apply(stopped(rt.lifecycle, generation), "drained");
    this.hooks.onStopping();
    try {
      await this.closeGeneration(live);
    } finally {
      this.closing.delete(generation);
      rt.deadlines.quiesce();
    }
    // Only now are the connections closed; releasing is idempotent (an evicting budget releases too).
    await this.releaseBudget(generation);
  }

  private async releaseBudget(generation: number): Promise<void> {
    const record = this.rt.record;
    if (!record) return;
    await this.rt
      .budget(record.host)
      .release(record.host, record.tenantId, generation)
      .catch(() => undefined);
  }

  /**
   * Closes a generation's pools, bounded (`endPool`): a connection that does not come back within
   * the bound is cut, so a generation never stays `closing` (holding its budget) for ever. A forced
   * close is logged as an event and counted.
   */
  private async closeGeneration(generation: Generation): Promise<void> {
    if ((await generation.close()) !== "forced") return;
    logEvent("warn", "pool_close_forced", { tenant: this.rt.tenantId, generation: generation.number });
    this.rt.note(`pool_close_forced: generation ${generation.number} did not close within the bound`);
    this.hooks.onRepair("close_forced", 1);
    flushEventsSoon(this.rt);
  }
}
