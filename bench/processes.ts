/**
 * The processes a bench run starts (the stack, `wrangler dev`) and what it reads about them from
 * /proc: which workerd serves the Worker itself (behind wrangler dev's proxy), and how much CPU
 * each part of the local server spends.
 */
import { type ChildProcess, fork, spawn } from "node:child_process";
import {
  cpSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  symlinkSync,
} from "node:fs";
import { resolve } from "node:path";
import { extraCaFileTrusting, freePort, wranglerDevArgs, writeEnvFile } from "../local/stack.ts";
import { ensureLocalTls } from "../local/tls.ts";
import { lightFetch } from "./load.ts";
import type { BenchStackInfo } from "./stack.ts";

export const root = resolve(import.meta.dirname, "..");

export { freePort };

/** Rejects after `ms` with `what` in the message; the timer never keeps the process alive. */
export function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
    timer.unref();
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

export interface RunningStack {
  info: BenchStackInfo;
  child: ChildProcess;
  stop(): Promise<void>;
}

/** Forks bench/stack.ts and waits (bounded) until its Postgres and proxy are up. */
export async function startStack(options: {
  dataDir: string;
  pgPort: number;
  password: string;
}): Promise<RunningStack> {
  const child = fork(
    resolve(import.meta.dirname, "stack.ts"),
    [options.dataDir, String(options.pgPort), options.password],
    { cwd: root, stdio: ["ignore", "inherit", "inherit", "ipc"] },
  );
  const ready = new Promise<BenchStackInfo>((done, reject) => {
    child.once("message", (message) => {
      const typed = message as BenchStackInfo | { type: "failed"; message: string };
      if (typed.type === "ready") done(typed);
      else reject(new Error(`local stack failed to start: ${typed.message}`));
    });
    child.once("exit", (code) => reject(new Error(`local stack exited early (code ${code})`)));
  });
  let info: BenchStackInfo;
  try {
    info = await within(ready, 120_000, "local stack start");
  } catch (error) {
    child.kill("SIGTERM");
    throw error;
  }
  return {
    info,
    child,
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise<void>((done) => child.once("exit", () => done()));
      if (child.connected) child.send("stop");
      else child.kill("SIGTERM");
      await within(exited, 30_000, "local stack stop").catch(() => {
        child.kill("SIGKILL");
      });
    },
  };
}

export interface RunningWrangler {
  child: ChildProcess;
  /** Output lines kept for diagnostics (the last 200). */
  output: string[];
  stop(): Promise<void>;
  /** Last resort on exit: SIGKILL to wrangler's whole process group (it and its workerd). */
  killNow(): void;
}

/**
 * Bundles the bench Worker once, as wrangler bundles it for a deploy, into `outDir`/worker.js.
 *
 * Why a snapshot: `wrangler dev` watches every source file of its bundle and reloads on each change,
 * and a reload restarts workerd and every Durable Object. In a working tree that others edit while
 * the bench runs, that would measure several versions of the code and break requests in flight.
 */
export async function buildWorker(outDir: string): Promise<string> {
  const child = spawn(
    process.execPath,
    [
      resolve(root, "node_modules/wrangler/bin/wrangler.js"),
      "deploy",
      "--dry-run",
      "--outdir",
      outDir,
      "-c",
      "bench/wrangler.toml",
    ],
    {
      cwd: root,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, WRANGLER_SEND_METRICS: "false", CI: "1" },
    },
  );
  const output: string[] = [];
  child.stdout?.on("data", (chunk: Buffer) => output.push(chunk.toString()));
  child.stderr?.on("data", (chunk: Buffer) => output.push(chunk.toString()));
  const code = await within(
    new Promise<number | null>((done) => child.once("exit", (exitCode) => done(exitCode))),
    120_000,
    "bundling the bench Worker",
  ).catch((error: unknown) => {
    child.kill("SIGKILL");
    throw error;
  });
  if (code !== 0)
    throw new Error(`bundling the bench Worker failed (code ${code}):\n${output.join("").slice(-2_000)}`);
  return resolve(outDir, "worker.js");
}

/**
 * Starts `wrangler dev` with the bench config on a bundle from `buildWorker` (`--no-bundle`: nothing
 * to watch) and waits (bounded) until the bench Worker answers.
 */
