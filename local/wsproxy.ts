/**
 * A WebSocket-to-TCP proxy that speaks the wsproxy protocol the Neon serverless driver uses
 * (`ws://<proxy>/v2?address=<host>:<port>`, then raw Postgres bytes in binary frames).
 *
 * It forwards only to the addresses it was given. Anything else is refused before a socket is
 * opened, so the proxy is never an open relay, whatever a client asks for.
 *
 * It listens on loopback, where any local process can reach it, so every resource a client can
 * make it hold is bounded (see {@link WsProxyLimits}): sockets that never finish the handshake,
 * tunnels that sit silent, the number of tunnels, and the bytes buffered in either direction (the
 * proxy stops reading from the side that is ahead instead of queueing without end).
 */
import { createServer, type Server } from "node:http";
import { createRequire } from "node:module";
import type { AddressInfo, Socket } from "node:net";
import { connect } from "node:net";
import type { Duplex } from "node:stream";
import type { WebSocket, WebSocketServer as WebSocketServerType } from "ws";

// Loaded through createRequire: inside a Vite-driven global setup a plain import of "ws"
// resolves the package's browser stub, which has no server.
const require = createRequire(import.meta.url);
const { WebSocketServer } = require("ws") as typeof import("ws");

/** The bounds on what one client can make the proxy hold. */
export interface WsProxyLimits {
  /**
   * From TCP accept until the WebSocket upgrade is done and the client's first message has
   * arrived (the Neon driver sends its startup message at once). A socket that sends nothing,
   * sends half a request, or upgrades and stays silent is closed.
   */
  handshakeTimeoutMs: number;
  /** Sockets in that handshake phase at once; more are dropped as soon as they are accepted. */
  maxHandshakes: number;
  /**
   * A tunnel with no payload bytes in either direction for this long is closed. Generous by
   * default: a pool keeps idle connections open on purpose.
   */
  idleTimeoutMs: number;
  /** Open tunnels at once; the upgrade of one more is answered `503`. */
  maxTunnels: number;
  /** Bytes a tunnel holds from the client while its TCP connection is still opening; more closes it. */
  maxPendingBytes: number;
  /** Bytes queued toward the client above which the proxy stops reading from the database. */
  highWaterBytes: number;
  /** Largest WebSocket message accepted from a client. */
  maxMessageBytes: number;
}

/**
 * Defaults. `maxTunnels` sits above the local Postgres's `max_connections` (400), so a legitimate
 * client meets Postgres's own limit, with its own error, before the proxy's.
 */
export const defaultWsProxyLimits: Readonly<WsProxyLimits> = {
  handshakeTimeoutMs: 10_000,
  maxHandshakes: 64,
  idleTimeoutMs: 10 * 60_000,
  maxTunnels: 500,
  maxPendingBytes: 1024 * 1024,
  highWaterBytes: 1024 * 1024,
  maxMessageBytes: 16 * 1024 * 1024,
};

/** What `/__control/stats` answers. */
export interface WsProxyStats {
  /** Tunnels opened so far, per target address (refused ones are not counted). */
  tunnels: Record<string, number>;
  /** Tunnels open now, per target address. */
  open: Record<string, number>;
  /** Open tunnels that are frozen by a stall, per target address. */
  frozen: Record<string, number>;
  /** Bytes the proxy holds in user space across all tunnels, both directions. */
  bufferedBytes: number;
  blocked: string[];
  stalled: string[];
}

/** A running proxy, with its test-only fault injection. */
export interface WsProxy {
  /** Port the proxy listens on (loopback only). */
  readonly port: number;
  /** Tunnels opened so far, per target address (refused ones are not counted). */
  readonly tunnels: ReadonlyMap<string, number>;
  /** Fault injection for tests: refuse new tunnels to `address` and cut the open ones. */
  block(address: string): void;
  unblock(address: string): void;
  /**
   * Fault injection for tests, a frozen compute: new tunnels to `address` are accepted and their
   * TCP connection opened, but no byte is forwarded either way; open tunnels to it stop
   * forwarding too. Nothing is closed (the idle timeout still applies).
   */
  stall(address: string): void;
  /** Ends a stall: new tunnels forward again, and the tunnels it froze are cut, never thawed. */
  unstall(address: string): void;
  stats(): WsProxyStats;
  /** Stops accepting connections and closes every open tunnel. */
  close(): Promise<void>;
}

interface Tunnel {
  readonly frozen: boolean;
  /** Stops forwarding both ways by no longer reading either side; closes nothing. */
  freeze(): void;
  /** Ends the tunnel at once, both sides. */
  cut(): void;
  bufferedBytes(): number;
}

