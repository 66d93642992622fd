/**
 * The one place Lessor opens Postgres connections: pools for a tenant generation and for the
 * control plane, one-off connections (tenant, admin, privileged, a customer's), bounded closes and
 * ends, cancels, and deadlines. The driver's settings are in driver.ts, the pinned session settings
 * in session-settings.ts, the client classes in clients.ts; everything is exported from here. What
 * the hot path uses of the driver's private parts is in internals.ts, behind named functions.
 */
import { Client, Pool } from "@neondatabase/serverless";
import type { LessorConfig } from "../config/index.ts";
import { configuredClientClass, SettlingClient, tenantClientClass, terminateBoundMs } from "./clients.ts";
import { type ConnectionTarget, configure, connectTimeoutOf, countOpened } from "./driver.ts";
import { driverPoolClients } from "./internals.ts";
import { closeGraceMs } from "./prompt-close.ts";
import {
  privilegedSessionSettings,
  startupOptions,
  type TenantConnectionOptions,
} from "./session-settings.ts";

export {
  ConnectionState,
  connectionState,
  noteServerParameter,
  SettlingClient,
  serverParameters,
  terminateAndWait,
} from "./clients.ts";
export type { ConnectionPurpose, ConnectionTarget, TunnelRoute } from "./driver.ts";
export { configureDriver, connectionsOpened } from "./driver.ts";
export type { Queryable } from "./queryable.ts";
export type { SessionLimits, TenantConnectionOptions } from "./session-settings.ts";
export { privilegedSessionSettings, startupOptions, tenantSessionSettings } from "./session-settings.ts";

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
  pool.on("connect", (client: Client) => {
    countOpened("control_plane");
    // Once per connection, when it opens: the pool listens only to idle connections, and a session's
    // connection whose backend dies would otherwise raise an uncaught error in the object (the
    // session's next statement sees the failure). Added per checkout instead, the listeners grew
    // by one each session, and past ten the driver's EventEmitter printed a warning that dumped the
    // client, connection string and password included (issue 39).
    client.on("error", () => undefined);
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

/**
 * How long closing a connection may wait for its end before it moves on: the end's own bound (the
 * server's close after Terminate, then the socket's close grace), so a connection that ends at all
 * is waited for until its backend has gone.
 */
const closeBoundMs = terminateBoundMs + closeGraceMs;

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
  // The driver's `Pool.end()` settles once its clients are asked to end, not once they have: it
  // forgets a client before the client's `end()` calls back. Each one's end is over at its `remove`.
  const clients = driverPoolClients(pool);
  const removed = Promise.all(clients.map((client) => whenRemoved(pool, client)));
  const ended = pool.end().then(
    () => removed,
    () => removed,
  );
  if (await settlesWithin(ended, boundMs)) return "ended";
  // Those still checked out, and those whose end the server has not answered.
  for (const client of clients) {
    try {
      cutConnection(client);
    } catch {
      // Not connected yet, or already gone.
    }
  }
  await settlesWithin(ended, closeBoundMs);
  return "forced";
}

/** Settles when the pool has ended `client` (pg-pool's `remove`, emitted once its `end()` called back). */
function whenRemoved(pool: Pool, client: object): Promise<void> {
  return new Promise((resolve) => {
    const onRemove = (removed: object) => {
      if (removed !== client) return;
      pool.off("remove", onRemove);
      resolve();
    };
    pool.on("remove", onRemove);
  });
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
  countOpened("control_plane");
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
  countOpened("host_admin");
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
  countOpened("tenant");
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
