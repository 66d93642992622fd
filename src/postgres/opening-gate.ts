/**
 * How many of an object's connections may be opening at once. Cloudflare counts a connection
 * toward its six "simultaneous outgoing connections" only while it waits for its response headers
 * (since 2026-04-09: changelog "Relaxed simultaneous connection limiting for Workers"); a seventh
 * is queued by the platform until one of the six has them, and `wrangler dev` does not enforce the
 * rule at all. So the platform no longer bounds how many connections a pool holds, only how many
 * open at once, and Lessor keeps that bound itself, the same locally as deployed: a connection takes
 * a place here from its `connect()` until it is ready (or failed), which covers the platform's
 * window (the WebSocket's upgrade, or the TCP socket's opening) and the login after it. A pool
 * larger than six then opens its connections six at a time, never more, whatever the platform's
 * queueing does (docs/adr/030-pools-larger-than-six.md).
 */

/** The platform's bound on connections waiting for their response headers, per invocation. */
export const maxOpeningAtOnce = 6;

export class OpeningGate {
  private opening = 0;
  private readonly waiting: (() => void)[] = [];
  /** The most connections that were opening at once (for tests and status). */
  peak = 0;

  constructor(private readonly limit = maxOpeningAtOnce) {}

  /** Connections opening now. */
  get size(): number {
    return this.opening;
  }

  /** Waits for a place (FIFO) and answers the function that gives it back (once). */
  async enter(): Promise<() => void> {
    if (this.opening >= this.limit) {
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else {
      this.opening++;
    }
    this.peak = Math.max(this.peak, this.opening);
    let left = false;
    return () => {
      if (left) return;
      left = true;
      const next = this.waiting.shift();
      // The place passes straight to the next in line: the count does not move.
      if (next) next();
      else this.opening--;
    };
  }
}
