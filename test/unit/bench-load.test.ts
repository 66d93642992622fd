/**
 * The bench's shared measuring (bench/load.ts) and the pure judging of bench/harness.ts: the
 * percentiles every table prints, the fixed-count runs of bench:jwt and bench:wire (one wrong answer
 * fails the run), and what counts as a right answer or a refusal's kind.
 */
import { describe, expect, it } from "vitest";
import { answerKind, inParallel, isOne, type RawAnswer, rank, setting } from "../../bench/harness.ts";
import { countedCell, percentile, runRequests } from "../../bench/load.ts";

describe("percentile", () => {
  const hundred = Array.from({ length: 100 }, (_, i) => 100 - i);

  it("is the nearest rank of unsorted values", () => {
    expect(percentile(hundred, 50)).toBe(50);
    expect(percentile(hundred, 99)).toBe(99);
    expect(percentile(hundred, 100)).toBe(100);
    expect(percentile(hundred, 0)).toBe(1);
    // Rank ⌈0.5 × 5⌉ = 3 of [1, 2, 3, 4, 5]; ⌈0.99 × 5⌉ = 5.
    expect(percentile([5, 1, 4, 2, 3], 50)).toBe(3);
    expect(percentile([5, 1, 4, 2, 3], 99)).toBe(5);
  });

  it("leaves its input as it was, and is 0 with no values", () => {
    const values = [3, 1, 2];
    percentile(values, 50);
    expect(values).toEqual([3, 1, 2]);
    expect(percentile([], 50)).toBe(0);
    expect(percentile([7], 99)).toBe(7);
  });

  it("agrees with the harness's rank of sorted values", () => {
    const sorted = [...hundred].sort((a, b) => a - b);
    for (const p of [1, 25, 50, 90, 99, 100]) expect(rank(sorted, p)).toBe(percentile(hundred, p));
    expect(rank([], 50)).toBe(0);
  });
});

describe("runRequests", () => {
  it("sends exactly `count` requests, each sequence once, never more than `concurrency` at a time", async () => {
    const seen: number[] = [];
    let inFlight = 0;
    let most = 0;
    const result = await runRequests(25, 4, async (sequence) => {
      inFlight++;
      most = Math.max(most, inFlight);
      await new Promise((done) => setTimeout(done, 1));
      seen.push(sequence);
      inFlight--;
    });
    expect(seen.sort((a, b) => a - b)).toEqual(Array.from({ length: 25 }, (_, i) => i));
    expect(most).toBe(4);
    expect(result.completed).toBe(25);
    expect(result.latenciesMs).toHaveLength(25);
    expect(result.errors).toBe(0);
  });

  it("fails the run when one answer is wrong, with the failure in the message", async () => {
    const run = runRequests(10, 2, async (sequence) => {
      if (sequence === 7) throw new Error("wrong row");
    });
    await expect(run).rejects.toThrow("1 of 10 requests failed: wrong row");
  });

  it("sends nothing for a count of 0", async () => {
    let calls = 0;
    const result = await runRequests(0, 8, async () => {
      calls++;
    });
    expect(calls).toBe(0);
    expect(result.completed).toBe(0);
  });
});

describe("countedCell", () => {
  it("sums the rounds of a cell: their wall time, requests and the percentiles of all latencies", () => {
    const cell = countedCell([
      { elapsedMs: 500, latenciesMs: [1, 2, 3] },
      { elapsedMs: 1500, latenciesMs: [4, 100] },
    ]);
    expect(cell).toEqual({ requests: 5, seconds: 2, requestsPerSecond: 2.5, p50Ms: 3, p99Ms: 100 });
  });

  it("gives 0 req/s, not NaN or Infinity, for a cell that took no time", () => {
    expect(countedCell([])).toEqual({ requests: 0, seconds: 0, requestsPerSecond: 0, p50Ms: 0, p99Ms: 0 });
    expect(countedCell([{ elapsedMs: 0, latenciesMs: [1] }]).requestsPerSecond).toBe(0);
  });
});

describe("harness: answers", () => {
  const answer = (status: number, body: unknown): RawAnswer => ({ status, retryAfter: null, body, ms: 1 });

  it("takes only a 200 with the one row n = 1 as the right answer to SELECT 1", () => {
    expect(isOne(answer(200, { rows: [{ n: 1 }] }))).toBe(true);
    expect(isOne(answer(200, { rows: [["1"]] }))).toBe(true);
    expect(isOne(answer(200, { rows: [{ n: 2 }] }))).toBe(false);
    expect(isOne(answer(200, { rows: [{ n: 1 }, { n: 1 }] }))).toBe(false);
    expect(isOne(answer(200, { rows: [] }))).toBe(false);
    expect(isOne(answer(503, { rows: [{ n: 1 }] }))).toBe(false);
    expect(isOne(answer(200, "not json"))).toBe(false);
    expect(isOne(answer(200, null))).toBe(false);
  });

  it("names a refusal by its status and code", () => {
    expect(answerKind(answer(503, { code: "capacity_saturated" }))).toBe("503 capacity_saturated");
    expect(answerKind(answer(502, "Bad Gateway"))).toBe("502 (no code)");
    expect(answerKind(answer(500, { code: 7 }))).toBe("500 (no code)");
  });
});

describe("harness: settings and parallel work", () => {
  it("reads a bounded setting, and refuses one out of bounds or not a number", () => {
    const name = "BENCH_TEST_SETTING";
    delete process.env[name];
    expect(setting(name, 5, 1, 10)).toBe(5);
    process.env[name] = "";
    expect(setting(name, 5, 1, 10)).toBe(5);
    process.env[name] = "10";
    expect(setting(name, 5, 1, 10)).toBe(10);
    for (const bad of ["11", "0", "x"]) {
      process.env[name] = bad;
      expect(() => setting(name, 5, 1, 10)).toThrow(`${name} must be a number from 1 to 10`);
    }
    delete process.env[name];
  });

  it("runs every item once, at most `limit` at a time", async () => {
    const done: number[] = [];
    let inFlight = 0;
    let most = 0;
    await inParallel([10, 11, 12, 13, 14], 2, async (item, index) => {
      inFlight++;
      most = Math.max(most, inFlight);
      await new Promise((resolve) => setTimeout(resolve, 1));
      done.push(item - index);
      inFlight--;
    });
    expect(done).toEqual([10, 10, 10, 10, 10]);
    expect(most).toBe(2);
  });
});
