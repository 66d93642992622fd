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
  /** Stops accepting connections and closes every open tunnel. */
  close(): Promise<void>;
}

/** Starts the proxy on 127.0.0.1. `allowed` lists `host:port` targets, e.g. `127.0.0.1:5432`. */
export async function startWsProxy(options: { allowed: readonly string[]; port?: number }): Promise<WsProxy> {
  const allowed = new Set(options.allowed);
  const server: Server = createServer((_req, res) => {
    res.writeHead(426, { "content-type": "text/plain" }).end("websocket upgrade required\n");
  });
  const wss: WebSocketServerType = new WebSocketServer({ noServer: true });

  server.on("upgrade", (req, socket, head) => {
    const url = new URL(req.url ?? "/", "http://proxy");
    const address = url.searchParams.get("address") ?? "";
    if (url.pathname !== "/v2" || !allowed.has(address)) {
      socket.end("HTTP/1.1 403 Forbidden\r\nconnection: close\r\n\r\n");
      return;
    }
    const separator = address.lastIndexOf(":");
    const host = address.slice(0, separator);
    const port = Number(address.slice(separator + 1));
    wss.handleUpgrade(req, socket, head, (ws) => {
      const tcp = connect({ host, port });
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
    close: () =>
      new Promise<void>((resolve) => {
        for (const client of wss.clients) client.terminate();
        wss.close();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
