/**
 * The one logger. Every log line Lessor writes is one JSON object, passed through `redact` so that
 * no credential reaches a log even by mistake, and handed to the current sink: the console in
 * production, something a test installs to silence or capture lines (`setLogSink`).
 */

export type LogLevel = "info" | "warn" | "error";

/** Receives each finished (already redacted) log line. */
export type LogSink = (level: LogLevel, line: string) => void;

const consoleSink: LogSink = (level, line) => {
  if (level === "error") console.error(line);
  else if (level === "warn") console.warn(line);
  else console.log(line);
};

let sink: LogSink = consoleSink;

/**
 * Routes every log line to `next` until the returned function is called, which restores the sink
 * that was installed before. Tests use it to capture lines (and assert no secret is in them).
 */
export function setLogSink(next: LogSink): () => void {
  const previous = sink;
  sink = next;
  return () => {
    sink = previous;
  };
}

const secretPatterns: ReadonlyArray<readonly [RegExp, string]> = [
  // postgres://user:password@host: keep the user and host, drop the password.
  [/(postgres(?:ql)?:\/\/[^:/@\s]*:)[^@\s]*@/gi, "$1[redacted]@"],
  // Lessor keys, wherever they appear.
  [/\blsk_[A-Za-z0-9_-]{8,}/g, "[redacted]"],
  // password=... in libpq keyword form or JSON-ish text.
  [/(password["']?\s*[:=]\s*["']?)[^"'\s,}]+/gi, "$1[redacted]"],
];

/** Removes anything that looks like a credential from text bound for a log line. */
export function redact(text: string): string {
  let out = text;
  for (const [pattern, replacement] of secretPatterns) out = out.replace(pattern, replacement);
  return out;
}

/** One structured log line, credentials redacted. Never pass a stack. */
export function logEvent(level: LogLevel, event: string, fields: Record<string, unknown>): void {
  sink(level, redact(JSON.stringify({ level, event, ...fields })));
}
