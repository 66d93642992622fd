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
import { type ScramClientSession, scramClientFinal } from "../crypto/scram.ts";
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

/**
 * Gives one client this deployment's driver settings (its `neonConfig`, which outranks the global
 * one), then a customer's tunnel where it has one (`routeClient`).
 */
function configure<C extends Client>(client: C, config: LessorConfig, route?: TunnelRoute): C {
  Object.assign((client as unknown as { neonConfig: object }).neonConfig, socketSettings(config));
  routeClient(client, route);
  return client;
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
  /** A customer's database: reached through its tunnel, not the deployment's own way. */
  route?: TunnelRoute;
}

/**
 * How a connection reaches a database behind a customer's tunnel: the WebSocket proxy at the
 * tunnel's end (Neon's wsproxy protocol, `/v2?address=host:port`), over TLS unless on loopback, with
 * the tunnel's own connect bound (docs/adr/018-customer-databases-behind-tunnels.md).
 */
export interface TunnelRoute {
  proxy: string;
  secure: boolean;
  connectTimeoutMs: number;
}

/** The driver's connect bound for a connection to `target` (a tunnel's own, or the default). */
function connectTimeoutOf(target: { route?: TunnelRoute }): number {
  return target.route?.connectTimeoutMs ?? 10_000;
}

/**
 * Points one driver client at a customer's tunnel: its own socket settings, which outrank the
 * isolate's (`LESSOR_WS_PROXY` stays the way to every host). Nothing else changes for the client.
 */
