/**
 * A bounded FIFO of callers waiting for something a Durable Object hands out (pool admissions,
 * rotation admissions, maintenance slots): each waits at most its own deadline, the queue holds at
 * most `capacity` waiters, and the head is served first. What "fits" is decided by the caller,
 * each time it serves the queue (`serveWhile`), so the queue knows nothing of budgets.
 */
interface Entry<T, R> {
  item: T;
  settle: (result: R) => void;
}

export class WaitQueue<T, R> {
  private entries: Entry<T, R>[] = [];

  constructor(private readonly capacity: number) {}

  get length(): number {
    return this.entries.length;
  }

  /** No room for another waiter: the caller refuses at once. */
  get full(): boolean {
    return this.entries.length >= this.capacity;
  }

  /** The waiter first in line, if any. */
  head(): T | undefined {
    return this.entries[0]?.item;
  }

  /**
   * Queues `item` and resolves with what serves it, or with `onTimeout()` once `waitMs` passes
   * (the waiter is then out of the queue). The caller checks `full` first.
   */
  wait(item: T, waitMs: number, onTimeout: () => R): Promise<R> {
    return new Promise<R>((resolve) => {
      const entry: Entry<T, R> = {
        item,
        settle: (result) => {
          clearTimeout(timer);
          resolve(result);
        },
      };
      const timer = setTimeout(() => {
        this.entries = this.entries.filter((e) => e !== entry);
        resolve(onTimeout());
      }, waitMs);
      this.entries.push(entry);
    });
  }

  /**
   * Serves waiters in FIFO order while `serve` grants the head (returns its result); stops at the
   * first head it does not (returns null), so no later waiter overtakes it. Returns how many were
   * served.
   */
  serveWhile(serve: (item: T) => R | null): number {
    let served = 0;
    for (let head = this.entries[0]; head; head = this.entries[0]) {
      const result = serve(head.item);
      if (result === null) break;
      this.entries.shift();
      head.settle(result);
      served++;
    }
    return served;
  }

  /** Answers the waiter first in line with `result` (it leaves the line); false if none waits. */
  settleHead(result: R): boolean {
    const head = this.entries.shift();
    head?.settle(result);
    return head !== undefined;
  }

  /** Answers every waiter that `matches` with `result` at once, wherever it stands in line. */
  settleWhere(matches: (item: T) => boolean, result: R): number {
    const matched = this.entries.filter((e) => matches(e.item));
    if (matched.length === 0) return 0;
    this.entries = this.entries.filter((e) => !matches(e.item));
    for (const entry of matched) entry.settle(result);
    return matched.length;
  }
}