export async function startWrangler(options: {
  script: string;
  port: number;
  inspectorPort: number;
  envFile: string;
  persistTo: string;
  logLevel?: string;
}): Promise<RunningWrangler> {
  const child = spawn(
    process.execPath,
    [
      resolve(root, "node_modules/wrangler/bin/wrangler.js"),
      "dev",
      options.script,
      "--no-bundle",
      "-c",
      "bench/wrangler.toml",
      "--ip",
      "127.0.0.1",
      "--port",
      String(options.port),
      "--inspector-port",
      String(options.inspectorPort),
      "--env-file",
      options.envFile,
      "--show-interactive-dev-session=false",
      "--persist-to",
      options.persistTo,
      ...(options.logLevel ? ["--log-level", options.logLevel] : []),
    ],
    {
      cwd: root,
      // Its own process group: wrangler runs a second node and two workerd under it, and stopping
      // the group stops them all (none of them outlives a bench run that crashed).
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: {
        ...process.env,
        // workerd trusts the local authority that signed the stack's Postgres certificate (the
        // stack runs in a child of its own, whose environment this process does not see).
        // With one already set (this machine sets its system bundle), both: the bench failed every
        // provisioning with host_tls_refused when the local authority was left out.
        NODE_EXTRA_CA_CERTS: extraCaFileTrusting(ensureLocalTls()),
        // No metrics from a benchmark, no prompts, and no reload when a config file is touched.
        WRANGLER_SEND_METRICS: "false",
        CI: "1",
        WRANGLER_CI_DISABLE_CONFIG_WATCHING: "true",
      },
    },
  );
  const output: string[] = [];
  const keep = (chunk: Buffer) => {
    for (const line of chunk.toString().split("\n")) if (line.trim()) output.push(line);
    if (output.length > 200) output.splice(0, output.length - 200);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  const exited = new Promise<never>((_, reject) =>
    child.once("exit", (code) =>
      reject(new Error(`wrangler dev exited early (code ${code}):\n${output.slice(-30).join("\n")}`)),
    ),
  );
  // Ready when the Worker itself answers (a quieter log level prints no "Ready on" line).
  let abandoned = false;
  const ready = (async () => {
    for (let attempt = 0; attempt < 480 && !abandoned && child.exitCode === null; attempt++) {
      try {
        const response = await fetch(`http://127.0.0.1:${options.port}/bench/noop`, {
          signal: AbortSignal.timeout(2_000),
        });
        if ((await response.text()) === "bench-noop") return;
      } catch {
        // Not listening yet.
      }
      await new Promise((done) => setTimeout(done, 250));
    }
    throw new Error("the bench Worker never answered /bench/noop");
  })();
  const signalGroup = (signal: NodeJS.Signals) => {
    if (child.pid === undefined) return;
    try {
      process.kill(-child.pid, signal);
    } catch {
      // The group is gone already.
    }
  };
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) {
      signalGroup("SIGKILL");
      return;
    }
    const exited = new Promise<void>((done) => child.once("exit", () => done()));
    signalGroup("SIGTERM");
    await within(exited, 15_000, "wrangler stop").catch(() => undefined);
    // Whatever of the group is still there (a workerd that ignored SIGTERM) goes now.
    signalGroup("SIGKILL");
  };
  try {
    await within(Promise.race([ready, exited]), 130_000, "wrangler dev start");
  } catch (error) {
    abandoned = true;
    await stop();
    throw error;
  }
  return { child, output, stop, killNow: () => signalGroup("SIGKILL") };
}

// ── wrangler dev --test-scheduled, on a snapshot of the sources ─────────────────────────────────

/** One `cron_job` log line of the Worker: a cron job's end, with its outcome and duration. */
export interface CronLine {
  job: string;
  status: string;
  durationMs: number;
  summary?: string;
  fields: Record<string, unknown>;
  receivedAt: number;
}

export interface ScheduledWrangler {
  child: ChildProcess;
  /** wrangler dev's own port. */
  port: number;
  /** wrangler dev's own URL: /__scheduled is served by the middleware wrangler adds to the bundle. */
  publicUrl: string;
  /** Every `cron_job` line so far. */
  cron: CronLine[];
  /** The last lines wrangler and the Worker printed, for diagnostics. */
  tail(lines?: number): string;
  stop(): Promise<void>;
  /** Last resort on exit: SIGKILL to wrangler's whole process group. */
  killNow(): void;
}

/**
 * A copy of the sources for `wrangler dev` to bundle and watch: `--test-scheduled` works by adding a
 * middleware while bundling, so the Worker cannot be a prebuilt bundle, and a watched file that
 * someone edits would reload the Worker (restarting every Durable Object) mid-measurement.
 */