/** Starts the proxy on 127.0.0.1. `allowed` lists `host:port` targets, e.g. `127.0.0.1:5432`. */
export async function startWsProxy(options: {
  allowed: readonly string[];
  port?: number;
  /** Overrides of {@link defaultWsProxyLimits}. */
  limits?: Partial<WsProxyLimits>;
  /**
   * Test-only: serve `/__control/…` (stats; block, unblock, stall and unstall a target) on the
   * proxy's port. Off unless asked for; `npm start` never enables it.
   */
  control?: boolean;
  /** Test-only actions served at `/__control/hook/<name>` when `control` is on (e.g. restart Postgres). */
  hooks?: Record<string, () => Promise<void>>;
  /**
   * How a tunnel opens its TCP connection (default `net.connect`). Tests pass a socket that never
   * connects, to reach the pre-connect bound without depending on a slow network.
   */
  dial?: (host: string, port: number) => Socket;
}): Promise<WsProxy> {
  const limits: WsProxyLimits = { ...defaultWsProxyLimits, ...options.limits };
  const dial = options.dial ?? ((host: string, port: number) => connect({ host, port }));
  const allowed = new Set(options.allowed);
  const blocked = new Set<string>();
  const stalled = new Set<string>();
  const tunnels = new Map<string, number>();
  const openTunnels = new Map<string, Set<Tunnel>>();
  /** Sockets still in the handshake phase, with the timer that closes them. */
  const handshaking = new Map<Duplex, NodeJS.Timeout>();
  /** Tunnel slots taken, from the accepted upgrade until the client's socket closes. */
  let slotsTaken = 0;

  const endHandshake = (socket: Duplex) => {
    const timer = handshaking.get(socket);
    if (timer === undefined) return;
    clearTimeout(timer);
    handshaking.delete(socket);
  };
  const tunnelsTo = (address: string): Set<Tunnel> => {
    let set = openTunnels.get(address);
    if (!set) {
      set = new Set();
      openTunnels.set(address, set);
    }
    return set;
  };
  const block = (address: string) => {
    blocked.add(address);
    for (const tunnel of openTunnels.get(address) ?? []) tunnel.cut();
  };
  const unblock = (address: string) => {
    blocked.delete(address);
  };
  const stall = (address: string) => {
    stalled.add(address);
    for (const tunnel of openTunnels.get(address) ?? []) tunnel.freeze();
  };
  const unstall = (address: string) => {
    stalled.delete(address);
    // Cut rather than thaw: a thawed connection would deliver answers its client may have given up
    // on long ago, which no real frozen compute does (its connections die with it).
    for (const tunnel of openTunnels.get(address) ?? []) if (tunnel.frozen) tunnel.cut();
  };
  const stats = (): WsProxyStats => {
    const open: Record<string, number> = {};
    const frozen: Record<string, number> = {};
    let bufferedBytes = 0;
    for (const [address, set] of openTunnels) {
      if (set.size === 0) continue;
      open[address] = set.size;
      let frozenCount = 0;
      for (const tunnel of set) {
        if (tunnel.frozen) frozenCount++;
        bufferedBytes += tunnel.bufferedBytes();
      }
      if (frozenCount > 0) frozen[address] = frozenCount;
    }
    return {
      tunnels: Object.fromEntries(tunnels),
      open,
      frozen,
      bufferedBytes,
      blocked: [...blocked],
      stalled: [...stalled],
    };
  };

  const controlActions: Record<string, (address: string) => void> = {
    "/__control/block": block,
    "/__control/unblock": unblock,
    "/__control/stall": stall,
    "/__control/unstall": unstall,
  };
  const server: Server = createServer((req, res) => {
    // A request that arrived whole is out of the handshake phase; its answer closes the socket,
    // so no keep-alive socket outlives the handshake bound.
    endHandshake(req.socket);
    res.setHeader("connection", "close");
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
      const action = controlActions[url.pathname];
      if (action && allowed.has(address)) action(address);
      else if (url.pathname !== "/__control/stats") {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(stats()));
      return;
    }
    res.writeHead(426, { "content-type": "text/plain" }).end("websocket upgrade required\n");
  });
  const wss: WebSocketServerType = new WebSocketServer({
    noServer: true,
    maxPayload: limits.maxMessageBytes,
  });

  server.on("connection", (socket: Socket) => {
    if (handshaking.size >= limits.maxHandshakes) {
      socket.destroy();
      return;
    }
    handshaking.set(
      socket,
      setTimeout(() => socket.destroy(), limits.handshakeTimeoutMs),
    );
    socket.once("close", () => endHandshake(socket));
  });

  server.on("upgrade", (req, socket, head) => {
    const url = new URL(req.url ?? "/", "http://proxy");
    const address = url.searchParams.get("address") ?? "";
    // `/v1` is the published neondatabase/wsproxy's path, `/v2` the one the Neon driver asks by default.
    if ((url.pathname !== "/v1" && url.pathname !== "/v2") || !allowed.has(address) || blocked.has(address)) {
      socket.end("HTTP/1.1 403 Forbidden\r\nconnection: close\r\n\r\n");
      return;
    }
    if (slotsTaken >= limits.maxTunnels) {
      socket.end(
        "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-type: text/plain\r\n" +
          "connection: close\r\n\r\ntoo many tunnels\n",
      );
      return;
    }
    // The slot is held by the client's socket, not by the tunnel object: handleUpgrade may give up
    // on a malformed handshake without calling back, and the slot must come back then too.
    slotsTaken++;
    socket.once("close", () => slotsTaken--);
    tunnels.set(address, (tunnels.get(address) ?? 0) + 1);
    wss.handleUpgrade(req, socket, head, (ws) => {
      const tunnel = openTunnel(ws, address, () => endHandshake(socket));
      const forAddress = tunnelsTo(address);
      forAddress.add(tunnel);
      ws.once("close", () => forAddress.delete(tunnel));
      if (stalled.has(address)) tunnel.freeze();
    });
  });

  /** Joins an accepted WebSocket to a new TCP connection to `address`. */
  function openTunnel(ws: WebSocket, address: string, handshakeDone: () => void): Tunnel {
    const separator = address.lastIndexOf(":");
    const tcp = dial(address.slice(0, separator), Number(address.slice(separator + 1)));
    tcp.setNoDelay(true);
    let connected = false;
    let frozen = false;
    let tcpPaused = false;
    const pending: Buffer[] = [];
    let pendingBytes = 0;

    const idle = setTimeout(() => {
      ws.close(1001, "idle timeout");
      tcp.destroy();
    }, limits.idleTimeoutMs);
    const touch = () => idle.refresh();
    let ended = false;
    const end = () => {
      ended = true;
      clearTimeout(idle);
      pending.length = 0;
      pendingBytes = 0;
      tcp.destroy();
    };

    tcp.on("connect", () => {
      connected = true;
      if (frozen) return;
      for (const chunk of pending) tcp.write(chunk);
      pending.length = 0;
      pendingBytes = 0;
    });
    tcp.on("data", (chunk: Buffer) => {
      touch();
      ws.send(chunk, { binary: true }, () => {
        if (tcpPaused && !frozen && ws.bufferedAmount <= limits.highWaterBytes / 2) {
          tcpPaused = false;
          tcp.resume();
        }
      });
      if (ws.bufferedAmount > limits.highWaterBytes) {
        tcpPaused = true;
        tcp.pause();
      }
    });
    tcp.on("drain", () => {
      if (!frozen) ws.resume();
    });
    tcp.on("error", () => ws.close(1011, "upstream error"));
    tcp.on("close", () => {
      clearTimeout(idle);
      ws.close();
    });

    ws.on("message", (data: Buffer) => {
      handshakeDone();
      touch();
      // ws.pause() stops reading the socket, but frames already parsed from the last chunk are
      // still delivered: a frozen tunnel drops them, as a frozen compute would never read them.
      if (frozen || ended) return;
      if (!connected) {
        pendingBytes += data.length;
        if (pendingBytes > limits.maxPendingBytes) {
          ws.close(1009, "too much data before the database connected");
          end();
          return;
        }
        pending.push(data);
        return;
      }
      if (!tcp.write(data)) ws.pause();
    });
    ws.on("close", end);
    ws.on("error", end);

    return {
      get frozen() {
        return frozen;
      },
      freeze() {
        frozen = true;
        // A stalled tunnel is waiting on purpose; the handshake bound must not cut it.
        handshakeDone();
        pending.length = 0;
        pendingBytes = 0;
        ws.pause();
        tcp.pause();
      },
      cut() {
        ws.terminate();
        end();
      },
      bufferedBytes: () => pendingBytes + tcp.writableLength + ws.bufferedAmount,
    };
  }

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
    stall,
    unstall,
    stats,
    close: () =>
      new Promise<void>((resolve) => {
        for (const client of wss.clients) client.terminate();
        for (const socket of handshaking.keys()) socket.destroy();
        wss.close();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
