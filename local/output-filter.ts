/**
 * What `npm start` shows of Postgres's log and of wrangler's output: every line it prints says
 * something to the operator.
 *
 * Postgres logs a great deal; only its errors are shown, and of those only Lessor's and the
 * server's own. A line of a tenant's session (its role is a tenant role, `t_…`, or its end users'
 * `t_…_jwt`) is that tenant's business: a tenant key is a SQL prompt, and its syntax errors, failed
 * statements and timeouts are answered to the tenant. Those lines are kept in `.lessor/postgres.log`
 * with the rest of the log (`npm start` writes every line there), never echoed. `npm start` runs
 * Postgres with a prefix that names each session's role and database (`postgresLogFlags`), which is
 * how a line is told apart; a line without one (part of a message that spans lines) belongs to the
 * message before it.
 *
 * A normal shutdown makes noise that is no error: Postgres ends each open connection with a FATAL,
 * and the Worker's pools (tenants' and the control plane's) warn that they lost those connections.
 * That noise is hidden once a shutdown is under way, and only then, so the same lines at any other
 * time (someone terminated backends, the database went away) still show. A shutdown is under way when `npm start` begins
 * one, or when Postgres says it received a shutdown request: a terminal's Ctrl-C reaches Postgres
 * directly, often before `npm start` has reacted.
 *
 * Of wrangler's output, two kinds of line are left out. A request's line (`[wrangler:info] POST
 * /sql 200 OK (8ms)`) says nothing an operator acts on, one per request: shown only with
 * `LESSOR_LOCAL_REQUEST_LOG=on`. And wrangler prints its 20-line table of the Worker's bindings
 * again on every configuration reload: it is shown once, and after a reload only the bindings that
 * changed, if any.
 */
import { StringDecoder } from "node:string_decoder";
import { tenantObjectNamePattern } from "../src/core/names.ts";

export interface StackOutputFilter {
  /** Whether this line of Postgres's log is shown. */
  showPostgres(line: string): boolean;
  /** The lines to show for this line of wrangler's output (the Worker's logs among it): none, it, or others. */
  worker(line: string): string[];
  /** `npm start` is stopping the stack. */
  expectShutdown(): void;
}

/**
 * Postgres flags for `npm start`: a prefix that names each session's role and database (`%q`
 * leaves them out of lines no session wrote), and no statement text in the log. A statement
 * that failed can carry a secret (an `ALTER ROLE … PASSWORD` a tenant typed); the error's own
 * line says what failed.
 */
export const postgresLogFlags: readonly string[] = [
  "-c",
  "log_line_prefix=%m [%p] %q%u@%d ",
  "-c",
  "log_min_error_statement=panic",
];

/** A line that starts a message: time, pid, then the session's `role@database` when a session wrote it. */
const postgresMessage = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ \[\d+\] (?:(\S+)@\S+ )?([A-Z]+):\s/;
const postgresShutdownRequest = /received (smart|fast|immediate) shutdown request/;
const postgresError = /\b(ERROR|FATAL|PANIC)\b/;
const postgresShutdownNoise =
  /FATAL:\s+(terminating .* due to administrator command|the database system is shutting down)/;
/** A pool of the Worker (a tenant's, a control-plane shard's) told that Postgres ended a connection. */
const workerShutdownNoise = /"event":"(pool|control_plane)_connection_error"/;

// biome-ignore lint/suspicious/noControlCharactersInRegex: an ANSI colour sequence starts with ESC.
const ansiEscape = /\x1b\[[0-9;]*m/g;
/** wrangler's line for one request it served: `[wrangler:info] GET /sql 200 OK (8ms)`. */
const requestLine = /^\[wrangler:info\] [A-Z]+ \S+ \d{3}\b/;
const bindingsTitle = /^Your Worker has access to the following bindings:$/;
const bindingsHeader = /^Binding\s+Resource\s+Mode$/;
/** A row of the table: a binding, then its kind and mode in columns (`env.TENANTS (TenantObject)   Durable Object   local`). */
const bindingsRow = /^\S.*\s{2,}\S/;
/** The line wrangler prints before the table when it reads an env file. */
const envFileLine = /^Using (secrets|vars) defined in /;

/** Whether `role` is one Lessor made for a tenant: its role, or its end users' login role. */
export function isTenantRole(role: string): boolean {
  return tenantObjectNamePattern.test(role.endsWith("_jwt") ? role.slice(0, -"_jwt".length) : role);
}

/** A filter with its own notion of whether a shutdown is under way. */
export function stackOutputFilter(options: { requests?: boolean } = {}): StackOutputFilter {
  let shuttingDown = false;
  /** Whether the message the last prefixed line started came from a tenant's session. */
  let tenantMessage = false;
  /** The bindings of the table shown last (null before the first), and the one being read. */
  let shownBindings: Set<string> | null = null;
  let readingBindings: Set<string> | null = null;
  let envFileShown = false;

  const endOfTable = (): string[] => {
    const table = readingBindings ?? new Set<string>();
    readingBindings = null;
    const before = shownBindings;
    shownBindings = table;
    if (before === null) return [];
    const changed = [...table].filter((row) => !before.has(row));
    const gone = [...before].filter((row) => !table.has(row) && !changed.some((c) => sameBinding(c, row)));
    if (changed.length === 0 && gone.length === 0) return [];
    return [
      "wrangler reloaded its configuration; bindings that changed:",
      ...changed,
      ...gone.map((row) => `${row}  (removed)`),
    ];
  };

  const worker = (raw: string): string[] => {
    const line = raw.replace(ansiEscape, "");
    const first = shownBindings === null;
    if (readingBindings !== null) {
      if (bindingsHeader.test(line.trim())) return first ? [raw] : [];
      if (bindingsRow.test(line)) {
        readingBindings.add(line.trimEnd());
        return first ? [raw] : [];
      }
      // The table ended: after a reload, what changed in it; then this line, as any other.
      const summary = endOfTable();
      if (line.trim() === "") return first ? [raw] : summary;
      return [...summary, ...worker(raw)];
    }
    if (bindingsTitle.test(line.trim())) {
      readingBindings = new Set();
      return first ? [raw] : [];
    }
    if (envFileLine.test(line)) {
      if (envFileShown) return [];
      envFileShown = true;
      return [raw];
    }
    if (!options.requests && requestLine.test(line)) return [];
    if (shuttingDown && workerShutdownNoise.test(line)) return [];
    return [raw];
  };

  return {
    showPostgres(line) {
      if (postgresShutdownRequest.test(line)) shuttingDown = true;
      const message = postgresMessage.exec(line);
      if (message) tenantMessage = message[1] !== undefined && isTenantRole(message[1]);
      if (!postgresError.test(line)) return false;
      // A PANIC stops the whole server, whoever's session hit it.
      if (tenantMessage && message?.[2] !== "PANIC") return false;
      return !(shuttingDown && postgresShutdownNoise.test(line));
    },
    worker,
    expectShutdown() {
      shuttingDown = true;
    },
  };
}

/** Whether two rows of the bindings table name the same binding (`env.X (…)`), whatever its value. */
function sameBinding(a: string, b: string): boolean {
  const name = (row: string) => row.split(/[\s(]/, 1)[0];
  return name(a) === name(b);
}

/** `LESSOR_LOCAL_REQUEST_LOG` turns request lines on with `on`, `1`, `true` or `yes`; anything else leaves them off. */
export function requestLogEnabled(value: string | undefined): boolean {
  return ["on", "1", "true", "yes"].includes((value ?? "").trim().toLowerCase());
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
