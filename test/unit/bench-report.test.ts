/**
 * The judging of `npm run bench` (bench/report.ts): the ratios of Lessor to each baseline, the
 * targets of issue 7 and the verdict line. The bench reports these and never asserts them, so these
 * tests are what keeps a wrong ratio or a missed target from being printed as met.
 */
import { describe, expect, it } from "vitest";
import type { CpuSample } from "../../bench/processes.ts";
import {
  fixed,
  judgeTargets,
  type Measurement,
  pairedRatios,
  type Ratio,
  ratios,
  type StormResult,
  totalCpu,
  verdictLine,
} from "../../bench/report.ts";

function cpu(overrides: Partial<CpuSample> = {}): CpuSample {
  return {
    benchClient: 0.1,
    wranglerNode: 0,
    workerdProxy: 0,
    workerdWorker: 0.5,
    wsProxy: 0.2,
    postgres: 0.2,
    machine: 0,
    ...overrides,
  };
}

function measurement(overrides: Partial<Measurement> = {}): Measurement {
  return {
    label: "m",
    path: "lessor",
    route: "direct",
    query: "select1",
    transport: "light",
    logLevel: "info",
    concurrency: 8,
    requests: 1000,
    errors: 0,
    errorSamples: [],
    elapsedS: 1,
    rps: 1000,
    p50Ms: 1,
    p99Ms: 2,
    meanMs: 1,
    cpuMsPerRequest: cpu(),
    coresBusy: 1,
    otherCoresBusy: 0,
    loadavg1: 0.5,
    contended: false,
    ...overrides,
  };
}

function ratio(overrides: Partial<Ratio> = {}): Ratio {
  return {
    query: "select1",
    route: "direct",
    concurrency: 8,
    lessorRps: 1000,
    vsBare: 1,
    vsBareRounds: { median: 1, min: 0.95, max: 1.05, rounds: 8 },
    vsNewconn: 20,
    vsNoop: 0.5,
    vsPg: 0.3,
    cpuVsBare: 1,
    cpuVsNewconn: 20,
    isolateCpuVsBare: 1,
    contended: false,
    p50VsBare: 1,
    p50VsNewconn: 0.05,
    ...overrides,
  };
}

function storm(overrides: Partial<StormResult> = {}): StormResult {
  return {
    tenant: "storm",
    requested: 1000,
    requests: 1000,
    sizing: { probeRps: 500, budgetSeconds: 10, note: "as asked" },
    errors: 0,
    errorSamples: [],
    p50Ms: 300,
    p99Ms: 500,
    maxMs: 600,
    wallMs: 700,
    firstAnswerMs: 250,
    starts: { runtimeGeneration: 1, applicationNames: 1, generationLedgerRows: 1 },
    singleColdMs: [100, 100, 100],
    singleColdMedianMs: 100,
    warmBurst: { requests: 1000, errors: 0, p50Ms: 150, p99Ms: 300, wallMs: 400, firstAnswerMs: 5 },
    ...overrides,
  };
}

describe("ratios", () => {
  it("divides Lessor by each baseline measured at the same route, query and concurrency", () => {
    const lessor = measurement({
      rps: 900,
      p50Ms: 2,
      cpuMsPerRequest: cpu({ workerdWorker: 0.6 }),
      roundRps: [900, 800],
    });
    const measurements = [
      lessor,
      measurement({
        path: "bare",
        rps: 1000,
        p50Ms: 1,
        cpuMsPerRequest: cpu({ workerdWorker: 0.4 }),
        roundRps: [1000, 1000],
      }),
      measurement({ path: "newconn", rps: 90, p50Ms: 20 }),
      // The floor answers every query the same: it is matched whatever its query.
      measurement({ path: "noop", query: "indexed", rps: 1800 }),
      // Postgres is reached from Node (its own route) and matched by query and concurrency only.
      measurement({ path: "pg", route: "node", transport: "pg", rps: 3000 }),
    ];
    const [r, ...rest] = ratios(measurements);
    expect(rest).toEqual([]);
    expect(r?.lessorRps).toBe(900);
    expect(r?.vsBare).toBeCloseTo(0.9);
    expect(r?.vsBareRounds?.median).toBeCloseTo(0.85);
    expect(r?.vsBareRounds).toMatchObject({ min: 0.8, max: 0.9, rounds: 2 });
    expect(r?.vsNewconn).toBeCloseTo(10);
    expect(r?.vsNoop).toBeCloseTo(0.5);
    expect(r?.vsPg).toBeCloseTo(0.3);
    // Total CPU: bare 0.9 ms against Lessor's 1.1 ms per request.
    expect(r?.cpuVsBare).toBeCloseTo(0.9 / 1.1);
    expect(r?.isolateCpuVsBare).toBeCloseTo(1.5);
    expect(r?.p50VsBare).toBeCloseTo(2);
    expect(r?.p50VsNewconn).toBeCloseTo(0.1);
    expect(r?.contended).toBe(false);
  });

  it("gives null, not a number, for a baseline that was not measured or measured nothing", () => {
    const [r] = ratios([
      measurement({ roundRps: [900] }),
      // Other concurrency, other route, other query: none of them is the bare cell of this one.
      measurement({ path: "bare", concurrency: 64 }),
      measurement({ path: "bare", route: "proxy" }),
      measurement({ path: "bare", query: "indexed" }),
      // Zero throughput: no ratio rather than Infinity.
      measurement({ path: "newconn", rps: 0, p50Ms: 0 }),
    ]);
    expect(r).toMatchObject({
      vsBare: null,
      vsBareRounds: null,
      vsNewconn: null,
      vsNoop: null,
      vsPg: null,
      cpuVsBare: null,
      isolateCpuVsBare: null,
      p50VsBare: null,
      p50VsNewconn: null,
    });
  });

  it("makes one ratio per Lessor cell, and none for Lessor through another transport or log level", () => {
    const out = ratios([
      measurement({ concurrency: 1 }),
      measurement({ concurrency: 8, route: "proxy" }),
      measurement({ transport: "undici" }),
      measurement({ logLevel: "warn" }),
      measurement({ path: "bare" }),
    ]);
    expect(out.map((r) => [r.route, r.concurrency])).toEqual([
      ["direct", 1],
      ["proxy", 8],
    ]);
  });

  it("marks a ratio contended when either Lessor or the bare object ran while other work did", () => {
    const [quiet, noisyBare] = ratios([
      measurement({ concurrency: 1 }),
      measurement({ path: "bare", concurrency: 1 }),
      measurement({ concurrency: 8 }),
      measurement({ path: "bare", concurrency: 8, contended: true }),
    ]);
    expect(quiet?.contended).toBe(false);
    expect(noisyBare?.contended).toBe(true);
  });
});

