/**
 * What the test cluster itself logged about connections (test/server-log.ts turns the logging on):
 * every backend it authorized and every one that ended, in the order the server wrote them. Read
 * back through `pg_read_file` on a superuser connection, so a test can count Lessor's backends at
 * every moment of a run, exactly, where sampling `pg_stat_activity` would miss a short overshoot.
 */
import { env } from "cloudflare:test";
import { Client } from "@neondatabase/serverless";
import { pollUntil } from "./harness.ts";

/** One connection event, in the log's order (`line` is its line number in the log). */
export interface ConnectionEvent {
  line: number;
  kind: "open" | "close";
  pid: string;
  user: string;
  app: string;
}

/** A point in the log: everything the server logged before it was written is in the file. */
export interface LogMark {
  name: string;
  line: number;
}

/**
 * A Postgres whose log the tests read: the test cluster (the default), or the customer's server
 * behind a tunnel (test/customer-server.ts), reached through the tunnel's proxy.
 */
export interface LoggedServer {
  superuserUrl: string;
  logPath: string;
  /** The WebSocket proxy that reaches it, when it is not Lessor's own. */
  proxy?: string;
}

const testCluster = (): LoggedServer => ({
  superuserUrl: env.TEST_PG_SUPERUSER_URL,
  logPath: env.TEST_PG_SERVER_LOG,
});

function superuserClient(applicationName: string, server: LoggedServer = testCluster()): Client {
  const client = new Client({
    connectionString: server.superuserUrl,
    application_name: applicationName,
  });
  const proxy = server.proxy;
  if (proxy !== undefined) {
    client.neonConfig.wsProxy = (host, port) => `${proxy}/v2?address=${host}:${port}`;
    client.neonConfig.useSecureWebSocket = false;
    client.neonConfig.pipelineConnect = false;
  }
  client.on("error", () => undefined);
  return client;
}

/**
 * The connection events of the backends that `users` logged in as, or whose application name
 * matches one of `appPatterns` (SQL LIKE). A backend's application name is
 * read from its `connection authorized` line (the prefix has none yet); its end is the
 * `disconnection` line of the same pid that follows.
 */
async function connectionEvents(
  users: readonly string[],
  appPatterns: readonly string[],
  server: LoggedServer = testCluster(),
): Promise<ConnectionEvent[]> {
  const client = superuserClient("lessor-test-log-reader", server);
  await client.connect();
  try {
    const { rows } = await client.query(
      `WITH line AS (
         SELECT n, l FROM regexp_split_to_table(pg_read_file($1), E'\\n') WITH ORDINALITY AS t(l, n)
       ), event AS (
         SELECT n,
                CASE WHEN l LIKE '%connection authorized:%' THEN 'open' ELSE 'close' END AS kind,
                split_part(l, '|', 2) AS pid,
                split_part(l, '|', 4) AS usr,
                coalesce(substring(l FROM 'connection authorized:.* application_name=(\\S+)'), split_part(l, '|', 3)) AS app
           FROM line
          WHERE l LIKE '%connection authorized:%' OR l LIKE '%disconnection:%'
       ), opened AS (
         SELECT * FROM event WHERE kind = 'open' AND (usr = ANY($2::text[]) OR app LIKE ANY($3::text[]))
       )
       SELECT n::int AS line, kind, pid, usr AS "user", app FROM opened
       UNION ALL
       SELECT n::int, kind, pid, usr, app FROM event WHERE kind = 'close' AND pid IN (SELECT pid FROM opened)
       ORDER BY 1`,
      [server.logPath, users, appPatterns],
    );
    return rows as ConnectionEvent[];
  } finally {
    await client.end().catch(() => undefined);
  }
}

/**
 * Writes a mark into the server's log (a connection that opens and ends under a name of its own)
 * and waits until the log file holds it: from then on, everything logged before it is readable.
 */
