/**
 * The one place Lessor configures the Neon serverless driver and opens Postgres connections.
 *
 * In production the driver reaches Neon over its secure WebSocket endpoint with the defaults.
 * Locally `LESSOR_WS_PROXY` points at the loopback WebSocket-to-TCP proxy: plain `ws://`, and no
 * pipelining (pipelined "password" connect breaks SCRAM against a vanilla Postgres).
 *
 * A connection as a tenant role is a `TenantClient`: each one mints its own one-time login token
 * (src/crypto/login-guard.ts) and starts with the session limits, in its startup options.
 */
import { Client, neonConfig, Pool } from "@neondatabase/serverless";
import type { LessorConfig } from "../config/index.ts";
import { PromptCloseWebSocket } from "./prompt-close.ts";

export type { Queryable } from "./queryable.ts";

let configuredProxy: string | null | undefined;

/** What a connection was opened for. */
export type ConnectionPurpose = "control_plane" | "host_admin" | "tenant";

const opened: Record<ConnectionPurpose, number> = { control_plane: 0, host_admin: 0, tenant: 0 };

/**
 * Connections this isolate has opened, by purpose, since it started: what proves that a path opens
 * none (a forged request, a warm query) and what a handshake costs in aggregate.
 */
export function connectionsOpened(): Readonly<Record<ConnectionPurpose, number>> {
  return { ...opened };
}

/** The driver settings of one connection (the Neon driver's per-client `neonConfig`). */
interface SocketSettings {
  webSocketConstructor: unknown;
  wsProxy: string | ((host: string, port: number | string) => string);
  useSecureWebSocket: boolean;
  pipelineTLS: boolean;
  pipelineConnect: "password" | false;
  forceDisablePgSSL: boolean;
  coalesceWrites: boolean;
}

/**
 * The driver settings for this deployment. Applied to every connection Lessor opens, one by one, so
 * nothing else in the isolate that sets the driver's global `neonConfig` (an app's code, a test
 * pointing `wsProxy` at Lessor's own wire endpoint) changes how Lessor reaches its databases.
 */
function socketSettings(config: LessorConfig): SocketSettings {
  // A cut or timed-out connection must end even when the database never answers (prompt-close.ts).
  const webSocketConstructor = PromptCloseWebSocket;
  if (config.wsProxy) {
    const proxy = config.wsProxy;
    return {
      webSocketConstructor,
      wsProxy: (host, port) => `${proxy}/v2?address=${host}:${port}`,
      useSecureWebSocket: false,
      pipelineTLS: false,
      pipelineConnect: false,
      forceDisablePgSSL: true,
      coalesceWrites: true,
    };
  }
  return {
    webSocketConstructor,
    wsProxy: (host) => `${host}/v2`,
    useSecureWebSocket: true,
    pipelineTLS: false,
    pipelineConnect: "password",
    forceDisablePgSSL: true,
    coalesceWrites: true,
  };
}

/** Gives one client this deployment's driver settings (its `neonConfig`, which outranks the global one). */
function configure<C extends Client>(client: C, config: LessorConfig): C {
  Object.assign((client as unknown as { neonConfig: object }).neonConfig, socketSettings(config));
  return client;
}

/** A `Client` class whose connections carry this deployment's driver settings. */
function configuredClientClass(config: LessorConfig): typeof Client {
  return class ConfiguredClient extends Client {
    constructor(...args: ConstructorParameters<typeof Client>) {
      super(...args);
      configure(this, config);
    }
  };
}

/**
 * Sets the driver's global defaults for this deployment (idempotent, per isolate). Lessor's own
 * connections do not depend on it (each carries its settings); it is for code that uses the driver
 * with its defaults in the same isolate (the tests' own connections).
 */
export function configureDriver(config: LessorConfig): void {
  if (configuredProxy === config.wsProxy) return;
  configuredProxy = config.wsProxy;
  const settings = socketSettings(config);
  neonConfig.webSocketConstructor = settings.webSocketConstructor as typeof WebSocket;
  if (config.wsProxy) {
    neonConfig.wsProxy = settings.wsProxy;
    neonConfig.useSecureWebSocket = settings.useSecureWebSocket;
    neonConfig.pipelineTLS = settings.pipelineTLS;
    neonConfig.pipelineConnect = settings.pipelineConnect;
  }
}

export interface ConnectionTarget {
  host: string;
  port: number;
  user: string;
  password: string;
  database: string;
}

/**
 * Settings a tenant connection starts with. They are Postgres's own (soft) limits: the tenant can
 * `SET` them for a statement, so Lessor's timers enforce the hard bounds (src/tenant-object).
 */
export interface SessionLimits {
  statementTimeoutMs: number;
  lockTimeoutMs: number;
  idleInTransactionMs: number;
}

