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
  // Sealed values (src/crypto/seal.ts): `v1.<iv>.<ciphertext>`, `v2.<key id>.<iv>.<ciphertext>`.
  [/\bv[12]\.(?:[A-Za-z0-9_-]{1,16}\.)?[A-Za-z0-9+/]{16,}={0,2}\.[A-Za-z0-9+/]{16,}={0,2}/g, "[redacted]"],
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

/** How long a sampled event stays quiet after a line, per key (a tenant, say). */
export const sampleWindowMs = 10_000;
const sampled = new Map<string, { quietUntil: number; suppressed: number }>();
/** Keys remembered at most: past it the memory starts over (a line more, never a line lost for good). */
const maxSampledKeys = 1_000;

/**
 * A log line for an event a caller can cause on every request (an oversized answer, a statement
 * that timed out, a refused checkout): the first of `event` for `key` is written at once, then at
 * most one a window, carrying how many were left out since (`suppressed`). A flood of one tenant's
 * bad requests costs a few lines, and nothing goes unseen.
 */
export function logEventSampled(
  level: LogLevel,
  event: string,
  key: string,
  fields: Record<string, unknown>,
  now: number = Date.now(),
): void {
  const id = `${event}\u0000${key}`;
  const seen = sampled.get(id);
  if (seen && now < seen.quietUntil) {
    seen.suppressed++;
    return;
  }
  if (!seen && sampled.size >= maxSampledKeys) sampled.clear();
  const suppressed = seen?.suppressed ?? 0;
  sampled.set(id, { quietUntil: now + sampleWindowMs, suppressed: 0 });
  logEvent(level, event, suppressed > 0 ? { ...fields, suppressed } : fields);
}
