/**
 * Rate limits of CancelRequests (docs/adr/017-wire-protocol.md, "Bounds"): per source (the address a
 * CancelRequest came from) and per target (the connection its key names). A cancel that passes costs
 * a registry lookup, a call to the tenant's object and a connection to Postgres; a key Lessor did not
 * mint costs nothing, because its MAC fails at the edge (src/routes/wire-cancel.ts) before any of it.
 *
 * Pure: counts in fixed windows over `now`, with a bounded number of keys remembered.
 */

/** Cancels one source may send per window, and one target may receive. */
export const cancelLimits = { windowMs: 10_000, perSource: 20, perTarget: 4, maxKeys: 4096 } as const;

/** How many events each key had in its current window; the oldest keys are forgotten past `maxKeys`. */
export class WindowCounter {
  private readonly counts = new Map<string, { windowStart: number; count: number }>();

  constructor(
    private readonly limit: number,
    private readonly windowMs: number,
    private readonly maxKeys: number,
  ) {}

  /** Counts one event for `key`; false if the key is past its limit in this window (not counted). */
  admit(key: string, now: number): boolean {
    const entry = this.counts.get(key);
    if (!entry || now - entry.windowStart >= this.windowMs) {
      this.counts.delete(key);
      this.counts.set(key, { windowStart: now, count: 1 });
      this.forgetOldest();
      return true;
    }
    if (entry.count >= this.limit) return false;
    entry.count++;
    return true;
  }

  get size(): number {
    return this.counts.size;
  }

  private forgetOldest(): void {
    // A Map iterates in insertion order, and a key is re-inserted when its window starts again.
    for (const key of this.counts.keys()) {
      if (this.counts.size <= this.maxKeys) return;
      this.counts.delete(key);
    }
  }
}