export interface TenantConnectionOptions {
  applicationName: string;
  limits: SessionLimits;
  /** Mints the one-time login token each new connection presents to the tenant database's guard. */
  loginToken: () => Promise<string>;
  /** More pinned settings (a migration pins its `search_path`). */
  extraSettings?: readonly string[];
}

/**
 * The libpq `options` startup parameter: `-c name=value` pairs. Startup parameters win over every
 * database- and role-level setting, so what is pinned here no tenant can change for the session
 * (it can still `SET` it inside its own statements). A space in a value is escaped, as libpq does.
 */
export function startupOptions(settings: readonly string[]): string {
  return settings.map((setting) => `-c ${setting.replaceAll("\\", "\\\\").replaceAll(" ", "\\ ")}`).join(" ");
}

/**
 * The session defaults of every connection as a tenant role (its pool, its migrations): the soft
 * limits, and the two settings Lessor's own statements on it depend on, whatever the tenant set
 * for its role. Its `search_path` stays the tenant's own: Lessor's statements there name every
 * object with its schema.
 */
export function tenantSessionSettings(limits: SessionLimits): string[] {
  return [
    `statement_timeout=${limits.statementTimeoutMs}`,
    `lock_timeout=${limits.lockTimeoutMs}`,
    `idle_in_transaction_session_timeout=${limits.idleInTransactionMs}`,
    // A backend whose client vanished notices within a second even while it computes.
    "client_connection_check_interval=1000",
    "default_transaction_read_only=off",
    "standard_conforming_strings=on",
  ];
}

/**
 * The pinned session of every connection Lessor opens with more rights than a tenant (the host's
 * admin role, in its own database or a tenant's): nothing a database or role setting says can
 * reach it. Only `pg_catalog` resolves names (`pg_temp` last, so no temporary object shadows one),
 * literals parse one way, transactions are read-write and read committed, and every wait is bounded
 * by the work's deadline (docs/adr/007-tenant-containment.md, "Pinning").
 */
export function privilegedSessionSettings(deadlineMs: number): string[] {
  return [
    "search_path=pg_catalog,pg_temp",
    "standard_conforming_strings=on",
    "default_transaction_read_only=off",
    "default_transaction_isolation=read committed",
    "default_table_access_method=heap",
    "check_function_bodies=on",
    "array_nulls=on",
    "transform_null_equals=off",
    "row_security=on",
    `statement_timeout=${deadlineMs}`,
    `lock_timeout=${deadlineMs}`,
    `idle_in_transaction_session_timeout=${deadlineMs}`,
    "idle_session_timeout=0",
    "client_connection_check_interval=1000",
  ];
}

interface StartupConfigurable {
  getStartupConf(): Record<string, string>;
}

const serverParametersOf = new WeakMap<object, Map<string, string>>();

/**
 * The parameters the server reported when the connection started (ParameterStatus: its version,
 * encoding, date style, time zone, …), as a tenant connection recorded them; empty for any other.
 */
export function serverParameters(client: object): ReadonlyMap<string, string> {
  return serverParametersOf.get(client) ?? new Map();
}

interface ParameterSource {
  on(
    event: "parameterStatus",
    listener: (message: { parameterName: string; parameterValue: string }) => void,
  ): void;
}

/**
 * A driver `Client` class whose connections carry this deployment's driver settings, a fresh login
 * token and the session limits, and record the parameters the server reports.
 */
function tenantClientClass(config: LessorConfig, options: TenantConnectionOptions): typeof Client {
  const baseStartupConf = (Client.prototype as unknown as StartupConfigurable).getStartupConf;
  return class TenantClient extends Client {
    private loginToken = "";

    constructor(...args: ConstructorParameters<typeof Client>) {
      super(...args);
      configure(this, config);
      const parameters = new Map<string, string>();
      serverParametersOf.set(this, parameters);
      (this as unknown as { connection: ParameterSource }).connection.on("parameterStatus", (message) => {
        parameters.set(message.parameterName, message.parameterValue);
      });
    }

    override connect(): Promise<void>;
    override connect(callback: (err?: Error) => void): void;
    override connect(callback?: (err?: Error) => void): Promise<void> | void {
      opened.tenant++;
      const minted = options.loginToken().then((token) => {
        this.loginToken = token;
      });
      if (!callback) return minted.then(() => super.connect());
      minted.then(
        () => super.connect(callback),
        (error: unknown) => callback(error instanceof Error ? error : new Error("login token failed")),
      );
    }

    /** Called by the driver when it sends the startup message, after `connect` minted the token. */
    override getStartupConf = (): Record<string, string> => {
      const conf = baseStartupConf.call(this);
      conf.options = startupOptions([
        ...tenantSessionSettings(options.limits),
        ...(options.extraSettings ?? []),
        `lessor.login=${this.loginToken}`,
      ]);
      return conf;
    };
  };
}