describe("pairedRatios", () => {
  it("takes the median of round-by-round ratios, with the lowest and highest", () => {
    expect(pairedRatios([100, 300, 200], [100, 100, 100])).toEqual({ median: 2, min: 1, max: 3, rounds: 3 });
    // An even count: the mean of the two middle ratios.
    expect(pairedRatios([1, 2, 3, 4], [1, 1, 1, 1])).toEqual({ median: 2.5, min: 1, max: 4, rounds: 4 });
  });

  it("pairs rounds by index, not by sorted value", () => {
    // Sorted separately these would pair 1/1 and 2/2; by round they are 2/1 and 1/2.
    expect(pairedRatios([2, 1], [1, 2])).toEqual({ median: 1.25, min: 0.5, max: 2, rounds: 2 });
  });

  it("skips rounds where the baseline did nothing and stops at the shorter list", () => {
    expect(pairedRatios([10, 10, 10], [0, 5])).toEqual({ median: 2, min: 2, max: 2, rounds: 1 });
  });

  it("is null without rounds to pair", () => {
    expect(pairedRatios(undefined, [1])).toBeNull();
    expect(pairedRatios([1], undefined)).toBeNull();
    expect(pairedRatios([], [])).toBeNull();
    expect(pairedRatios([1, 2], [0, 0])).toBeNull();
  });
});