export async function markServerLog(server: LoggedServer = testCluster()): Promise<LogMark> {
  const name = `lessor-test-mark:${crypto.randomUUID()}`;
  const client = superuserClient(name, server);
  await client.connect();
  await client.query("SELECT 1");
  await client.end();
  const reader = superuserClient("lessor-test-log-reader", server);
  await reader.connect();
  try {
    // A cheap look for the mark's disconnection line while waiting, then its line number once.
    const logged = await pollUntil(
      async () => {
        const { rows } = await reader.query("SELECT strpos(pg_read_file($1), '|' || $2 || '|') > 0 AS seen", [
          server.logPath,
          name,
        ]);
        return rows[0]?.seen === true;
      },
      (seen) => seen,
      { attempts: 100, intervalMs: 50 },
    );
    if (!logged) throw new Error(`the server log never showed ${name}`);
    const line = await pollUntil(
      async () => {
        const { rows } = await reader.query(
          `SELECT n::int AS line FROM regexp_split_to_table(pg_read_file($1), E'\\n') WITH ORDINALITY AS t(l, n)
            WHERE strpos(l, '|' || $2 || '|') > 0 AND l LIKE '%disconnection:%'`,
          [server.logPath, name],
        );
        return Number(rows[0]?.line ?? Number.NaN);
      },
      Number.isInteger,
      { attempts: 20, intervalMs: 50 },
    );
    if (!Number.isInteger(line)) throw new Error(`no disconnection line for ${name}`);
    return { name, line };
  } finally {
    await reader.end().catch(() => undefined);
  }
}

/** The lines the server logged between two marks that contain `text` (a deadlock, say). */
export async function serverLogLines(
  from: LogMark,
  to: LogMark,
  text: string,
  server: LoggedServer = testCluster(),
): Promise<string[]> {
  const client = superuserClient("lessor-test-log-reader", server);
  await client.connect();
  try {
    const { rows } = await client.query(
      `SELECT l FROM regexp_split_to_table(pg_read_file($1), E'\\n') WITH ORDINALITY AS t(l, n)
        WHERE n > $2 AND n < $3 AND strpos(l, $4) > 0 ORDER BY n`,
      [server.logPath, from.line, to.line, text],
    );
    return rows.map((row: { l: string }) => row.l);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** How a counted backend is classed; null leaves it out. */
export type BackendClass = "pool" | "maintenance";

export interface ConnectionPeaks {
  /** Most backends of each class open at once between the two marks, and in all. */
  pool: number;
  maintenance: number;
  total: number;
  /** The application names open when the total peaked (evidence for a failure message). */
  atPeak: string[];
  /** Backends opened between the marks (a run that opened none measured nothing). */
  opened: number;
}

/**
 * The exact peaks of open backends between `from` and `to` (two marks), replaying the log from its
 * start so that backends opened before `from` count too. `classify` says what a backend is.
 */
export async function connectionPeaks(
  from: LogMark,
  to: LogMark,
  select: { users: readonly string[]; appPatterns: readonly string[] },
  classify: (backend: { user: string; app: string }) => BackendClass | null,
  server: LoggedServer = testCluster(),
): Promise<ConnectionPeaks> {
  const events = await connectionEvents(select.users, select.appPatterns, server);
  const open = new Map<string, { app: string; kind: BackendClass }>();
  const count = { pool: 0, maintenance: 0 };
  const peaks: ConnectionPeaks = { pool: 0, maintenance: 0, total: 0, atPeak: [], opened: 0 };
  const record = () => {
    peaks.pool = Math.max(peaks.pool, count.pool);
    peaks.maintenance = Math.max(peaks.maintenance, count.maintenance);
    if (count.pool + count.maintenance > peaks.total) {
      peaks.total = count.pool + count.maintenance;
      peaks.atPeak = [...open.values()].map((b) => b.app).sort();
    }
  };
  let inWindow = false;
  for (const event of events) {
    if (event.line > to.line) break;
    if (!inWindow && event.line > from.line) {
      // What was open when the window began counts from its first moment.
      inWindow = true;
      record();
    }
    if (event.kind === "open") {
      const kind = classify(event);
      if (kind === null) continue;
      open.set(event.pid, { app: event.app, kind });
      count[kind]++;
      if (inWindow) peaks.opened++;
    } else {
      const backend = open.get(event.pid);
      if (!backend) continue;
      open.delete(event.pid);
      count[backend.kind]--;
    }
    if (inWindow) record();
  }
  record();
  return peaks;
}

/** Every line the server logged so far (up to a fresh mark) that contains `text`. */
export async function serverLogLinesSoFar(text: string): Promise<string[]> {
  return serverLogLines({ name: "start", line: 0 }, await markServerLog(), text);
}
