/**
 * How a connection reaches its host (docs/adr/027-direct-tcp-path.md): the path per host, chosen
 * by its kind and written in its configuration, and the TLS it demands.
 *
 * - `tcp`: workerd's `connect()` straight to the host, Postgres's SSLRequest then TLS, verified
 *   against the host name (`sslmode` `verify-full`, the default and the only mode off loopback;
 *   `disable` only on loopback, for a local server without TLS). SCRAM only. The path of every
 *   `postgres` host.
 * - `websocket`: the Neon driver's WebSocket, to Neon's endpoint (`wss://<host>/v2`) or, locally,
 *   to `LESSOR_WS_PROXY` on loopback, which plays that endpoint. The path of every `neon` host. A
 *   `postgres` host may name it only while `LESSOR_WS_PROXY` is set (the local and test stacks):
 *   deployed there is no such endpoint, and `deploy:check` refuses it.
 */
import type { HostKind } from "../core/host-capabilities.ts";
import { impliedHostKind } from "../core/host-capabilities.ts";

export const hostPaths = ["tcp", "websocket"] as const;
export type HostPathKind = (typeof hostPaths)[number];
export const sslModes = ["verify-full", "disable"] as const;
export type SslMode = (typeof sslModes)[number];

/** The path of one host's connections. */
export interface HostPath {
  path: HostPathKind;
  /** For `tcp`: `verify-full`, or `disable` on loopback only. For `websocket`, the WebSocket's own TLS decides. */
  sslmode: SslMode;
}

/** Why a host's declared path or TLS mode is refused, or null. */
export function hostPathProblem(
  name: string,
  kind: HostKind,
  hostname: string,
  declared: { path?: HostPathKind; sslmode?: SslMode },
  wsProxy: string | null,
): string | null {
  const path = declared.path ?? defaultPath(kind);
  if (kind === "neon" && path !== "websocket") {
    return `host ${name} is of kind neon, whose passwords Neon's WebSocket endpoint takes: its path is "websocket"`;
  }
  if (path === "websocket" && kind === "postgres" && wsProxy === null) {
    return `host ${name} is of kind postgres on the "websocket" path, which exists only through LESSOR_WS_PROXY (local runs); deployed, a postgres host is reached over "tcp"`;
  }
  if (declared.sslmode === "disable" && !isLoopbackHost(hostname)) {
    return `host ${name}: sslmode "disable" is allowed only for a host on this machine's loopback; off loopback Lessor verifies the host's certificate (verify-full)`;
  }
  if (declared.sslmode !== undefined && path !== "tcp") {
    return `host ${name}: sslmode applies to the "tcp" path only`;
  }
  return null;
}

/** The path of a host of `kind`, unless its configuration names one. */
export function defaultPath(kind: HostKind): HostPathKind {
  return kind === "neon" ? "websocket" : "tcp";
}

/** A declared host's path. */
export function hostPathOf(kind: HostKind, declared: { path?: HostPathKind; sslmode?: SslMode }): HostPath {
  return { path: declared.path ?? defaultPath(kind), sslmode: declared.sslmode ?? "verify-full" };
}

/** Where connections are looked up by address: `hostname:port`. */
export function addressKey(hostname: string, port: number): string {
  return `${hostname.toLowerCase()}:${port}`;
}

/**
 * The path to an address no host declares (the control plane, a region's control plane): by the
 * kind its name implies, except that `LESSOR_WS_PROXY`, where it is set (local runs), stays the
 * way to a `postgres` address too, as it always was.
 */
export function impliedPath(hostname: string, wsProxy: string | null): HostPath {
  const kind = impliedHostKind(hostname);
  if (kind === "postgres" && wsProxy !== null) return { path: "websocket", sslmode: "verify-full" };
  return { path: defaultPath(kind), sslmode: "verify-full" };
}

/** Whether a host name is this machine's loopback. */
export function isLoopbackHost(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, "");
  return host === "localhost" || host === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}
