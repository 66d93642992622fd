/**
 * The pool's lease book: every lease it counts, of the current generation and of the one a
 * credential rotation retired (docs/adr/013), with no runtime in it. The pool (index.ts) takes and
 * releases leases here and does the I/O each change calls for (telling the budget, stopping a
 * retired generation); test/unit/pool-leases.test.ts drives it through random sequences.
 *
 * - The count is the book's size: a lease released twice, or never taken, cannot move it.
 * - A lease held past its `overdueAt`, which nothing legitimate does, is taken out by `sweep`, so a
 *   lost release cannot keep a generation from ever going idle; its `abandon` ends what still uses it.
 * - At a rotation's switch the current leases become the retiring generation's, and the new
 *   generation starts with none; the retiring generation ends when its last lease goes.
 */

/** What a lease is for: one `/sql` request, or a session lease (`/v1/leases`). */
export type LeaseKind = "sql" | "session";

/** A lease the book counts. */
export interface HeldLease {
  readonly id: number;
  readonly kind: LeaseKind;
  readonly generation: number;
  readonly since: number;
  readonly overdueAt: number;
  /** Ends whatever still uses the lease (cuts its connection) when it is reclaimed. */
  abandon: (() => void) | null;
}

/** Where a released lease was. */
export type Released = "current" | "retiring" | null;

/** What a sweep took out. */
export interface Swept {
  reclaimed: HeldLease[];
  /** The current generation had leases and has none now. */
  currentEmptied: boolean;
  /** The retiring generation has no lease left (it may stop). */
  retiringEmpty: boolean;
}

export class LeaseBook {
  private current = new Map<number, HeldLease>();
  private retiringLeases: Map<number, HeldLease> | null = null;
  private nextId = 1;
  private readonly emptied: (() => void)[] = [];

  /** Leases of the current generation. */
  get size(): number {
    return this.current.size;
  }

  /** Leases the retiring generation still holds, or null when none retires. */
  get retiringSize(): number | null {
    return this.retiringLeases?.size ?? null;
  }

  /** Takes a lease on the current generation; answers its id (never one given before). */
  take(kind: LeaseKind, generation: number, now: number, overdueAfterMs: number): number {
    const id = this.nextId++;
    this.current.set(id, {
      id,
      kind,
      generation,
      since: now,
      overdueAt: now + overdueAfterMs,
      abandon: null,
    });
    return id;
  }

  /** Sets what ends a lease's work if it is reclaimed (a released lease is not touched). */
  onAbandon(id: number, abandon: () => void): void {
    const held = this.current.get(id) ?? this.retiringLeases?.get(id);
    if (held) held.abandon = abandon;
  }

  /**
   * Ends a lease; answers where it was. A second release, or an id never given, changes nothing.
   * When the current generation's last lease goes, whoever waits for none learns it.
   */
  release(id: number): Released {
    if (this.retiringLeases?.delete(id)) return "retiring";
    if (!this.current.delete(id)) return null;
    if (this.current.size === 0) this.wake();
    return "current";
  }

  /** Takes out every lease held past its bound (of both generations), oldest first. */
  sweep(now: number): Swept {
    const reclaimed: HeldLease[] = [];
    const before = this.current.size;
    for (const leases of [this.retiringLeases, this.current]) {
      if (!leases) continue;
      for (const [id, lease] of leases) {
        if (lease.overdueAt > now) continue;
        leases.delete(id);
        reclaimed.push(lease);
      }
    }
    const currentEmptied = before > 0 && this.current.size === 0;
    if (currentEmptied) this.wake();
    return { reclaimed, currentEmptied, retiringEmpty: this.retiringLeases?.size === 0 };
  }

  /**
   * A rotation's switch: the current leases become the retiring generation's (they finish there),
   * and the new current generation holds none. Whoever waited for no lease now watches the new one.
   * Answers how many the retiring generation holds.
   */
  retireCurrent(): number {
    this.retiringLeases = this.current;
    this.current = new Map();
    this.wake();
    return this.retiringLeases.size;
  }

  /** The retiring generation stopped: its leases (none, or none that count) are forgotten. */
  endRetiring(): void {
    this.retiringLeases = null;
  }

  /** Resolves true once the current generation holds no lease, or with whether it holds none after `timeoutMs`. */
  waitForNone(timeoutMs: number): Promise<boolean> {
    if (this.current.size === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(this.current.size === 0), timeoutMs);
      this.emptied.push(() => {
        clearTimeout(timer);
        resolve(this.current.size === 0);
      });
    });
  }

  private wake(): void {
    for (const wake of this.emptied.splice(0)) wake();
  }
}
