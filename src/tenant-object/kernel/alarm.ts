/**
 * The tenant object's one alarm (docs/adr/026-tenant-object-kernel.md). A Durable Object has a
 * single alarm, and the heartbeat, the session leases' TTLs, the holders' key expiries, a drain's
 * overdue report and the staged jobs (erase, move) all need it: each says when it next needs to
 * wake, and this is the only code that calls `setAlarm`.
 *
 * - `register(name, next)`: a capability that always wants to wake by `next()` (null: not now);
 * - `wakeBy(at)`: wake no later than `at` (never moves the alarm later);
 * - `rearm(at)`: the alarm handler's (or a job's) next time, replacing the armed one, but never
 *   later than a registered capability needs;
 * - `cancel()`: nothing is due (a committed move's pointer), unless a capability still needs it.
 */
export class AlarmSchedule {
  private readonly wakers = new Map<string, () => number | null>();

  constructor(private readonly storage: DurableObjectStorage) {}

  /** A capability that needs to wake by `next()` whenever the alarm is re-armed. */
  register(name: string, next: () => number | null): void {
    this.wakers.set(name, next);
  }

  /** The earliest time a registered capability needs, with `at`; null if none. */
  private earliest(at: number | null): number | null {
    let next = at;
    // A capability overdue (a busy lease past its TTL) is looked at again soon, not in a loop.
    const soonest = Date.now() + 100;
    for (const waker of this.wakers.values()) {
      const wanted = waker();
      const due = wanted === null ? null : Math.max(wanted, soonest);
      if (due !== null && (next === null || due < next)) next = due;
    }
    return next;
  }

  /** Wakes no later than `at`: arms the alarm unless it is already armed earlier. */
  async wakeBy(at: number): Promise<void> {
    const current = await this.storage.getAlarm();
    if (current === null || current > at) await this.storage.setAlarm(at);
  }

  /**
   * Sets the next wake to `at` (null: the caller needs none), or earlier if a registered capability
   * needs it; with neither, the alarm stays as it is (an alarm that fired is already cleared).
   */
  async rearm(at: number | null, floor = 0): Promise<void> {
    const next = this.earliest(at);
    if (next === null) return;
    await this.storage.setAlarm(Math.max(floor, next));
  }

  /** Nothing the caller runs is due any more: clears the alarm, unless a capability still needs it. */
  async cancel(): Promise<void> {
    const next = this.earliest(null);
    if (next === null) await this.storage.deleteAlarm();
    else await this.storage.setAlarm(next);
  }
}
