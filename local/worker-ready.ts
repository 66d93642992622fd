/**
 * Waiting for a `wrangler dev` that a script spawned (the browser test, the demo) to serve the
 * Worker, and saying why when it does not.
 *
 * `GET /` touches nothing but the configuration (src/app.ts), so once wrangler answers, an error
 * from Lessor there is a setting the Worker refuses, and no amount of waiting changes it: that
 * fails at once. A refused connection or wrangler's own error page (while it builds or reloads)
 * is waited out. Every failure carries the last thing seen and wrangler's own output, so the
 * reader sees wrangler's reason instead of a bare "fetch failed".
 */
import type { ChildProcess } from "node:child_process";

// biome-ignore lint/suspicious/noControlCharactersInRegex: an ANSI colour sequence starts with ESC.
const ansiEscape = /\x1b\[[0-9;]*m/g;

/** Lines of wrangler's output a failure shows at most (its end: where the reason is). */
export const shownOutputLines = 60;

/**
 * Keeps the last `limit` lines of a child's stdout and stderr, interleaved as they arrive, for a
 * failure message. `text()` is what has been kept so far.
 */
export function outputTail(limit = 300): { push(chunk: Buffer | string): void; text(): string } {
  const lines: string[] = [];
  let partial = "";
  return {
    push(chunk) {
      const parts = (partial + chunk.toString()).split("\n");
      partial = parts.pop() ?? "";
      // wrangler colours its errors even into a pipe; a failure message is read as plain text.
      for (const line of parts) if (line.trim() !== "") lines.push(line.replace(ansiEscape, ""));
      if (lines.length > limit) lines.splice(0, lines.length - limit);
    },
    text() {
      return [...lines, ...(partial.trim() === "" ? [] : [partial.replace(ansiEscape, "")])].join("\n");
    },
  };
}

/** What one look at the Worker found. */
type Look = { kind: "ready" } | { kind: "refused"; what: string } | { kind: "not_yet"; what: string };

async function look(url: string, probeTimeoutMs: number): Promise<Look> {
  let response: Response;
  try {
    response = await fetch(url, { signal: AbortSignal.timeout(probeTimeoutMs) });
  } catch (error) {
    return { kind: "not_yet", what: describeFetchFailure(error) };
  }
  const body = await response.text().catch(() => "");
  if (response.ok) return { kind: "ready" };
  const what = `HTTP ${response.status}: ${oneLine(body)}`;
  return isLessorError(body) ? { kind: "refused", what } : { kind: "not_yet", what };
}

/** An error body of Lessor's own (`{"code": …, "message": …}`), as opposed to wrangler's. */
function isLessorError(body: string): boolean {
  try {
    const parsed = JSON.parse(body) as unknown;
    return (
      typeof parsed === "object" && parsed !== null && typeof (parsed as { code?: unknown }).code === "string"
    );
  } catch {
    return false;
  }
}

/**
 * Resolves once `url` answers 200. Rejects, with wrangler's output (`output()`, its last
 * {@link shownOutputLines} lines) in the message: at once when `child` exits or Lessor answers with
 * an error; after `timeoutMs` otherwise, naming the last answer or connection error seen.
 */
export async function waitForWorker(options: {
  url: string;
  child: ChildProcess;
  output: () => string;
  timeoutMs: number;
  intervalMs?: number;
  probeTimeoutMs?: number;
}): Promise<void> {
  const { url, child, output, timeoutMs } = options;
  const intervalMs = options.intervalMs ?? 250;
  const deadline = Date.now() + timeoutMs;
  const fail = (reason: string): Error => {
    const tail = output().split("\n").slice(-shownOutputLines).join("\n");
    return new Error(`${reason}\nwrangler's output (last ${shownOutputLines} lines):\n${tail || "(none)"}`);
  };
  let last = "nothing yet";
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw fail(`wrangler dev exited (${child.exitCode ?? child.signalCode}) before ${url} answered`);
    }
    const seen = await look(url, options.probeTimeoutMs ?? 2_000);
    if (seen.kind === "ready") return;
    if (seen.kind === "refused") {
      // The Worker logs its reason (which setting) as it answers; wrangler prints that, then the
      // request's own line. Wait for that line, briefly, so the reason is in the message.
      await outputSettles(output, requestLine(url), 3_000);
      throw fail(`wrangler dev runs, but the Worker refuses to serve: GET ${url} answered ${seen.what}`);
    }
    last = seen.what;
    if (Date.now() >= deadline) {
      throw fail(`wrangler dev did not answer GET ${url} within ${timeoutMs} ms; last seen: ${last}`);
    }
    await new Promise((done) => setTimeout(done, intervalMs));
  }
}

/** wrangler's line for a request to `url` (`[wrangler:info] GET / 500 Internal Server Error (3ms)`). */
function requestLine(url: string): RegExp {
  const path = new URL(url).pathname.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`\\bGET ${path} \\d{3}\\b`);
}

/** Resolves once `output()` matches `line`, or after `boundMs` whatever it holds. */
async function outputSettles(output: () => string, line: RegExp, boundMs: number): Promise<void> {
  const deadline = Date.now() + boundMs;
  while (!line.test(output()) && Date.now() < deadline) await new Promise((done) => setTimeout(done, 50));
}

function oneLine(text: string): string {
  const flat = text.replace(/\s+/g, " ").trim();
  return flat.length > 300 ? `${flat.slice(0, 300)}…` : flat;
}

/** fetch's own message is "fetch failed"; the reason (ECONNREFUSED, …) is in its cause. */
function describeFetchFailure(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  if (error.name === "TimeoutError") return "no answer within the probe's timeout";
  const cause: unknown = error.cause;
  if (cause instanceof Error) {
    const code = (cause as NodeJS.ErrnoException).code;
    return `${error.message}: ${code ? `${code} ` : ""}${cause.message}`;
  }
  return error.message;
}
