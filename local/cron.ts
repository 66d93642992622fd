/**
 * The local stand-in for Cloudflare's cron trigger. `wrangler dev` never fires cron triggers by
 * itself; with `--test-scheduled` it runs the scheduled handler on `GET /__scheduled`. So that
 * folds, campaign batches, budget reconciles and erase resumes happen locally as they do
 * deployed, `npm start` calls that route at the start of every minute, as `* * * * *` would.
 */

/** The cron expression the local trigger reports (the one wrangler.toml schedules). */
export const localCronExpression = "* * * * *";

/** `LESSOR_LOCAL_CRON` turns the self-trigger off with `off`, `0`, `false` or `no`; anything else keeps it on. */
export function localCronEnabled(value: string | undefined): boolean {
  return !["off", "0", "false", "no"].includes((value ?? "").trim().toLowerCase());
}

/**
 * How early a timer may fire and still be the tick it was set for. Node's timers run on a
 * monotonic clock and can fire a millisecond before the wall-clock minute; measured from there,
 * the "next" minute was a millisecond away, a second tick followed at once, and `npm start`
 * printed "previous scheduled run still going; this minute skipped" for a minute that was not.
 */
export const earlyTimerToleranceMs = 500;

/**
 * Milliseconds from `now` to the start of the next wall-clock minute (never 0). A `now` within
 * {@link earlyTimerToleranceMs} before a minute counts as that minute: the next is the one after.
 */
export function msUntilNextMinute(now: number): number {
  const untilNext = 60_000 - (now % 60_000);
  return untilNext <= earlyTimerToleranceMs ? untilNext + 60_000 : untilNext;
}

/** The URL that makes `wrangler dev --test-scheduled` run the scheduled handler. */
export function scheduledUrl(baseUrl: string): string {
  return `${baseUrl}/__scheduled?cron=${localCronExpression.replaceAll(" ", "+")}`;
}

/**
 * Runs the scheduled handler once. Never throws: resolves undefined on success, or one line
 * saying what went wrong (the stack must survive a failed or slow run).
 */
export async function triggerScheduled(baseUrl: string, timeoutMs = 55_000): Promise<string | undefined> {
  try {
    const response = await fetch(scheduledUrl(baseUrl), { signal: AbortSignal.timeout(timeoutMs) });
    const body = await response.text();
    if (response.ok) return undefined;
    return `HTTP ${response.status}: ${oneLine(body)}`;
  } catch (error) {
    if (error instanceof Error && error.name === "TimeoutError") return `no answer within ${timeoutMs} ms`;
    return oneLine(describeFetchError(error));
  }
}

/** A running self-trigger. */
export interface LocalCron {
  stop(): void;
}

/**
 * Calls {@link triggerScheduled} at every `delay` (by default at each minute's start). A run still
 * going when the next is due is not doubled: that tick is skipped and said so.
 */
export function startLocalCron(options: {
  baseUrl: string;
  log: (line: string) => void;
  delay?: (now: number) => number;
  timeoutMs?: number;
}): LocalCron {
  const delay = options.delay ?? msUntilNextMinute;
  let running = false;
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  const schedule = () => {
    timer = setTimeout(tick, delay(Date.now()));
  };
  const tick = () => {
    schedule();
    if (running) {
      options.log("[cron] previous scheduled run still going; this minute skipped");
      return;
    }
    running = true;
    void triggerScheduled(options.baseUrl, options.timeoutMs).then((failure) => {
      running = false;
      // A run cut short by the stack's own shutdown is no failure worth a line.
      if (failure !== undefined && !stopped) options.log(`[cron] scheduled self-trigger failed: ${failure}`);
    });
  };
  schedule();
  return {
    stop: () => {
      stopped = true;
      if (timer !== undefined) clearTimeout(timer);
      timer = undefined;
    },
  };
}

function oneLine(text: string): string {
  const flat = text.replace(/\s+/g, " ").trim();
  return flat.length > 200 ? `${flat.slice(0, 200)}…` : flat;
}

/** fetch's own message is "fetch failed"; the reason (ECONNREFUSED, …) is in its cause. */
function describeFetchError(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const cause: unknown = error.cause;
  if (cause instanceof Error) {
    const code = (cause as NodeJS.ErrnoException).code;
    return `${error.message}: ${code ? `${code} ` : ""}${cause.message}`;
  }
  return error.message;
}
