/**
 * `.lessor/postgres.log`: everything the local Postgres logs during one `npm start`, where the
 * console shows only Lessor's and the server's errors (local/output-filter.ts). Tenants' own SQL
 * errors are found here. A start moves the previous run's file to `postgres.log.1`; a file that
 * passes `maxBytes` (a tenant can make Postgres log an error per statement) is moved there too, so
 * the two files together hold at most twice that.
 */
import { closeSync, existsSync, openSync, renameSync, writeSync } from "node:fs";

/** Where a run's Postgres log goes once it passed this size: its `.1` file, replacing that. */
export const postgresLogMaxBytes = 64 * 1024 * 1024;

export interface PostgresLogFile {
  /** Appends one line (a newline is added). */
  line(text: string): void;
  close(): void;
}

/** Opens `path` for this run (owner-only), moving what a previous run left to `<path>.1`. */
export function openPostgresLog(path: string, maxBytes = postgresLogMaxBytes): PostgresLogFile {
  const rotate = () => {
    if (existsSync(path)) renameSync(path, `${path}.1`);
    return openSync(path, "w", 0o600);
  };
  let fd = rotate();
  let written = 0;
  return {
    line(text) {
      const bytes = Buffer.from(`${text}\n`);
      if (written > 0 && written + bytes.length > maxBytes) {
        closeSync(fd);
        fd = rotate();
        written = 0;
      }
      writeSync(fd, bytes);
      written += bytes.length;
    },
    close() {
      closeSync(fd);
    },
  };
}
