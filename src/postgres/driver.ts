/**
 * The Neon serverless driver's settings for every connection Lessor opens: the deployment's way to
 * its hosts (in production Neon's secure WebSocket endpoint with the defaults; locally
 * `LESSOR_WS_PROXY`, the loopback WebSocket-to-TCP proxy: plain `ws://`, and no pipelining, since a
 * pipelined "password" connect breaks SCRAM against a vanilla Postgres), a customer's tunnel where
 * it has one, and the count of connections opened.
 */
import { type Client, neonConfig } from "@neondatabase/serverless";
import { addressKey, type HostPath, impliedPath } from "../config/host-paths.ts";
import type { LessorConfig } from "../config/index.ts";
import { PromptCloseWebSocket } from "./prompt-close.ts";
import { TcpSocket } from "./socket.ts";

let configuredProxy: string | null | undefined;

/** What a connection was opened for. */
export type ConnectionPurpose = "control_plane" | "host_admin" | "tenant";

const opened: Record<ConnectionPurpose, number> = { control_plane: 0, host_admin: 0, tenant: 0 };

/** Counts a connection this isolate opens (`connectionsOpened`). */
export function countOpened(purpose: ConnectionPurpose): void {
  opened[purpose]++;
}

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
 * Gives one client its way to its host: a customer's tunnel where it has one (`routeClient`); for
 * a host on the `tcp` path a `TcpSocket` (socket.ts) in place of the driver's WebSocket, with
 * Postgres's TLS on; otherwise this deployment's WebSocket settings (its `neonConfig`, which
 * outranks the global one). The path is the host's (src/config/host-paths.ts), by address.
 */
export function configure<C extends Client>(client: C, config: LessorConfig, route?: TunnelRoute): C {
  const path = route ? null : pathOf(config, client);
  if (path?.path === "tcp") {
    useTcp(client, path);
    return client;
  }
  Object.assign((client as unknown as { neonConfig: object }).neonConfig, socketSettings(config));
  routeClient(client, route);
  return client;
}

/** The path to the host `client` connects to: its declared host's, or the one its name implies. */
export function pathOf(config: LessorConfig, client: object): HostPath {
  const { host, port } = client as unknown as { host: string; port: number | string };
  const declared = config.pathsByAddress.get(addressKey(host, Number(port)));
  return declared ?? impliedPath(host, config.wsProxy);
}

interface DriverInternals {
  ssl: unknown;
  connection: { ssl: unknown; stream: unknown };
}

/**
 * Puts a `TcpSocket` under `client` before it connects: the driver's `Connection` reads and writes
 * its `stream`, and the driver's `Client` reads its settings off it (`client.neonConfig`). With TLS
 * on, Postgres's SSLRequest goes first (`ssl`), and the socket lets nothing else out before TLS.
 */
function useTcp(client: Client, path: HostPath): void {
  const tls = path.sslmode !== "disable";
  const internals = client as unknown as DriverInternals;
  internals.connection.stream = new TcpSocket({ tls });
  internals.ssl = tls;
  internals.connection.ssl = tls;
}

/** Whether `client` reaches its host over TCP (a `TcpSocket`), where only SCRAM may log in. */
export function onTcpPath(client: object): boolean {
  return (client as unknown as DriverInternals).connection?.stream instanceof TcpSocket;
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
 * tunnel's end (Neon's wsproxy protocol: `<path>?address=host:port`, then Postgres bytes), over TLS
 * unless on loopback, with the tunnel's own connect bound
 * (docs/adr/018-customer-databases-behind-tunnels.md). The path is the one in the tunnel's `proxy`,
 * or `/v1` when it names none: what the published `neondatabase/wsproxy` serves.
 */
export interface TunnelRoute {
  proxy: string;
  secure: boolean;
  connectTimeoutMs: number;
}

/** The published wsproxy's path (github.com/neondatabase/wsproxy), for a tunnel's proxy that names none. */
export const defaultTunnelPath = "/v1";

/** A tunnel proxy's endpoint: its address with the path it names, or the published wsproxy's. */
export function tunnelEndpoint(proxy: string): string {
  return proxy.includes("/") ? proxy : `${proxy}${defaultTunnelPath}`;
}

/** The driver's connect bound for a connection to `target` (a tunnel's own, or the default). */
export function connectTimeoutOf(target: { route?: TunnelRoute }): number {
  return target.route?.connectTimeoutMs ?? 10_000;
}

/**
 * Points one driver client at a customer's tunnel: its own socket settings, which outrank the
 * isolate's (`LESSOR_WS_PROXY` stays the way to every host). Nothing else changes for the client.
 */
function routeClient(client: Client, route: TunnelRoute | undefined): void {
  if (!route) return;
  const socket = client.neonConfig;
  socket.wsProxy = (host, port) => `${tunnelEndpoint(route.proxy)}?address=${host}:${port}`;
  socket.useSecureWebSocket = route.secure;
  // SCRAM against an ordinary Postgres: no pipelined password, no pipelined TLS.
  socket.pipelineConnect = false;
  socket.pipelineTLS = false;
}
