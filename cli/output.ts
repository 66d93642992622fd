/**
 * lessorctl's output: `key=value` lines for people and `grep`, one JSON document with `--json` for
 * machines. Values with spaces or quotes are written as JSON strings, so a line always splits on
 * spaces; a missing value is `-`.
 */

/** Where a command writes; the entry point gives it the process' streams, tests capture it. */
export interface Output {
  /** One line on stdout. */
  line(text: string): void;
  /** One line on stderr. */
  error(text: string): void;
  /** Whether stdout is a terminal (progress bars redraw in place only there). */
  isTTY: boolean;
  /** Rewrites the current terminal line (no newline); only called when `isTTY`. */
  redraw(text: string): void;
}

/** A value as it appears after `key=`. */
export function formatValue(value: unknown): string {
  if (value === null || value === undefined || value === "") return "-";
  if (Array.isArray(value)) return value.length === 0 ? "-" : value.map(formatValue).join(",");
  const text =
    typeof value === "string" ? value : typeof value === "object" ? JSON.stringify(value) : String(value);
  return /[\s"=]/.test(text) ? JSON.stringify(text) : text;
}

/** `tag key=value key=value`, or just the pairs when `tag` is empty. */
export function kv(tag: string, pairs: Record<string, unknown>): string {
  const fields = Object.entries(pairs).map(([key, value]) => `${key}=${formatValue(value)}`);
  return [tag, ...fields].filter((part) => part !== "").join(" ");
}

/** A duration as an operator reads it: `45s`, `43m`, `2h5m`, `3d4h`. */
export function formatDuration(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "-";
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 24) return m % 60 === 0 ? `${h}h` : `${h}h${m % 60}m`;
  const d = Math.floor(h / 24);
  return h % 24 === 0 ? `${d}d` : `${d}d${h % 24}h`;
}

/** A text progress bar: `[█████░░░░░]`. */
export function progressBar(done: number, total: number, width = 30): string {
  const ratio = total <= 0 ? 1 : Math.min(1, Math.max(0, done / total));
  const filled = Math.round(ratio * width);
  return `[${"█".repeat(filled)}${"░".repeat(width - filled)}]`;
}

/** The streams of this process. */
export function processOutput(): Output {
  return {
    line: (text) => process.stdout.write(`${text}\n`),
    error: (text) => process.stderr.write(`${text}\n`),
    isTTY: process.stdout.isTTY === true,
    redraw: (text) => process.stdout.write(`\r\x1b[2K${text}`),
  };
}
