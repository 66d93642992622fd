/**
 * A TCP proxy on loopback, for the tests of the TCP path (docs/adr/027-direct-tcp-path.md): bytes
 * pass unchanged (the TLS inside stays end to end, between workerd and Postgres), and a control
 * server lets a test cut every connection at once or stall them (bytes stop flowing both ways, the
 * sockets stay open: a blackholed network). What the WebSocket proxy's `block`/`stall` are to the
 * WebSocket path, for the path that has no proxy deployed. Test-only: it forwards to one address.
 */
import { createServer as createHttpServer, type Server as HttpServer } from "node:http";
import type { AddressInfo, Server, Socket } from "node:net";
import { connect, createServer } from "node:net";

/** What the control server's `/stats` answers. */
export interface FaultProxyStats {
  /** Connections accepted so far. */
  accepted: number;
  /** Connections open now. */
  open: number;
  stalled: boolean;
  /** Connections cut by `/cut`. */
  cut: number;
}

export interface FaultProxy {
  /** The loopback port the proxy listens on. */
  port: number;
  /** `http://127.0.0.1:<port>`: `POST /cut`, `/stall`, `/unstall`, `GET /stats`. */
  controlUrl: string;
  close(): Promise<void>;
}

/** Starts a proxy on `host` (a loopback address) to `target`, and its control server. */
export async function startFaultProxy(options: {
  host: string;
  port?: number;
  target: { host: string; port: number };
}): Promise<FaultProxy> {
  const open = new Set<{ client: Socket; upstream: Socket }>();
  const stats: FaultProxyStats = { accepted: 0, open: 0, stalled: false, cut: 0 };
  const server: Server = createServer((client) => {
    stats.accepted++;
    const upstream = connect(options.target.port, options.target.host);
    const pair = { client, upstream };
    open.add(pair);
    stats.open = open.size;
    const end = () => {
      client.destroy();
      upstream.destroy();
      if (open.delete(pair)) stats.open = open.size;
    };
    for (const [from, to] of [
      [client, upstream],
      [upstream, client],
    ] as const) {
      from.on("data", (chunk: Buffer) => {
        // Stalled: the bytes are dropped, as a blackholed network drops them.
        if (!stats.stalled) to.write(chunk);
      });
      from.on("error", end);
      from.on("close", end);
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, options.host, () => resolve());
  });
  const control: HttpServer = createHttpServer((request, response) => {
    const path = new URL(request.url ?? "/", "http://control").pathname;
    if (path === "/cut") {
      for (const pair of [...open]) {
        stats.cut++;
        pair.client.destroy();
        pair.upstream.destroy();
        open.delete(pair);
      }
      stats.open = open.size;
    } else if (path === "/stall") {
      stats.stalled = true;
    } else if (path === "/unstall") {
      stats.stalled = false;
    } else if (path !== "/stats") {
      response.writeHead(404).end();
      return;
    }
    response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(stats));
  });
  await new Promise<void>((resolve) => control.listen(0, "127.0.0.1", () => resolve()));
  return {
    port: (server.address() as AddressInfo).port,
    controlUrl: `http://127.0.0.1:${(control.address() as AddressInfo).port}`,
    close: async () => {
      for (const pair of open) {
        pair.client.destroy();
        pair.upstream.destroy();
      }
      open.clear();
      await Promise.all([
        new Promise<void>((resolve) => server.close(() => resolve())),
        new Promise<void>((resolve) => control.close(() => resolve())),
      ]);
    },
  };
}