export function snapshotSources(snapshotDir: string, benchFiles: readonly string[]): void {
  rmSync(snapshotDir, { recursive: true, force: true });
  mkdirSync(resolve(snapshotDir, "bench"), { recursive: true });
  cpSync(resolve(root, "src"), resolve(snapshotDir, "src"), { recursive: true });
  for (const file of benchFiles) cpSync(resolve(root, "bench", file), resolve(snapshotDir, "bench", file));
  for (const file of ["package.json", "tsconfig.json", "worker-configuration.d.ts"]) {
    if (existsSync(resolve(root, file))) cpSync(resolve(root, file), resolve(snapshotDir, file));
  }
  symlinkSync(resolve(root, "node_modules"), resolve(snapshotDir, "node_modules"), "dir");
}

/**
 * Starts `wrangler dev --test-scheduled -c <config>` on a fresh snapshot of the sources (see
 * `snapshotSources`), with the Worker's own log lines on (`cron_job` lines are collected), and waits
 * (bounded) until the Worker answers `/bench/noop`. Runs in a process group of its own.
 */
export async function startScheduledWrangler(options: {
  env: Record<string, string>;
  envFile: string;
  persistDir: string;
  snapshotDir: string;
  /** A private dev registry: another wrangler dev on this machine would otherwise reload this one. */
  registryDir: string;
  /** The wrangler config, relative to the snapshot (`bench/fleet-wrangler.toml`). */
  config: string;
  /** The files of bench/ the Worker needs. */
  benchFiles: readonly string[];
  /** Called with every line wrangler and the Worker print. */
  onLine?: (line: string) => void;
}): Promise<ScheduledWrangler> {
  writeEnvFile(options.envFile, options.env);
  snapshotSources(options.snapshotDir, options.benchFiles);
  const port = await freePort();
  const child = spawn(
    process.execPath,
    wranglerDevArgs({
      port,
      envFile: options.envFile,
      persistTo: options.persistDir,
      inspectorPort: await freePort(),
      testScheduled: true,
      // The Worker's console lines carry the cron jobs' durations.
      extra: ["-c", options.config, "--log-level", "log"],
    }),
    {
      cwd: options.snapshotDir,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: {
        ...process.env,
        WRANGLER_SEND_METRICS: "false",
        CI: "1",
        WRANGLER_CI_DISABLE_CONFIG_WATCHING: "true",
        WRANGLER_REGISTRY_PATH: options.registryDir,
      },
    },
  );
  const output: string[] = [];
  const cron: CronLine[] = [];
  const partial = { stdout: "", stderr: "" };
  for (const stream of ["stdout", "stderr"] as const) {
    child[stream]?.on("data", (chunk: Buffer) => {
      const lines = (partial[stream] + chunk.toString()).split("\n");
      partial[stream] = lines.pop() ?? "";
      for (const line of lines) {
        if (!line.trim()) continue;
        output.push(line);
        if (output.length > 300) output.splice(0, output.length - 300);
        options.onLine?.(line);
        if (!line.includes('"event":"cron_job"')) continue;
        try {
          const parsed = JSON.parse(line.slice(line.indexOf("{"), line.lastIndexOf("}") + 1)) as Record<
            string,
            unknown
          >;
          const { job, status, durationMs, summary, ...fields } = parsed;
          cron.push({
            job: String(job),
            status: String(status),
            durationMs: Number(durationMs),
            ...(typeof summary === "string" ? { summary } : {}),
            fields,
            receivedAt: Date.now(),
          });
        } catch {
          // Not one line of JSON after all.
        }
      }
    });
  }
  const signal = (name: NodeJS.Signals) => {
    if (child.pid === undefined) return;
    try {
      process.kill(-child.pid, name);
    } catch {
      // Gone already.
    }
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((done) => child.once("exit", () => done()));
      signal("SIGTERM");
      await within(exited, 15_000, "wrangler stop").catch(() => undefined);
    }
    signal("SIGKILL");
  };
  let up = false;
  for (let attempt = 0; attempt < 600 && child.exitCode === null; attempt++) {
    try {
      const response = await fetch(`http://127.0.0.1:${port}/bench/noop`, {
        signal: AbortSignal.timeout(2_000),
      });
      if ((await response.text()) === "bench-noop") {
        up = true;
        break;
      }
    } catch {
      // Not yet.
    }
    await new Promise((done) => setTimeout(done, 250));
  }
  if (!up || child.pid === undefined) {
    await stop();
    throw new Error(`wrangler dev did not start:\n${output.slice(-30).join("\n")}`);
  }
  return {
    child,
    port,
    publicUrl: `http://127.0.0.1:${port}`,
    cron,
    tail: (lines = 40) => output.slice(-lines).join("\n"),
    stop,
    killNow: () => signal("SIGKILL"),
  };
}

