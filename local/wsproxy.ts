/**
 * A WebSocket-to-TCP proxy that speaks the wsproxy protocol the Neon serverless driver uses
 * (`ws://<proxy>/v2?address=<host>:<port>`, then raw Postgres bytes in binary frames).
 *
 * It forwards only to the addresses it was given. Anything else is refused before a socket is
 * opened, so the proxy is never an open relay, whatever a client asks for.
 */
import { createServer, type Server } from "node:http";
import { createRequire } from "node:module";
import type { AddressInfo } from "node:net";
import { connect } from "node:net";
import type { WebSocketServer as WebSocketServerType } from "ws";

// Loaded through createRequire: inside a Vite-driven global setup a plain import of "ws"
// resolves the package's browser stub, which has no server.
const require = createRequire(import.meta.url);
const { WebSocketServer } = require("ws") as typeof import("ws");

export interface WsProxy {
  /** Port the proxy listens on (loopback only). */
  readonly port: number;
  /** Tunnels opened so far, per target address (refused ones are not counted). */
  readonly tunnels: ReadonlyMap<string, number>;
  /** Fault injection for tests: refuse new tunnels to `address` and cut the open ones. */
  block(address: string): void;
  unblock(address: string): void;
  /** Stops accepting connections and closes every open tunnel. */
  close(): Promise<void>;
}

/** Starts the proxy on 127.0.0.1. `allowed` lists `host:port` targets, e.g. `127.0.0.1:5432`. */
export async function startWsProxy(options: {
  allowed: readonly string[];
  port?: number;
  /**
   * Test-only: serve `/__control/…` (tunnel counts, block and unblock a target) on the proxy's port.
   * Off unless asked for; `npm start` never enables it.
   */
  control?: boolean;
  /** Test-only actions served at `/__control/hook/<name>` when `control` is on (e.g. restart Postgres). */
  hooks?: Record<string, () => Promise<void>>;
}): Promise<WsProxy> {
  const allowed = new Set(options.allowed);
  const blocked = new Set<string>();
  const tunnels = new Map<string, number>();
  const openTunnels = new Map<string, Set<{ close(): void }>>();
  const block = (address: string) => {
    blocked.add(address);
    for (const tunnel of openTunnels.get(address) ?? []) tunnel.close();
  };
  const unblock = (address: string) => {
    blocked.delete(address);
  };
  const server: Server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://proxy");
    const hook = options.control
      ? options.hooks?.[url.pathname.replace(/^\/__control\/hook\//, "")]
      : undefined;
    if (hook && url.pathname.startsWith("/__control/hook/")) {
      hook().then(
        () => res.writeHead(200, { "content-type": "application/json" }).end("{}"),
        (error: unknown) => res.writeHead(500).end(String(error)),
      );
      return;
    }
    if (options.control && url.pathname.startsWith("/__control/")) {
      const address = url.searchParams.get("address") ?? "";
      if (url.pathname === "/__control/block" && allowed.has(address)) block(address);
      else if (url.pathname === "/__control/unblock" && allowed.has(address)) unblock(address);
      else if (url.pathname !== "/__control/stats") {
        res.writeHead(404).end();
        return;
      }
      res
        .writeHead(200, { "content-type": "application/json" })
        .end(JSON.stringify({ tunnels: Object.fromEntries(tunnels), blocked: [...blocked] }));
      return;
    }
    res.writeHead(426, { "content-type": "text/plain" }).end("websocket upgrade required\n");
  });
  const wss: WebSocketServerType = new WebSocketServer({ noServer: true });

  server.on("upgrade", (req, socket, head) => {
    const url = new URL(req.url ?? "/", "http://proxy");
    const address = url.searchParams.get("address") ?? "";
    if (url.pathname !== "/v2" || !allowed.has(address) || blocked.has(address)) {
      socket.end("HTTP/1.1 403 Forbidden\r\nconnection: close\r\n\r\n");
      return;
    }
    tunnels.set(address, (tunnels.get(address) ?? 0) + 1);
    const separator = address.lastIndexOf(":");
    const host = address.slice(0, separator);
    const port = Number(address.slice(separator + 1));
    wss.handleUpgrade(req, socket, head, (ws) => {
      const tcp = connect({ host, port });
      const tunnel = { close: () => ws.terminate() };
      const forAddress = openTunnels.get(address) ?? new Set();
      forAddress.add(tunnel);
      openTunnels.set(address, forAddress);
      tcp.on("close", () => forAddress.delete(tunnel));
      tcp.setNoDelay(true);
      const pending: Buffer[] = [];
      let open = false;
      tcp.on("connect", () => {
        open = true;
        for (const chunk of pending) tcp.write(chunk);
        pending.length = 0;
      });
      tcp.on("data", (data) => ws.send(data));
      tcp.on("error", () => ws.close(1011));
      tcp.on("close", () => ws.close());
      ws.on("message", (data: Buffer) => {
        if (open) tcp.write(data);
        else pending.push(data);
      });
      ws.on("close", () => tcp.destroy());
      ws.on("error", () => tcp.destroy());
    });
  });

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, "127.0.0.1", () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return {
    port,
    tunnels,
    block,
    unblock,
    close: () =>
      new Promise<void>((resolve) => {
        for (const client of wss.clients) client.terminate();
        wss.close();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
