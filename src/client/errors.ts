/**
 * Lessor's refusals as typed errors. The Neon driver turns any non-400 answer into
 * `Server error (HTTP status N): <text>` and drops the headers, so the client reads the answer
 * itself before the driver sees it. Parsing is defensive: a proxy in front of Lessor may answer with
 * HTML, no body or no `Retry-After`.
 */

/** A non-2xx answer from Lessor that is not a Postgres error (those stay the driver's `NeonDbError`). */
export class LessorResponseError extends Error {
  override readonly name = "LessorResponseError";
  /**
   * Lessor's stable snake_case code (`tenant_draining`, `statement_timeout`, …), `unexpected_response`
   * for an answer that is not Lessor's, or `unreachable` when no answer came at all.
   */
  readonly code: string;
  /** The HTTP status of the last answer; 0 when Lessor could not be reached. */
  readonly status: number;
  /** Seconds the answer asked to wait (`Retry-After`), if it named any. */
  readonly retryAfter: number | undefined;
  /** How many times the request was sent before giving up (1 when it was not retried). */
  readonly attempts: number;

  constructor(answer: ErrorAnswer, attempts = 1, options?: { cause?: unknown }) {
    super(answer.message, options);
    this.code = answer.code;
    this.status = answer.status;
    this.retryAfter = answer.retryAfter;
    this.attempts = attempts;
  }
}

/** What the client learns from one non-2xx answer. */
export interface ErrorAnswer {
  status: number;
  code: string;
  message: string;
  /** Seconds, from `Retry-After` (delta-seconds or an HTTP date). */
  retryAfter: number | undefined;
}

/** Code of an answer whose body names none (a proxy's HTML page, an empty body). */
export const unexpectedResponseCode = "unexpected_response";

/** A Postgres SQLSTATE: five digits or capital letters (Lessor's own codes are snake_case). */
const sqlStatePattern = /^[0-9A-Z]{5}$/;

/** Longest piece of an unexpected body kept in a message: enough to recognise it, no page dumps. */
const bodyExcerptLength = 200;

/**
 * True for an answer the driver should see as it is: a 400 whose code is a SQLSTATE is a Postgres
 * error (or Lessor's Postgres-shaped authentication failure, `28P01`), and the driver turns it into a
 * `NeonDbError` with its Postgres fields, as it does on Neon.
 */
export function isPostgresError(answer: ErrorAnswer): boolean {
  return answer.status === 400 && sqlStatePattern.test(answer.code);
}

/** Reads a non-2xx answer's status, code, message and `Retry-After`; never throws. */
export async function readErrorAnswer(
  response: Response,
  nowMs: number,
): Promise<ErrorAnswer & { body: string }> {
  const body = await response.text().catch(() => "");
  const fields = jsonObject(body);
  const code =
    fields !== undefined && typeof fields.code === "string" && fields.code !== "" ? fields.code : "";
  const message =
    fields !== undefined && typeof fields.message === "string" && fields.message !== ""
      ? fields.message
      : `Lessor answered HTTP ${response.status}${body.trim() === "" ? "" : `: ${body.trim().slice(0, bodyExcerptLength)}`}`;
  return {
    status: response.status,
    code: code === "" ? unexpectedResponseCode : code,
    message,
    retryAfter: parseRetryAfter(response.headers.get("Retry-After"), nowMs),
    body,
  };
}

/**
 * `Retry-After` in seconds: delta-seconds, or an HTTP date (counted from `nowMs`, never negative).
 * Anything else is no hint at all.
 */
export function parseRetryAfter(header: string | null, nowMs: number): number | undefined {
  if (header === null) return undefined;
  const value = header.trim();
  if (/^\d+$/.test(value)) return Number(value);
  const at = Date.parse(value);
  // Only an HTTP date (it names a weekday) counts: Date.parse also accepts "1.5" and other noise.
  if (Number.isNaN(at) || !/^[A-Za-z]{3}, /.test(value)) return undefined;
  return Math.max(0, Math.ceil((at - nowMs) / 1000));
}

function jsonObject(text: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(text);
    return typeof value === "object" && value !== null && !Array.isArray(value)
      ? (value as Record<string, unknown>)
      : undefined;
  } catch {
    return undefined;
  }
}