/**
 * Fires one cron tick through `/__scheduled` and waits (bounded) until each of `jobs` has logged
 * its end (the jobs run under waitUntil, after the route answers).
 */
export async function cronTick(
  worker: ScheduledWrangler,
  jobs: readonly string[] = ["usage-fold", "budget-reconcile", "migration-campaigns"],
  timeoutMs = 120_000,
): Promise<CronLine[]> {
  const before = worker.cron.length;
  const response = await lightFetch(`${worker.publicUrl}/__scheduled?cron=*+*+*+*+*`);
  if (!response.ok) throw new Error(`/__scheduled: ${response.status} ${await response.text()}`);
  await response.text();
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const lines = worker.cron.slice(before);
    const seen = new Set(lines.map((l) => l.job));
    if (jobs.every((job) => seen.has(job))) return lines;
    if (performance.now() > deadline) {
      throw new Error(`a cron tick did not finish within ${timeoutMs / 1000} s:\n${worker.tail()}`);
    }
    await new Promise((done) => setTimeout(done, 20));
  }
}

// ── /proc ────────────────────────────────────────────────────────────────────────────────────────

interface ProcStat {
  pid: number;
  ppid: number;
  comm: string;
  /** utime + stime + cutime + cstime, in clock ticks: the process's own CPU and its reaped children's. */
  ticks: number;
}

/** Linux reports CPU time in clock ticks of 1/100 s on every platform Node runs on. */
const ticksPerSecond = 100;

function readStat(pid: number): ProcStat | null {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return null;
  }
  // The command name is in parentheses and may itself hold spaces or parentheses.
  const open = text.indexOf("(");
  const close = text.lastIndexOf(")");
  const rest = text.slice(close + 2).split(" ");
  const field = (index: number) => Number(rest[index - 3]);
  return {
    pid,
    ppid: field(4),
    comm: text.slice(open + 1, close),
    ticks: field(14) + field(15) + field(16) + field(17),
  };
}

function allStats(): ProcStat[] {
  const stats: ProcStat[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = readStat(Number(entry));
    if (stat) stats.push(stat);
  }
  return stats;
}

/** Every live process under `pid` (not `pid` itself). */
export function descendants(pid: number, stats: ProcStat[] = allStats()): ProcStat[] {
  const children = new Map<number, ProcStat[]>();
  for (const stat of stats) {
    const list = children.get(stat.ppid) ?? [];
    list.push(stat);
    children.set(stat.ppid, list);
  }
  const found: ProcStat[] = [];
  const queue = [pid];
  for (let next = queue.shift(); next !== undefined; next = queue.shift()) {
    for (const child of children.get(next) ?? []) {
      found.push(child);
      queue.push(child.pid);
    }
  }
  return found;
}

/** TCP ports a process listens on (IPv4 and IPv6), from its socket inodes and /proc/net/tcp*. */
export function listeningPorts(pid: number): number[] {
  const inodes = new Set<string>();
  let fds: string[] = [];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return [];
  }
  for (const fd of fds) {
    try {
      const target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      const match = /^socket:\[(\d+)\]$/.exec(target);
      if (match?.[1]) inodes.add(match[1]);
    } catch {
      // The descriptor closed while we looked.
    }
  }
  const ports = new Set<number>();
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text = "";
    try {
      text = readFileSync(table, "utf8");
    } catch {
      continue;
    }
    for (const line of text.split("\n").slice(1)) {
      const columns = line.trim().split(/\s+/);
      const local = columns[1];
      const state = columns[3];
      const inode = columns[9];
      // State 0A is LISTEN.
      if (!local || state !== "0A" || !inode || !inodes.has(inode)) continue;
      const port = Number.parseInt(local.slice(local.lastIndexOf(":") + 1), 16);
      if (Number.isInteger(port)) ports.add(port);
    }
  }
  return [...ports];
}

