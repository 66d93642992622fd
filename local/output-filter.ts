/**
 * What `npm start` shows of Postgres's log and of wrangler's output.
 *
 * Postgres logs a great deal; only its errors are shown. A normal shutdown makes noise that is no
 * error: Postgres ends each open connection with a FATAL, and the Worker's pools warn that they
 * lost those connections. That noise is hidden once a shutdown is under way, and only then, so the
 * same lines at any other time (someone terminated backends, the database went away) still show.
 * A shutdown is under way when `npm start` begins one, or when Postgres says it received a
 * shutdown request: a terminal's Ctrl-C reaches Postgres directly, often before `npm start`
 * has reacted.
 */
import { StringDecoder } from "node:string_decoder";

export interface StackOutputFilter {
  /** Whether this line of Postgres's log is shown. */
  showPostgres(line: string): boolean;
  /** Whether this line of wrangler's output (the Worker's logs among it) is shown. */
  showWorker(line: string): boolean;
  /** `npm start` is stopping the stack. */
  expectShutdown(): void;
}

const postgresShutdownRequest = /received (smart|fast|immediate) shutdown request/;
const postgresError = /\b(ERROR|FATAL|PANIC)\b/;
const postgresShutdownNoise =
  /FATAL:\s+(terminating .* due to administrator command|the database system is shutting down)/;
const workerShutdownNoise = /"event":"pool_connection_error"/;

/** A filter with its own notion of whether a shutdown is under way. */
export function stackOutputFilter(): StackOutputFilter {
  let shuttingDown = false;
  return {
    showPostgres(line) {
      if (postgresShutdownRequest.test(line)) shuttingDown = true;
      if (!postgresError.test(line)) return false;
      return !(shuttingDown && postgresShutdownNoise.test(line));
    },
    showWorker(line) {
      return !(shuttingDown && workerShutdownNoise.test(line));
    },
    expectShutdown() {
      shuttingDown = true;
    },
  };
}

/**
 * Cuts a byte stream into lines for `onLine` (without the newline), however the chunks fall.
 * `flush` hands over a last line that had no newline.
 */
export function lineSplitter(onLine: (line: string) => void): {
  push(chunk: Buffer | string): void;
  flush(): void;
} {
  // A chunk may end inside a multi-byte character (wrangler prints a few); the decoder holds it back.
  const decoder = new StringDecoder("utf8");
  let partial = "";
  return {
    push(chunk) {
      const lines = (partial + (typeof chunk === "string" ? chunk : decoder.write(chunk))).split("\n");
      partial = lines.pop() ?? "";
      for (const line of lines) onLine(line);
    },
    flush() {
      partial += decoder.end();
      if (partial !== "") onLine(partial);
      partial = "";
    },
  };
}
