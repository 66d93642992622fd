/**
 * lessor/client's retry policy: exactly the failure table's retryable refusals, Retry-After with
 * jitter, and both bounds (attempts and total wait). Pure: no clock, no network.
 */
import { describe, expect, it } from "vitest";
import type { ErrorAnswer } from "../../src/client/errors.ts";
import { decideRetry, defaultRetryOptions, isRetryable, type RetryOptions } from "../../src/client/retry.ts";

function refusal(status: number, code: string, retryAfter?: number): ErrorAnswer {
  return { status, code, message: code, retryAfter };
}

const options: RetryOptions = { ...defaultRetryOptions };

describe("isRetryable", () => {
  it.each([
    "capacity_saturated",
    "tenant_starting_failed",
    "tenant_migrating",
    "tenant_draining",
    "lease_timeout",
    "lease_limit",
    "control_plane_unavailable",
    "tenant_erasing",
  ])("retries 503 %s, on /sql and on a lease", (code) => {
    expect(isRetryable(refusal(503, code, 1), false, options)).toBe(true);
    expect(isRetryable(refusal(503, code, 1), true, options)).toBe(true);
  });

  it("retries 409 stale_generation on /sql, not on a lease (the lease itself ended)", () => {
    expect(isRetryable(refusal(409, "stale_generation", 1), false, options)).toBe(true);
    expect(isRetryable(refusal(409, "stale_generation", 1), true, options)).toBe(false);
  });

  it.each(["connection_lost", "object_unavailable"])(
    "retries %s only when the caller opts in: the statement may have run",
    (code) => {
      expect(isRetryable(refusal(503, code, 1), false, options)).toBe(false);
      expect(isRetryable(refusal(503, code, 1), false, { ...options, retryConnectionLost: true })).toBe(true);
    },
  );

  it("retries a 429 only when it says how long to wait", () => {
    expect(isRetryable(refusal(429, "rate_limited", 2), false, options)).toBe(true);
    expect(isRetryable(refusal(429, "rate_limited"), false, options)).toBe(false);
  });

  it.each([
    [400, "statement_timeout"],
    [400, "invalid_request"],
    [401, "invalid_credentials"],
    [404, "lease_not_found"],
    [409, "lease_expired"],
    [409, "lease_lost"],
    [409, "schema_too_old"],
    [423, "tenant_disabled"],
    [500, "internal"],
    [502, "unexpected_response"],
    [503, "unexpected_response"],
    [503, "something_new"],
    [507, "response_too_large"],
  ])("does not retry %i %s", (status, code) => {
    expect(isRetryable(refusal(status, code, 1), false, options)).toBe(false);
  });
});

describe("decideRetry", () => {
  const first = { attempt: 1, waitedMs: 0, onLease: false };

  it("waits Retry-After plus up to `jitter` of it", () => {
    const saturated = refusal(503, "capacity_saturated", 2);
    expect(decideRetry(saturated, first, options, () => 0)).toEqual({ retry: true, delayMs: 2000 });
    expect(decideRetry(saturated, first, options, () => 0.5)).toEqual({ retry: true, delayMs: 2500 });
    expect(decideRetry(saturated, first, { ...options, jitter: 0 }, () => 0.99)).toEqual({
      retry: true,
      delayMs: 2000,
    });
  });

  it("waits 1 s (plus jitter) when a retryable refusal names no Retry-After", () => {
    expect(decideRetry(refusal(503, "tenant_draining"), first, options, () => 0)).toEqual({
      retry: true,
      delayMs: 1000,
    });
  });

  it("stops at maxAttempts", () => {
    const draining = refusal(503, "tenant_draining", 1);
    expect(decideRetry(draining, { ...first, attempt: 3 }, options, () => 0).retry).toBe(true);
    expect(decideRetry(draining, { ...first, attempt: 4 }, options, () => 0).retry).toBe(false);
    expect(decideRetry(draining, first, { ...options, maxAttempts: 1 }, () => 0).retry).toBe(false);
  });

  it("never starts a wait that would overrun maxWaitMs", () => {
    // tenant_starting_failed backs off up to 60 s: past the bound, the caller gets it at once.
    expect(decideRetry(refusal(503, "tenant_starting_failed", 60), first, options, () => 0).retry).toBe(
      false,
    );
    const draining = refusal(503, "tenant_draining", 1);
    expect(decideRetry(draining, { ...first, waitedMs: 9000 }, options, () => 0).retry).toBe(true);
    expect(decideRetry(draining, { ...first, waitedMs: 9000 }, options, () => 0.5).retry).toBe(false);
  });

  it("does not retry what is not retryable, whatever the bounds", () => {
    expect(decideRetry(refusal(409, "lease_expired", 1), first, options, () => 0).retry).toBe(false);
  });
});
