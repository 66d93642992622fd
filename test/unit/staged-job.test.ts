/**
 * The staged-job runner (src/tenant-object/kernel/staged-job.ts) on a job held in memory: its
 * progress row is a plain object here, as the control plane's row is for erase and move, and the
 * alarm is a list of the times it was armed for. What the runner promises every job: single
 * flight, the row moved on after each stage, backoff after a failure, a failure the control plane
 * could not hear of recorded with the next attempt, a bound on stages per run, `again` re-reads the
 * row, a test's interruption stops the run with nothing recorded.
 */
import { describe, expect, it, vi } from "vitest";
import { InterruptedForTests } from "../../src/erase/test-hooks.ts";
import {
  type StagedJob,
  StagedJobRunner,
  type StagePoint,
  type StageResult,
} from "../../src/tenant-object/kernel/staged-job.ts";
import type { TenantRuntime } from "../../src/tenant-object/runtime.ts";

type Stage = "one" | "two" | "three";
const order: Stage[] = ["one", "two", "three"];

interface Row {
  id: number;
  stage: Stage;
  done: boolean;
  attempts: number;
  lastError: string | null;
  counts: Partial<Record<Stage, Record<string, number>>>;
}

/** A job whose row is `row`; `work` is what each stage does (default: done, with one count). */
function memoryJob(options: {
  row: Row | null;
  work?: (stage: Stage, runs: number) => Promise<StageResult>;
  controlPlaneDown?: () => boolean;
  stagesPerRun?: number;
}) {
  const steps: string[] = [];
  const runs = new Map<Stage, number>();
  const reach = () => {
    if (options.controlPlaneDown?.()) throw new Error("control plane unreachable");
  };
  const job: StagedJob<Row, Stage> = {
    name: "memory",
    stagesPerRun: options.stagesPerRun ?? 10,
    retryDelay: (failures) => failures * 1_000,
    load: async () => {
      reach();
      return options.row === null ? null : { ...options.row };
    },
    next: async (_tenantId, row) => (row === null || row.done ? null : row.stage),
    run: async (_row, stage) => {
      const n = (runs.get(stage) ?? 0) + 1;
      runs.set(stage, n);
      return options.work ? options.work(stage, n) : { kind: "done", counts: { [stage]: 1 } };
    },
    advance: async (row, stage, counts) => {
      reach();
      const live = options.row as Row;
      live.counts[stage] = counts;
      const next = order[order.indexOf(stage) + 1];
      if (next === undefined) {
        live.done = true;
        return false;
      }
      live.stage = next;
      return row.id > 0;
    },
    idOf: (row) => row.id,
    heldId: () => options.row?.id ?? null,
    recordFailure: async (id, failures, message) => {
      reach();
      const live = options.row as Row;
      expect(id).toBe(live.id);
      live.attempts += failures;
      live.lastError = message;
    },
    fields: () => ({}),
    step: async (_tenantId, step: StagePoint<Stage>) => {
      steps.push(`${step.point}:${step.stage ?? "-"}`);
    },
  };
  const armed: number[] = [];
  const rt = { alarms: { rearm: async (at: number) => void armed.push(at) } } as unknown as TenantRuntime;
  return { runner: new StagedJobRunner(rt, job), steps, runs, armed };
}

const freshRow = (): Row => ({ id: 7, stage: "one", done: false, attempts: 0, lastError: null, counts: {} });

