/**
 * The deadlines of an object's statements, kept with at most one timer armed. Arming and clearing a
 * timer for every request was a measurable share of the warm path's CPU (issue 25); every statement
 * of an object has the same bound, so a new deadline is never earlier than the ones already kept,
 * and watching or unwatching one is a set operation. The one timer fires at the earliest deadline,
 * runs what expired and re-arms for the next; `quiesce` clears it once nothing is watched (a stopped
 * pool's object must not be kept from hibernating by a timer with nothing to do).
 */
interface Watched {
  at: number;
  onExpire: () => void;
}

export class Deadlines {
  private readonly watched = new Set<Watched>();
  private timer: ReturnType<typeof setTimeout> | null = null;
  private timerAt = Number.POSITIVE_INFINITY;

  /** Calls `onExpire` at `at` (epoch ms) unless the returned function is called first. */
  watch(at: number, onExpire: () => void): () => void {
    const entry: Watched = { at, onExpire };
    this.watched.add(entry);
    if (at < this.timerAt) this.arm(at);
    return () => {
      this.watched.delete(entry);
    };
  }

  /** How many deadlines are watched (for tests). */
  get size(): number {
    return this.watched.size;
  }

  /** Whether a timer is armed (for tests). */
  get armed(): boolean {
    return this.timer !== null;
  }

  /** Clears the timer if nothing is watched. */
  quiesce(): void {
    if (this.watched.size > 0 || this.timer === null) return;
    clearTimeout(this.timer);
    this.timer = null;
    this.timerAt = Number.POSITIVE_INFINITY;
  }

  private arm(at: number): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => this.fire(), Math.max(0, at - Date.now()));
  }

  private fire(): void {
    this.timer = null;
    this.timerAt = Number.POSITIVE_INFINITY;
    const now = Date.now();
    let next = Number.POSITIVE_INFINITY;
    for (const entry of [...this.watched]) {
      if (entry.at <= now) {
        this.watched.delete(entry);
        entry.onExpire();
      } else if (entry.at < next) {
        next = entry.at;
      }
    }
    if (next < Number.POSITIVE_INFINITY) this.arm(next);
  }
}
