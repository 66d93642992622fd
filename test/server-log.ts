/**
 * The test clusters' own log, kept where the tests can read it back: Postgres logs every
 * connection it authorizes and every disconnection, each line prefixed with the backend's pid and
 * application name, and the global setup appends what the server writes to a file the tests read
 * through `pg_read_file` (test/integration/server-log.ts). What the server logged is what happened,
 * so a test can compute an exact peak of backends instead of sampling `pg_stat_activity`.
 */
import { appendFileSync, rmSync } from "node:fs";
import { resolve } from "node:path";

/** `|`-separated prefix: timestamp, pid, application name, user, database, then the message. */
export const serverLogLinePrefix = "%m|%p|%a|%u|%d|";

/** Postgres flags that make the server log each connection and disconnection (test stacks only). */
export const serverLogFlags: readonly string[] = [
  "-c",
  "log_connections=on",
  "-c",
  "log_disconnections=on",
  "-c",
  `log_line_prefix=${serverLogLinePrefix}`,
];

/**
 * A file next to the cluster's data folder that receives the server's log. Postgres writes each
 * message to its stderr in one write, so each chunk the sink gets ends at a line's end.
 */
export function serverLogFile(dataDir: string): {
  path: string;
  append: (text: string) => void;
  remove: () => void;
} {
  const path = resolve(`${dataDir}.server.log`);
  rmSync(path, { force: true });
  return {
    path,
    append: (text) => appendFileSync(path, text.endsWith("\n") ? text : `${text}\n`),
    remove: () => rmSync(path, { force: true }),
  };
}