function routeClient(client: Client, route: TunnelRoute | undefined): void {
  if (!route) return;
  const socket = client.neonConfig;
  socket.wsProxy = (host, port) => `${route.proxy}/v2?address=${host}:${port}`;
  socket.useSecureWebSocket = route.secure;
  // SCRAM against an ordinary Postgres: no pipelined password, no pipelined TLS.
  socket.pipelineConnect = false;
  socket.pipelineTLS = false;
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
  /**
   * Mints the one-time login token each new connection presents to the tenant database's guard;
   * null for a customer's database, which has no guard of Lessor's.
   */
  loginToken: (() => Promise<string>) | null;
  /** A customer's database: its tunnel. */
  route?: TunnelRoute;
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

interface EndEmitter {
  once(event: "end", listener: () => void): void;
}

/**
 * The driver's `Client`, except that `end()` settles when the connection has already ended. The
 * driver's `end()` waits for the connection's `end` event, which a connection emits once: when the
 * host cut it first (a killed backend, a restart, a proxy that dropped a frozen tunnel), that event
 * came before, and `end()` never settles. A pool ends only once every client's `end()` has called
 * back, so one such client left `Pool.end()` pending for ever: the generation never finished
 * closing, and its budget allocation was never released (the chaos soak's leak, issue 32; the
 * sequence is test/integration/pool-end-after-cut.test.ts).
 */
export class SettlingClient extends Client {
  private connectionEnded = false;

  /**
   * SCRAM's client-final step with the platform's PBKDF2 in one call, and the salted password kept
   * for the pool's next connection (src/crypto/scram.ts `scramClientFinal`), where the driver spent
   * about 15 ms of the isolate's CPU per connection. A failure ends the connect as the driver's own
   * would, through the connection's error.
   */
  override async _handleAuthSASLContinue(message: { data?: unknown }): Promise<void> {
    const connection = (this as unknown as { connection: SaslConnection }).connection;
    try {
      await scramClientFinal(this.saslSession as ScramClientSession, this.password, message.data);
      connection.sendSCRAMClientFinalMessage((this.saslSession as ScramClientSession).response ?? "");
    } catch (error) {
      connection.emit("error", error instanceof Error ? error : new Error("SASL: login failed"));
    }
  }

  constructor(config?: ConstructorParameters<typeof Client>[0]) {
    super(config);
    (this as unknown as { connection: EndEmitter }).connection.once("end", () => {
      this.connectionEnded = true;
    });
  }

  override end(): Promise<void>;
  override end(callback: (err?: Error) => void): void;
  override end(callback?: (err?: Error) => void): Promise<void> | void {
    if (!this.connectionEnded) return callback ? super.end(callback) : super.end();
    // Nothing is left to close: the socket is gone, and the driver would wait for its end for ever.
    (this as unknown as { _ending: boolean })._ending = true;
    if (!callback) return Promise.resolve();
    queueMicrotask(() => callback());
  }
}

interface SaslConnection {
  sendSCRAMClientFinalMessage(response: string): void;
  emit(event: "error", error: Error): void;
}

/** A `SettlingClient` class whose connections carry this deployment's driver settings. */
function configuredClientClass(config: LessorConfig): typeof SettlingClient {
  return class ConfiguredClient extends SettlingClient {
    constructor(clientConfig?: ConstructorParameters<typeof Client>[0]) {
      super(clientConfig);
      configure(this, config);
    }
  };
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
 * A submittable whose flight ends in more than one ReadyForQuery: a statement's Sync, then a
 * pipelined simple query (the per-request reset, src/tenant-object/execute.ts). `phasesLeft` counts
 * the ReadyForQuery messages still to come; until the last, the client keeps it active: messages
 * keep going to it, and the client sends nothing else.
 */
export interface PhasedSubmittable {
  phasesLeft: number;
  handleReadyForQuery(connection: unknown): void;
  handleError(error: unknown, connection: unknown): void;
}

interface DriverClientInternals {
  activeQuery: Partial<PhasedSubmittable> | null;
  connection: unknown;
}

type MessageHandler = (this: Client, message: unknown) => void;
const baseHandleReadyForQuery = (Client.prototype as unknown as { _handleReadyForQuery: MessageHandler })
  ._handleReadyForQuery;
const baseHandleErrorMessage = (Client.prototype as unknown as { _handleErrorMessage: MessageHandler })
  ._handleErrorMessage;

/**
 * The driver ends the active query at the first ReadyForQuery (and at an ErrorResponse). A phased
 * one (`PhasedSubmittable`) stays active until its last. The driver binds these two handlers when
 * it attaches to the connection, so a subclass's prototype carrying them is enough.
 */
const phasedHandlers = {
  _handleReadyForQuery(this: Client, message: unknown): void {
    const internals = this as unknown as DriverClientInternals;
    const active = internals.activeQuery;
    if (active && typeof active.phasesLeft === "number" && active.phasesLeft > 1) {
      active.phasesLeft--;
      active.handleReadyForQuery?.(internals.connection);
      return;
    }
    baseHandleReadyForQuery.call(this, message);
  },
  _handleErrorMessage(this: Client, message: unknown): void {
    const internals = this as unknown as DriverClientInternals;
    const active = internals.activeQuery;
    if (active && typeof active.phasesLeft === "number" && active.phasesLeft > 1) {
      active.handleError?.(message, internals.connection);
      return;
    }
    baseHandleErrorMessage.call(this, message);
  },
};

/**
 * A driver `Client` class whose connections carry this deployment's driver settings (or their
 * tunnel's), a fresh login token and the session limits, and record the parameters the server
 * reports (the wire endpoint's greeting repeats them, src/tenant-object/wire.ts).
 */
function tenantClientClass(config: LessorConfig, options: TenantConnectionOptions): typeof SettlingClient {
  const baseStartupConf = (Client.prototype as unknown as StartupConfigurable).getStartupConf;
  const mintToken = options.loginToken;
  const TenantClient = class TenantClient extends SettlingClient {
    private loginToken = "";

    constructor(clientConfig?: ConstructorParameters<typeof Client>[0]) {
      super(clientConfig);
      configure(this, config, options.route);
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
      const minted = (mintToken ? mintToken() : Promise.resolve("")).then((token) => {
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
        ...(mintToken ? [`lessor.login=${this.loginToken}`] : []),
      ]);
      return conf;
    };
  };
  Object.assign(TenantClient.prototype, phasedHandlers);
  return TenantClient;
}

/** A pool for one tenant generation. Its errors are reported, never thrown into the isolate. */
export function openPool(
  config: LessorConfig,
  target: ConnectionTarget,
  options: TenantConnectionOptions & { max: number; onError: (error: Error, client?: object) => void },
): Pool {
  const { route, ...address } = target;
  const pool = new Pool({
    ...address,
    max: options.max,
    // A pooled connection lives as long as its generation; the TenantObject decides when it ends.
    idleTimeoutMillis: 0,
    connectionTimeoutMillis: connectTimeoutOf(target),
    application_name: options.applicationName,
  });
  // The driver's Pool sets its own `Client` after construction (ignoring the option): replace it.
  pool.Client = tenantClientClass(config, { ...options, ...(route ? { route } : {}) });
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
async function withClient<T>(client: SettlingClient, work: (client: Client) => Promise<T>): Promise<T> {
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
 * Ends `client`, waiting for its end at most `closeBoundMs`. A `SettlingClient` whose connection
 * already ended settles at once; the bound covers a close the network never completes (a frozen
 * tunnel). Found by the chaos soak: a create answered workerd's "your Worker's code had hung" 500
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

/** How long ending a pool waits for its connections to come back and close before it cuts them. */
export const poolEndBoundMs = 5_000;

/**
 * Ends a pool, bounded. The driver's `Pool.end()` settles only once every client checked out has
 * come back and closed: a client whose work never settles (a query on a connection the network
 * froze) would keep it pending for ever, and with it the generation's close and its budget. Past
 * `boundMs` the connections still open are cut, and the wait moves on after `closeBoundMs` more.
 * Says whether it had to cut.
 */
export async function endPool(pool: Pool, boundMs = poolEndBoundMs): Promise<"ended" | "forced"> {
  const ended = pool.end().then(
    () => true,
    () => true,
  );
  if (await settlesWithin(ended, boundMs)) return "ended";
  for (const client of (pool as unknown as { _clients?: object[] })._clients ?? []) {
    try {
      cutConnection(client);
    } catch {
      // Not connected yet, or already gone.
    }
  }
  await settlesWithin(ended, closeBoundMs);
  return "forced";
}

/** Whether `promise` settles within `ms` (it keeps running either way). */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const bound = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([promise.then(() => true), bound]);
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
  const { route, ...address } = target;
  const TenantClient = tenantClientClass(config, { ...options, ...(route ? { route } : {}) });
  return withClient(
    new TenantClient({
      ...address,
      application_name: options.applicationName,
      connectionTimeoutMillis: connectTimeoutOf(target),
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
      new SettlingClient({
        connectionString,
        application_name: applicationName,
        connectionTimeoutMillis: 10_000,
      }),
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
      new SettlingClient({
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

/**
 * Runs `work` on a fresh connection to a customer's database as the role the customer issued,
 * through its tunnel, pinned like every privileged connection (`privilegedSessionSettings`: only
 * `pg_catalog` resolves names, whatever the customer's database or role settings say) and cancelled
 * at `deadlineMs`; always closed. For what Lessor does there outside a pool: the attach probe,
 * proving a supplied credential, changing its own password, ending one of its own backends.
 */
export function withCustomerConnection<T>(
  config: LessorConfig,
  target: ConnectionTarget,
  applicationName: string,
  deadlineMs: number,
  work: (client: Client) => Promise<T>,
): Promise<T> {
  opened.tenant++;
  const { route, ...address } = target;
  const client = configure(
    new SettlingClient({
      ...address,
      application_name: applicationName,
      connectionTimeoutMillis: connectTimeoutOf(target),
      options: startupOptions(privilegedSessionSettings(deadlineMs)),
    }),
    config,
    route,
  );
  return withClient(client, (connected) =>
    underDeadline(config, target, connected, deadlineMs, () => work(connected)),
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
  // A customer's database is reached through its tunnel, its cancel too.
  const canceller = configure(
    new Client({
      host: target.host,
      port: target.port,
      user: target.user,
      database: target.database,
    }),
    config,
    target.route,
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