/** A pool for one tenant generation. Its errors are reported, never thrown into the isolate. */
export function openPool(
  config: LessorConfig,
  target: ConnectionTarget,
  options: TenantConnectionOptions & { max: number; onError: (error: Error, client?: object) => void },
): Pool {
  const pool = new Pool({
    ...target,
    max: options.max,
    // A pooled connection lives as long as its generation; the TenantObject decides when it ends.
    idleTimeoutMillis: 0,
    connectionTimeoutMillis: 10_000,
    application_name: options.applicationName,
  });
  // The driver's Pool sets its own `Client` after construction (ignoring the option): replace it.
  pool.Client = tenantClientClass(config, options);
  pool.on("error", options.onError);
  return pool;
}

/**
 * The control plane's connection pool, held by a ControlPlaneObject shard: a few connections kept
 * warm (closed after five idle minutes), each counted as it opens.
 */
export function openControlPlanePool(
  config: LessorConfig,
  connectionString: string,
  onError: (error: Error) => void,
): Pool {
  const pool = new Pool({
    connectionString,
    max: config.controlPlanePoolSize,
    idleTimeoutMillis: 300_000,
    connectionTimeoutMillis: 10_000,
    application_name: "lessor-control-plane",
  });
  pool.Client = configuredClientClass(config);
  pool.on("connect", () => {
    opened.control_plane++;
  });
  pool.on("error", onError);
  return pool;
}

/** Runs `work` on a fresh client and always closes it. */
async function withClient<T>(client: Client, work: (client: Client) => Promise<T>): Promise<T> {
  client.on("error", () => undefined);
  await client.connect();
  try {
    return await work(client);
  } finally {
    await closeClient(client);
  }
}

/** How long closing a connection may wait for its end before it moves on. */
const closeBoundMs = 2_000;

/**
 * Ends `client`, waiting for its end at most `closeBoundMs`. The driver's `end()` waits for the
 * connection's `end` event, which a connection emits once: when the host has already cut it (a
 * restart, a proxy that dropped a frozen tunnel), that event came before, and `end()` never
 * settles. Found by the chaos soak: a create answered workerd's "your Worker's code had hung" 500
 * instead of its error, and work run in an object would never have returned (or released its
 * maintenance slot). The socket is closed either way; only the wait is bounded.
 */
async function closeClient(client: Client): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const bound = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, closeBoundMs);
  });
  try {
    await Promise.race([client.end().catch(() => undefined), bound]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Runs `work` on a fresh connection as a tenant role (migrations, provisioning's first migration),
 * with a login token and the session limits, and always closes it.
 */
export function withTenantConnection<T>(
  config: LessorConfig,
  target: ConnectionTarget,
  options: TenantConnectionOptions,
  work: (client: Client) => Promise<T>,
): Promise<T> {
  const TenantClient = tenantClientClass(config, options);
  return withClient(
    new TenantClient({
      ...target,
      application_name: options.applicationName,
      connectionTimeoutMillis: 10_000,
    }),
    work,
  );
}

/**
 * Runs `work` on a fresh connection and always closes it. For the control plane, never for a
 * tenant's queries (those go through the tenant's pool) nor for a host's admin role
 * (`withPrivilegedConnection`).
 */
export function withConnection<T>(
  config: LessorConfig,
  connectionString: string,
  applicationName: string,
  work: (client: Client) => Promise<T>,
): Promise<T> {
  opened.control_plane++;
  return withClient(
    configure(
      new Client({ connectionString, application_name: applicationName, connectionTimeoutMillis: 10_000 }),
      config,
    ),
    work,
  );
}

/**
 * Runs `work` on a fresh connection as a host's admin role, pinned (`privilegedSessionSettings`)
 * and cancelled at `deadlineMs`, and always closes it.
 */
export function withPrivilegedConnection<T>(
  config: LessorConfig,
  connectionString: string,
  applicationName: string,
  deadlineMs: number,
  work: (client: Client) => Promise<T>,
): Promise<T> {
  opened.host_admin++;
  return withClient(
    configure(
      new Client({
        connectionString,
        application_name: applicationName,
        connectionTimeoutMillis: 10_000,
        options: startupOptions(privilegedSessionSettings(deadlineMs)),
      }),
      config,
    ),
    (client) => underDeadline(config, targetOfUrl(connectionString), client, deadlineMs, () => work(client)),
  );
}

interface Cancellable {
  activeQuery?: unknown;
  processID?: number | null;
  secretKey?: number | null;
}

/**
 * Sends Postgres a CancelRequest for whatever `client` is running, on a short connection of its own
 * (a cancel is no login: it needs no password and no login token). Best effort: a cancel that
 * arrives after the statement finished may hit the next one, so the caller must not reuse the
 * connection afterwards. By default only while the driver itself runs a query on it; `always`
 * cancels whatever the backend runs (a connection whose traffic Lessor relays, src/tenant-object/wire.ts).
 */
export function sendCancel(
  config: LessorConfig,
  target: ConnectionTarget,
  client: object,
  always = false,
): void {
  const busy = client as unknown as Cancellable;
  if ((!always && !busy.activeQuery) || !busy.processID) return;
  const canceller = configure(
    new Client({
      host: target.host,
      port: target.port,
      user: target.user,
      database: target.database,
    }),
    config,
  );
  canceller.on("error", () => undefined);
  (canceller as unknown as { connection: { on(event: "error", listener: () => void): void } }).connection.on(
    "error",
    () => undefined,
  );
  // The driver cancels "the query the client runs"; a stand-in carries the backend's key either way.
  const query = busy.activeQuery ?? {};
  const running = { activeQuery: query, processID: busy.processID, secretKey: busy.secretKey };
  (canceller as unknown as { cancel(client: object, query: unknown): void }).cancel(running, query);
}

/**
 * Ends an idle connection the way Postgres sees it end: sends Terminate and waits (bounded) until
 * the server closes the socket, which it does once the backend has exited, so the backend is gone
 * from `pg_stat_activity` when this resolves (or the bound passed). The caller then releases it.
 */
export function terminateAndWait(client: object, timeoutMs = 2_000): Promise<void> {
  const ending = client as unknown as {
    _ending: boolean;
    _queryable: boolean;
    on(event: "error", listener: () => void): void;
    connection: {
      stream: { write(bytes: Uint8Array): boolean };
      once(event: "end", listener: () => void): void;
    };
  };
  // An end Lessor asked for: the driver must not report the server's close as an unexpected one,
  // nor write to the closed socket when the pool ends the client (it destroys a non-queryable one).
  ending._ending = true;
  ending._queryable = false;
  ending.on("error", () => undefined);
  const { connection } = ending;
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs);
    connection.once("end", () => {
      clearTimeout(timer);
      resolve();
    });
    // Terminate ('X', length 4): the server ends the session and closes the socket.
    connection.stream.write(new Uint8Array([0x58, 0, 0, 0, 4]));
  });
}