describe("the staged-job runner", () => {
  it("runs every stage in order, recording each before the next starts", async () => {
    const row = freshRow();
    const { runner, steps } = memoryJob({ row });
    await runner.resume("t");
    expect(row).toMatchObject({
      done: true,
      attempts: 0,
      counts: { one: { one: 1 }, two: { two: 1 }, three: { three: 1 } },
    });
    expect(steps).toEqual([
      "started:one",
      "worked:one",
      "recorded:one",
      "started:two",
      "worked:two",
      "recorded:two",
      "started:three",
      "worked:three",
      "recorded:three",
    ]);
  });

  it("is single-flight: concurrent callers join one run, and no stage runs twice", async () => {
    const row = freshRow();
    let release: () => void = () => undefined;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const { runner, runs } = memoryJob({
      row,
      work: async (stage) => {
        if (stage === "one") await held;
        return { kind: "done", counts: {} };
      },
    });
    const callers = [runner.resume("t"), runner.resume("t"), runner.resume("t")];
    release();
    await Promise.all(callers);
    expect(Object.fromEntries(runs)).toEqual({ one: 1, two: 1, three: 1 });
    expect(row.done).toBe(true);
  });

  it("backs off after a failure: the alarm is armed for the retry, and a tick before it runs nothing", async () => {
    vi.useFakeTimers({ now: 1_000_000, toFake: ["Date"] });
    try {
      const row = freshRow();
      const { runner, runs, armed, steps } = memoryJob({
        row,
        work: async (stage, n) => {
          if (stage === "two" && n === 1) throw new Error("host unreachable");
          return { kind: "done", counts: {} };
        },
      });
      await runner.resume("t");
      expect(row).toMatchObject({
        stage: "two",
        done: false,
        attempts: 1,
        lastError: "two: Error: host unreachable",
      });
      expect(steps.at(-1)).toBe("failed:two");
      expect(armed).toEqual([1_001_000]);
      expect(runner.retryAt).toBe(1_001_000);

      await runner.tick("t");
      expect(runs.get("two")).toBe(1);
      expect(armed).toEqual([1_001_000, 1_001_000]);

      vi.setSystemTime(1_001_000);
      await runner.tick("t");
      expect(row.done).toBe(true);
      expect(runner.retryAt).toBe(1_001_000);
    } finally {
      vi.useRealTimers();
    }
  });

  it("keeps a failure the control plane could not hear of, and records it with the next attempt", async () => {
    const row = freshRow();
    let down = true;
    const { runner } = memoryJob({ row, controlPlaneDown: () => down });
    await runner.resume("t");
    await runner.resume("t");
    // Twice unreachable: nothing reached the row.
    expect(row.attempts).toBe(0);
    down = false;
    await runner.resume("t");
    expect(row).toMatchObject({
      attempts: 2,
      lastError: "load: Error: control plane unreachable",
      done: true,
    });
  });

  it("yields after its bound of stages when a stage keeps being sent back, and the alarm takes it up", async () => {
    const row = freshRow();
    const { runner, runs, armed } = memoryJob({
      row,
      stagesPerRun: 4,
      work: async () => ({ kind: "again" }),
    });
    await runner.resume("t");
    expect(runs.get("one")).toBe(4);
    expect(armed).toHaveLength(1);
    expect(row.attempts).toBe(0);
  });

  it("a stage that finishes the job settles between its hooks, and nothing is advanced after it", async () => {
    const row = freshRow();
    const settled: string[] = [];
    const { runner, steps } = memoryJob({
      row,
      work: async (stage) =>
        stage === "two"
          ? { kind: "finished", settle: async () => void settled.push(`settled after ${steps.at(-1)}`) }
          : { kind: "done", counts: {} },
    });
    await runner.resume("t");
    expect(settled).toEqual(["settled after worked:two"]);
    expect(steps.slice(-2)).toEqual(["worked:two", "recorded:two"]);
    expect(row.stage).toBe("two");
  });

  it("a test's interruption stops the run as a dead isolate would: nothing recorded, nothing armed", async () => {
    const row = freshRow();
    const { runner, armed } = memoryJob({
      row,
      work: async (stage) => {
        if (stage === "two") throw new InterruptedForTests("killed at two");
        return { kind: "done", counts: {} };
      },
    });
    await runner.resume("t");
    expect(row).toMatchObject({ stage: "two", attempts: 0, lastError: null });
    expect(armed).toEqual([]);
  });

  it("with no row, or a finished one, runs nothing", async () => {
    const none = memoryJob({ row: null });
    await none.runner.resume("t");
    expect(none.steps).toEqual([]);
    const row = { ...freshRow(), done: true };
    const done = memoryJob({ row });
    await done.runner.resume("t");
    expect(done.steps).toEqual([]);
  });
});