describe("judgeTargets", () => {
  const byName = (targets: ReturnType<typeof judgeTargets>, start: string) => {
    const target = targets.find((t) => t.target.startsWith(start));
    if (!target) throw new Error(`no target "${start}"`);
    return target;
  };

  it("meets the three warm-path targets when every direct cell is at or past its bound", () => {
    const targets = judgeTargets(
      [
        ratio({ concurrency: 1 }),
        // Exactly on each bound counts as met.
        ratio({
          concurrency: 8,
          vsBareRounds: { median: 0.9, min: 0.8, max: 1, rounds: 8 },
          isolateCpuVsBare: 1.2,
          vsNewconn: 10,
        }),
      ],
      null,
    );
    expect(targets).toHaveLength(3);
    expect(targets.every((t) => t.met)).toBe(true);
    expect(byName(targets, "Lessor warm path ≥ 90%").detail).toMatch(/^2 of 2 cells/);
  });

  it("misses a target when one direct cell falls short, and says which", () => {
    const targets = judgeTargets(
      [
        ratio({ concurrency: 1 }),
        ratio({
          concurrency: 64,
          vsBareRounds: { median: 0.89, min: 0.8, max: 0.95, rounds: 8 },
          isolateCpuVsBare: 1.21,
          vsNewconn: 9.9,
        }),
      ],
      null,
    );
    const paired = byName(targets, "Lessor warm path ≥ 90%");
    expect(paired.met).toBe(false);
    expect(paired.detail).toContain("1 of 2 cells");
    expect(paired.detail).toContain("select1 c=64: 0.89 (rounds 0.80–0.95)");
    expect(byName(targets, "Lessor's isolate CPU").met).toBe(false);
    expect(byName(targets, "Lessor warm path ≥ 10×").met).toBe(false);
  });

  it("judges the bare-object target on the paired median, falling back to the whole run's ratio", () => {
    // The whole run's ratio passes but the paired median does not: the median decides.
    const byMedian = judgeTargets(
      [ratio({ vsBare: 1.1, vsBareRounds: { median: 0.85, min: 0.8, max: 1.3, rounds: 8 } })],
      null,
    );
    expect(byName(byMedian, "Lessor warm path ≥ 90%").met).toBe(false);
    // No rounds (results files before 2026-12-01): the whole run's ratio.
    expect(
      byName(judgeTargets([ratio({ vsBare: 0.95, vsBareRounds: null })], null), "Lessor warm path ≥ 90%").met,
    ).toBe(true);
    expect(
      byName(judgeTargets([ratio({ vsBare: 0.5, vsBareRounds: null })], null), "Lessor warm path ≥ 90%").met,
    ).toBe(false);
  });

  it("counts a cell whose baseline is missing as missed, never as met", () => {
    const targets = judgeTargets(
      [
        ratio({ concurrency: 1 }),
        ratio({ vsBare: null, vsBareRounds: null, isolateCpuVsBare: null, vsNewconn: null }),
      ],
      null,
    );
    for (const target of targets) {
      expect(target.met).toBe(false);
      expect(target.detail).toMatch(/^1 of 2 cells/);
    }
    expect(byName(targets, "Lessor warm path ≥ 90%").detail).toContain("select1 c=8: –");
  });

  it("judges only the direct route, and misses every target when there is no direct cell", () => {
    const slowProxy = ratio({
      route: "proxy",
      vsBareRounds: { median: 0.1, min: 0.1, max: 0.1, rounds: 8 },
      isolateCpuVsBare: 9,
      vsNewconn: 1,
    });
    expect(judgeTargets([ratio(), slowProxy], null).every((t) => t.met)).toBe(true);
    const none = judgeTargets([ratio({ route: "proxy" })], null);
    expect(none.map((t) => t.met)).toEqual([false, false, false]);
    expect(none[0]?.detail).toMatch(/^0 of 0 cells/);
  });

  it("adds the storm's targets: exactly one start, and p99 within the warm burst's plus two cold starts", () => {
    const good = judgeTargets([ratio()], storm());
    expect(good).toHaveLength(5);
    expect(byName(good, "Storm makes exactly one start").met).toBe(true);
    // 300 + 2 × 100 = 500: exactly on the limit is met.
    const p99 = byName(good, "Storm p99");
    expect(p99.met).toBe(true);
    expect(p99.detail).toContain("= 500 ms");
    expect(byName(judgeTargets([ratio()], storm({ p99Ms: 501 })), "Storm p99").met).toBe(false);
  });

  it("misses the one-start target on a second start counted any of three ways, or on an error", () => {
    const one = { runtimeGeneration: 1, applicationNames: 1, generationLedgerRows: 1 };
    for (const starts of [
      { ...one, runtimeGeneration: 2 },
      { ...one, applicationNames: 2 },
      { ...one, generationLedgerRows: 0 },
    ]) {
      expect(byName(judgeTargets([ratio()], storm({ starts })), "Storm makes exactly one start").met).toBe(
        false,
      );
    }
    expect(byName(judgeTargets([ratio()], storm({ errors: 1 })), "Storm makes exactly one start").met).toBe(
      false,
    );
  });
});

describe("verdictLine", () => {
  const met = { target: "A", met: true, detail: "" };
  const missed = { target: "B", met: false, detail: "" };

  it("says all goals met only when none is missed", () => {
    expect(verdictLine([met, met], [measurement()])).toBe("GOALS: all 2 met");
  });

  it("names the missed goals", () => {
    expect(verdictLine([met, missed, { ...missed, target: "C" }], [])).toBe("GOALS MISSED: 2 of 3 (B; C)");
  });

  it("says how many measurements ran while other work did, met or missed", () => {
    const measurements = [measurement(), measurement({ contended: true }), measurement({ contended: true })];
    expect(verdictLine([met], measurements)).toBe(
      "GOALS: all 1 met; 2 of 3 measurements ran while other work did (†): hints, not results",
    );
    expect(verdictLine([missed], measurements)).toMatch(/^GOALS MISSED: 1 of 1 \(B\); 2 of 3 measurements/);
  });
});

describe("totalCpu and fixed", () => {
  it("adds every process's CPU but the machine's", () => {
    expect(totalCpu(measurement({ cpuMsPerRequest: cpu({ machine: 100 }) }))).toBeCloseTo(1);
  });

  it("prints a dash for a missing value and fixed digits otherwise", () => {
    expect(fixed(null, 2)).toBe("–");
    expect(fixed(0, 2)).toBe("0.00");
    expect(fixed(1.005, 1)).toBe("1.0");
  });
});