/** Thrown by `underDeadline` when the work outlived its deadline and was cancelled. */
export class DeadlineExceeded extends Error {
  override readonly name = "DeadlineExceeded";
  constructor(readonly deadlineMs: number) {
    super(`cancelled after its deadline of ${deadlineMs} ms`);
  }
}

/** After a cancel, how long a statement may take to stop before its connection is cut. */
const cancelGraceMs = 2_000;

/**
 * Runs `work` on `client` within `deadlineMs`: past it, the running statement is cancelled (its
 * transaction rolls back), and if it has not stopped `cancelGraceMs` later the connection is cut.
 * Work that ran past its deadline fails with `DeadlineExceeded`, never quietly goes on.
 */
export async function underDeadline<T>(
  config: LessorConfig,
  target: ConnectionTarget,
  client: Client,
  deadlineMs: number,
  work: () => Promise<T>,
): Promise<T> {
  let expired = false;
  let cut: ReturnType<typeof setTimeout> | undefined;
  const timer = setTimeout(() => {
    expired = true;
    sendCancel(config, target, client);
    cut = setTimeout(() => cutConnection(client), cancelGraceMs);
  }, deadlineMs);
  try {
    const result = await work();
    if (expired) throw new DeadlineExceeded(deadlineMs);
    return result;
  } catch (error) {
    throw expired ? new DeadlineExceeded(deadlineMs) : error;
  } finally {
    clearTimeout(timer);
    clearTimeout(cut);
  }
}

/** The address part of a connection string, for a cancel request. */
export function targetOfUrl(connectionString: string): ConnectionTarget {
  const url = new URL(connectionString);
  return {
    host: url.hostname,
    port: Number(url.port || 5432),
    user: decodeURIComponent(url.username),
    password: "",
    database: decodeURIComponent(url.pathname.replace(/^\//, "")) || "postgres",
  };
}

/** Cuts a connection at once (its socket), whatever it is doing; its pending queries fail. */
export function cutConnection(client: object): void {
  (client as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy();
}

/** The backend process of a connection, for `pg_terminate_backend`. */
export function backendPid(client: object): number | null {
  return (client as unknown as Cancellable).processID ?? null;
}

/** The same host's admin connection string, pointed at `database`. */
export function adminUrlFor(adminUrl: string, database: string): string {
  const url = new URL(adminUrl.replace(/^postgres(ql)?:/, "http:"));
  url.pathname = `/${encodeURIComponent(database)}`;
  return url.toString().replace(/^http:/, "postgres:");
}