/** The parts of the local server whose CPU a measurement reports. */
export interface CpuGroups {
  /** wrangler's own Node process (bundler, dev-server controller, log sink). */
  wranglerNode: number[];
  /** The workerd that runs wrangler dev's proxy worker (the public port). */
  workerdProxy: number[];
  /** The workerd that runs the Worker itself (Lessor, the baselines, the Durable Objects). */
  workerdWorker: number[];
  /** The stack process: the WebSocket-to-TCP proxy. */
  wsProxy: number[];
  /** The Postgres postmaster (its ticks include every backend it reaped) and its live backends. */
  postgres: number[];
}

/** CPU seconds by group; `machine` is every process on the machine (from /proc/stat). */
export type CpuSample = Record<keyof CpuGroups | "benchClient" | "machine", number>;

/** Busy CPU seconds of the whole machine so far (user, nice, system, irq, softirq, steal). */
function machineBusySeconds(): number {
  const line = readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "";
  const [, user, nice, system, , , irq, softirq, steal] = line.trim().split(/\s+/).map(Number);
  return (
    ((user ?? 0) + (nice ?? 0) + (system ?? 0) + (irq ?? 0) + (softirq ?? 0) + (steal ?? 0)) / ticksPerSecond
  );
}

/** CPU seconds used so far by each group (live processes, plus children they reaped). */
export function sampleCpu(groups: CpuGroups): CpuSample {
  const stats = allStats();
  const byPid = new Map(stats.map((stat) => [stat.pid, stat]));
  const sum = (pids: number[]) => pids.reduce((total, pid) => total + (byPid.get(pid)?.ticks ?? 0), 0);
  const postgresRoots = groups.postgres;
  const postgresPids = [
    ...postgresRoots,
    ...postgresRoots.flatMap((pid) => descendants(pid, stats).map((s) => s.pid)),
  ];
  const usage = process.cpuUsage();
  return {
    wranglerNode: sum(groups.wranglerNode) / ticksPerSecond,
    workerdProxy: sum(groups.workerdProxy) / ticksPerSecond,
    workerdWorker: sum(groups.workerdWorker) / ticksPerSecond,
    wsProxy: sum(groups.wsProxy) / ticksPerSecond,
    postgres: sum(postgresPids) / ticksPerSecond,
    benchClient: (usage.user + usage.system) / 1e6,
    machine: machineBusySeconds(),
  };
}

/** The difference of two samples, in CPU seconds per group. */
export function cpuDelta(before: CpuSample, after: CpuSample): CpuSample {
  const delta = {} as CpuSample;
  for (const key of Object.keys(after) as (keyof CpuSample)[]) delta[key] = after[key] - before[key];
  return delta;
}

/** What the bench learns about a running `wrangler dev`. */
export interface WranglerLayout {
  /** The port of the workerd that runs the Worker itself, behind wrangler dev's proxy. */
  directPort: number;
  groups: Omit<CpuGroups, "wsProxy" | "postgres">;
}

/**
 * Finds the workerd that runs the bench Worker: wrangler dev runs two workerd processes (one for
 * its proxy worker on the public port, one for the Worker), and the Worker's own workerd listens on
 * a random loopback port that wrangler does not print. Every port a wrangler workerd listens on is
 * asked for /bench/noop; the one that answers, other than the public port, is the Worker's own.
 */
export async function findWranglerLayout(wranglerPid: number, publicPort: number): Promise<WranglerLayout> {
  const tree = descendants(wranglerPid);
  const workerds = tree.filter((process) => process.comm === "workerd");
  let direct: { pid: number; port: number } | undefined;
  let proxyPid: number | undefined;
  for (const workerd of workerds) {
    for (const port of listeningPorts(workerd.pid)) {
      if (port === publicPort) {
        proxyPid = workerd.pid;
        continue;
      }
      try {
        const response = await fetch(`http://127.0.0.1:${port}/bench/noop`, {
          signal: AbortSignal.timeout(2_000),
        });
        if ((await response.text()) === "bench-noop") direct = { pid: workerd.pid, port };
      } catch {
        // An inspector or loopback port, not the Worker's.
      }
    }
  }
  if (!direct || proxyPid === undefined) {
    throw new Error(
      `could not find wrangler dev's two workerd processes (found ${workerds.length}); is this Linux?`,
    );
  }
  return {
    directPort: direct.port,
    groups: {
      wranglerNode: [wranglerPid, ...tree.filter((p) => p.comm === "node").map((p) => p.pid)],
      workerdProxy: [proxyPid],
      workerdWorker: [direct.pid],
    },
  };
}
