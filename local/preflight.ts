/**
 * Checks `npm start` makes before it starts anything, so that a second start or a taken port
 * fails at once with one clear line instead of half-starting a stack that then hangs or crashes.
 */
import { closeSync, openSync, readFileSync, unlinkSync, writeSync } from "node:fs";
import { createServer } from "node:net";
import { resolve } from "node:path";

/** The command line of `npm start`'s own process, when /proc can tell (see {@link isRunning}). */
export const lessorCommand = /local\/start\.ts/;
/** The command line of a Postgres postmaster, when /proc can tell. */
export const postgresCommand = /postgres/;

/** The pid in the first line of a pid file, or undefined if there is no such file or no pid in it. */
export function readPidFile(path: string): number | undefined {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
  const pid = Number(text.split("\n", 1)[0]?.trim());
  return Number.isInteger(pid) && pid > 0 ? pid : undefined;
}

/**
 * Whether `pid` is a live process whose command line matches `command`. A pid file outlives a
 * killed run and its pid can be reused by an unrelated process: where /proc exists the command
 * line tells ours from theirs; elsewhere a live pid is taken as ours.
 */
export function isRunning(pid: number, command: RegExp): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    // EPERM: it exists but belongs to another user (Postgres runs as `postgres` under root).
    if ((error as NodeJS.ErrnoException).code !== "EPERM") return false;
  }
  let cmdline: string;
  try {
    cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ");
  } catch {
    return true;
  }
  return command.test(cmdline);
}

/** The URL in the second line of Lessor's pid file (what that start serves on), if there is one. */
export function readPidFileUrl(path: string): string | undefined {
  try {
    const url = readFileSync(path, "utf8").split("\n")[1]?.trim();
    return url ? url : undefined;
  } catch {
    return undefined;
  }
}

/** What already runs on a state folder. */
export type RunningInstance =
  | { kind: "lessor"; pid: number; url?: string }
  | { kind: "postgres"; pid: number };

/**
 * Claims `<stateDir>/lessor.pid` for this process, atomically (`wx`), so two starts racing each
 * other cannot both win. A pid file whose process is gone is stale and taken over. Then checks
 * `<stateDir>/pg/postmaster.pid`: a live Postgres there without a live Lessor was left behind by
 * a run that was killed, and starting over it would fail inside Postgres with a less clear error.
 *
 * Returns a release function (removes the pid file if it is still ours), or what is running.
 */
export function claimStateDir(
  stateDir: string,
  pid = process.pid,
  url?: string,
): { ok: true; release(): void } | { ok: false; running: RunningInstance } {
  const pidFile = resolve(stateDir, "lessor.pid");
  for (let attempt = 0; attempt < 3; attempt++) {
    let fd: number;
    try {
      fd = openSync(pidFile, "wx", 0o644);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      const other = readPidFile(pidFile);
      if (other !== undefined && other !== pid && isRunning(other, lessorCommand)) {
        const otherUrl = readPidFileUrl(pidFile);
        return { ok: false, running: { kind: "lessor", pid: other, ...(otherUrl ? { url: otherUrl } : {}) } };
      }
      unlinkSync(pidFile);
      continue;
    }
    // The second line says where this start serves, for the next start's refusal.
    writeSync(fd, url ? `${pid}\n${url}\n` : `${pid}\n`);
    closeSync(fd);
    const release = () => {
      if (readPidFile(pidFile) === pid) unlinkSync(pidFile);
    };
    const postmaster = readPidFile(resolve(stateDir, "pg", "postmaster.pid"));
    if (postmaster !== undefined && isRunning(postmaster, postgresCommand)) {
      release();
      return { ok: false, running: { kind: "postgres", pid: postmaster } };
    }
    return { ok: true, release };
  }
  // Another start keeps claiming the file between our unlink and our open: say so, guess nothing.
  throw new Error(`could not claim ${pidFile}: another start is claiming it at the same time`);
}

/** The one line `npm start` prints for what {@link claimStateDir} found. */
export function describeRunning(running: RunningInstance, stateDir: string): string {
  if (running.kind === "lessor")
    return (
      `Lessor is already running${running.url ? ` at ${running.url}` : ""} (pid ${running.pid}, state in ${stateDir}); ` +
      `use it, or stop it with Ctrl-C in its terminal or: kill -INT ${running.pid}`
    );
  return (
    `a Postgres left by an earlier run still runs on ${resolve(stateDir, "pg")} (pid ${running.pid}); ` +
    `stop it with: kill -INT ${running.pid}`
  );
}

/**
 * Whether something already listens on `host:port`, found by trying to listen there. Binding
 * 127.0.0.1 also collides with a listener on 0.0.0.0 or a dual-stack [::].
 */
export function portInUse(port: number, host = "127.0.0.1"): Promise<boolean> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once("error", (error: NodeJS.ErrnoException) =>
      error.code === "EADDRINUSE" ? done(true) : fail(error),
    );
    server.listen({ port, host, exclusive: true }, () => server.close(() => done(false)));
  });
}

/** A port number from an environment variable, or `fallback` when it is unset or empty. */
export function portFromEnv(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined || value === "") return fallback;
  const port = Number(value);
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new Error(`${name} must be a port number (1-65535), not ${JSON.stringify(value)}`);
  }
  return port;
}
