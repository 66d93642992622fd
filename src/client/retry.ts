/**
 * Which of Lessor's refusals the client sends again, and when. Pure: the decision is a function of
 * the answer, the attempts so far and a random number, so it is tested without waiting.
 *
 * Retried are exactly the refusals the failure table (docs/failures.md) calls retryable: they mean the statement
 * did not run, so sending it again cannot apply it twice. `connection_lost` is not among them by
 * default: the statement may have run before the connection died.
 */
import type { ErrorAnswer } from "./errors.ts";

/** How hard the client retries. */
export interface RetryOptions {
  /** Most times one request is sent, the first included. `1` turns retries off. */
  maxAttempts: number;
  /** Most milliseconds spent waiting between the attempts of one request, all waits together. */
  maxWaitMs: number;
  /**
   * Random extra wait, as a fraction of `Retry-After` (0.5: wait 1 to 1.5 × it), so that clients
   * refused together do not all come back in the same instant.
   */
  jitter: number;
  /**
   * Also retry `503 connection_lost` and `503 object_unavailable`. Off by default: the statement
   * may or may not have run, so only statements that are safe to apply twice (or that the app
   * checks first) should opt in.
   */
  retryConnectionLost: boolean;
}

/**
 * Up to 3 retries within 10 s of waiting: room for several of Lessor's usual 1 s hints, short
 * enough for a request path.
 */
export const defaultRetryOptions: Readonly<RetryOptions> = {
  maxAttempts: 4,
  maxWaitMs: 10_000,
  jitter: 0.5,
  retryConnectionLost: false,
};

/** 503 refusals that come before the statement runs: the pool could not serve it yet. */
const retryableUnavailable: ReadonlySet<string> = new Set([
  "capacity_saturated",
  "tenant_starting_failed",
  "tenant_migrating",
  "tenant_draining",
  "lease_timeout",
  "lease_limit",
  "control_plane_unavailable",
  "tenant_erasing",
]);

/** Wait when a retryable refusal names no `Retry-After` (Lessor's own hint is 1 s). */
const defaultRetryAfterSeconds = 1;

/**
 * Whether a request whose answer was `answer` may be sent again. `onLease` is true for a statement
 * on (or the release of) a session lease: there `stale_generation` means the lease itself ended, and
 * only a new lease and a new transaction help, so it is not retried.
 */
export function isRetryable(answer: ErrorAnswer, onLease: boolean, options: RetryOptions): boolean {
  if (answer.status === 503) {
    if (retryableUnavailable.has(answer.code)) return true;
    // The statement may have run: retried only where the app said that is safe.
    const mayHaveRun = answer.code === "connection_lost" || answer.code === "object_unavailable";
    return mayHaveRun && options.retryConnectionLost;
  }
  if (answer.status === 409) return answer.code === "stale_generation" && !onLease;
  // A 429 is only a retry hint when it says how long to wait.
  if (answer.status === 429) return answer.retryAfter !== undefined;
  return false;
}

/** Give up, or wait `delayMs` and send again. */
export type RetryDecision = { retry: false } | { retry: true; delayMs: number };

/**
 * What to do after `attempt` attempts (1-based) got `answer` and `waitedMs` were already spent
 * waiting: give up, or wait `delayMs` and send again. `random` is in [0, 1).
 */
export function decideRetry(
  answer: ErrorAnswer,
  context: { attempt: number; waitedMs: number; onLease: boolean },
  options: RetryOptions,
  random: () => number,
): RetryDecision {
  if (!isRetryable(answer, context.onLease, options) || context.attempt >= options.maxAttempts) {
    return { retry: false };
  }
  const baseMs = (answer.retryAfter ?? defaultRetryAfterSeconds) * 1000;
  const delayMs = Math.round(baseMs * (1 + Math.max(0, options.jitter) * random()));
  // A wait that would overrun the bound is not started: the caller gets the refusal (and its
  // Retry-After) now, instead of after a wait that ends in the same refusal.
  if (context.waitedMs + delayMs > options.maxWaitMs) return { retry: false };
  return { retry: true, delayMs };
}

/** Time, as the retry loop sees it; tests pass a fake one. */
export interface Clock {
  now(): number;
  /** Resolves after `ms`, or rejects with the signal's reason once it aborts. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** Real time: `Date.now()` and `setTimeout`, which Workers and Node both have. */
export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const onAbort = () => {
        clearTimeout(timer);
        reject(signal?.reason);
      };
      const timer = setTimeout(() => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      signal?.addEventListener("abort", onAbort, { once: true });
    }),
};
