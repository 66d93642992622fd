import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { type CronJob, type CronTick, runGuarded, runJobs } from "../../src/cron/fan-out.ts";

const env = {} as Env;
const tick: CronTick = {
  cron: "* * * * *",
  scheduledTime: Date.parse("2026-11-29T12:00:00Z"),
  region: "default",
};

function logLines(spy: { mock: { calls: unknown[][] } }): Record<string, unknown>[] {
  return spy.mock.calls.map((call) => JSON.parse(String(call[0])) as Record<string, unknown>);
}

describe("cron fan-out", () => {
  let log: ReturnType<typeof vi.spyOn>;
  let warn: ReturnType<typeof vi.spyOn>;
  let error: ReturnType<typeof vi.spyOn>;
  beforeEach(() => {
    log = vi.spyOn(console, "log").mockImplementation(() => undefined);
    warn = vi.spyOn(console, "warn").mockImplementation(() => undefined);
    error = vi.spyOn(console, "error").mockImplementation(() => undefined);
  });
  afterEach(() => {
    vi.restoreAllMocks();
  });

  it("runs every job even when others throw, reject or throw synchronously", async () => {
    const ran: string[] = [];
    const jobs: CronJob[] = [
      {
        name: "rejects",
        run: async () => {
          ran.push("rejects");
          throw new Error("postgres://u:secret@host/db is down");
        },
      },
      {
        name: "throws-synchronously",
        run: () => {
          ran.push("throws-synchronously");
          throw new Error("bad");
        },
      },
      {
        name: "fine",
        run: async () => {
          ran.push("fine");
          return { summary: "folded 3 rows", fields: { foldedRows: 3 } };
        },
      },
    ];
    const waited: Promise<unknown>[] = [];
    const reports = await runJobs(jobs, env, tick, ["default"], (promise) => waited.push(promise));
    expect(ran.sort()).toEqual(["fine", "rejects", "throws-synchronously"]);
    expect(waited).toHaveLength(3);
    expect(reports.map((r) => [r.job, r.status])).toEqual([
      ["rejects", "failed"],
      ["throws-synchronously", "failed"],
      ["fine", "ok"],
    ]);
    const failures = logLines(error);
    expect(failures).toHaveLength(2);
    expect(failures.map((line) => [line.event, line.job, line.status]).sort()).toEqual([
      ["cron_job", "rejects", "failed"],
      ["cron_job", "throws-synchronously", "failed"],
    ]);
    // Logged failures never carry a credential.
    expect(JSON.stringify(failures)).not.toContain("secret");
    expect(logLines(log)).toEqual([
      expect.objectContaining({
        event: "cron_job",
        job: "fine",
        status: "ok",
        summary: "folded 3 rows",
        foldedRows: 3,
        cron: "* * * * *",
        scheduledAt: "2026-11-29T12:00:00.000Z",
      }),
    ]);
  });

  it("logs at the level a job asks for", async () => {
    await runGuarded(
      {
        name: "pinned",
        run: async () => ({ summary: "skipped: pinned by pid 1 for 9 seconds", level: "warn" }),
      },
      env,
      tick,
    );
    expect(logLines(warn)).toEqual([expect.objectContaining({ job: "pinned", status: "ok" })]);
  });

  it("logs nothing for a run that changed nothing (unless it warns), and still reports it", async () => {
    const jobs: CronJob[] = [
      { name: "idle", run: async () => ({ summary: "no erase due", changed: false }) },
      {
        name: "idle-but-warns",
        run: async () => ({ summary: "1 campaign(s): blocked", changed: false, level: "warn" }),
      },
      { name: "worked", run: async () => ({ summary: "folded 3 rows", changed: true }) },
      { name: "does-not-say", run: async () => ({ summary: "aged out 2 audit row(s)" }) },
      {
        name: "idle-then-fails",
        run: async () => {
          throw new Error("control plane unreachable");
        },
      },
    ];
    const reports = await runJobs(jobs, env, tick, ["default"], () => undefined);
    // The caller (and the tests, and /__scheduled) still sees every run.
    expect(reports.map((r) => [r.job, r.status, r.summary])).toEqual([
      ["idle", "ok", "no erase due"],
      ["idle-but-warns", "ok", "1 campaign(s): blocked"],
      ["worked", "ok", "folded 3 rows"],
      ["does-not-say", "ok", "aged out 2 audit row(s)"],
      ["idle-then-fails", "failed", "Error: control plane unreachable"],
    ]);
    expect(logLines(log).map((line) => line.job)).toEqual(["worked", "does-not-say"]);
    expect(logLines(warn).map((line) => line.job)).toEqual(["idle-but-warns"]);
    expect(logLines(error).map((line) => line.job)).toEqual(["idle-then-fails"]);
  });

  it("reports a job that outlives its timeout without waiting for it", async () => {
    let release: () => void = () => undefined;
    const hanging = new Promise<void>((resolve) => {
      release = resolve;
    });
    const report = await runGuarded(
      {
        name: "hangs",
        timeoutMs: 10,
        run: async () => {
          await hanging;
          return { summary: "late" };
        },
      },
      env,
      tick,
    );
    release();
    expect(report).toMatchObject({ job: "hangs", status: "timed_out" });
    expect(logLines(error)).toEqual([expect.objectContaining({ job: "hangs", status: "timed_out" })]);
  });

  it("runs only the jobs due on this cron", async () => {
    const jobs: CronJob[] = [
      { name: "every-tick", run: async () => ({ summary: "ok" }) },
      { name: "hourly", crons: ["0 * * * *"], run: async () => ({ summary: "ok" }) },
      { name: "minutely", crons: ["* * * * *"], run: async () => ({ summary: "ok" }) },
    ];
    const reports = await runJobs(jobs, env, tick, ["default"], () => undefined);
    expect(reports.map((r) => r.job)).toEqual(["every-tick", "minutely"]);
  });

  it("runs every job once per region, each on its own: a region whose control plane is down fails only its runs", async () => {
    const seen: string[] = [];
    const jobs: CronJob[] = [
      {
        name: "erase-resume",
        run: async (_env, { region }) => {
          seen.push(`erase-resume@${region}`);
          if (region === "eu") throw new Error("control plane of eu unreachable");
          return { summary: "no erase due" };
        },
      },
      {
        name: "usage-fold",
        run: async (_env, { region }) => {
          seen.push(`usage-fold@${region}`);
          return { summary: `folded ${region}` };
        },
      },
    ];
    const reports = await runJobs(jobs, env, tick, ["us", "eu"], () => undefined);
    expect(seen.sort()).toEqual(["erase-resume@eu", "erase-resume@us", "usage-fold@eu", "usage-fold@us"]);
    expect(reports.map((r) => [r.job, r.region, r.status])).toEqual([
      ["erase-resume", "us", "ok"],
      ["usage-fold", "us", "ok"],
      ["erase-resume", "eu", "failed"],
      ["usage-fold", "eu", "ok"],
    ]);
    // Each run's log line names its region.
    expect(logLines(error)).toEqual([
      expect.objectContaining({ job: "erase-resume", region: "eu", status: "failed" }),
    ]);
  });
});
