/**
 * The local WebSocket proxy's bounds and its stall fault, proved on loopback against small TCP
 * servers of the test's own (no Postgres): each limit is tripped, and what must keep working does.
 */
import { createRequire } from "node:module";
import { connect, createServer, type Server, Socket } from "node:net";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { WebSocket as WsClient } from "ws";
import { startWsProxy, type WsProxy, type WsProxyLimits, type WsProxyStats } from "../../local/wsproxy.ts";

// As in local/wsproxy.ts: a plain import of "ws" can resolve the browser stub under Vite.
const require = createRequire(import.meta.url);
const { WebSocket } = require("ws") as typeof import("ws");

const MiB = 1024 * 1024;
// Real time, whatever clock a test fakes for the proxy.
const realSetTimeout = globalThis.setTimeout;
const sleep = (ms: number) => new Promise<void>((resolve) => realSetTimeout(resolve, ms));

/** A TCP target that records what reaches it; `echo` sends every byte back. */
interface Target {
  address: string;
  server: Server;
  sockets: Socket[];
  received(): number;
}

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function startTarget(onSocket: (socket: Socket) => void = (socket) => socket.pipe(socket)) {
  let received = 0;
  const sockets: Socket[] = [];
  const server = createServer((socket) => {
    sockets.push(socket);
    socket.on("data", (chunk: Buffer) => {
      received += chunk.length;
    });
    socket.on("error", () => undefined);
    onSocket(socket);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (typeof address !== "object" || !address) throw new Error("target has no address");
  cleanups.push(() => {
    for (const socket of sockets) socket.destroy();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const target: Target = {
    address: `127.0.0.1:${address.port}`,
    server,
    sockets,
    received: () => received,
  };
  return target;
}

async function startProxy(
  target: Target,
  limits: Partial<WsProxyLimits> = {},
  extra: Partial<Parameters<typeof startWsProxy>[0]> = {},
): Promise<WsProxy> {
  const proxy = await startWsProxy({ allowed: [target.address], limits, ...extra });
  cleanups.push(() => proxy.close());
  return proxy;
}

/** Opens a tunnel; rejects with the HTTP status if the upgrade is refused. */
function openTunnel(proxy: WsProxy, address: string, path = "/v2"): Promise<WsClient> {
  const ws = new WebSocket(`ws://127.0.0.1:${proxy.port}${path}?address=${encodeURIComponent(address)}`);
  ws.on("error", () => undefined);
  cleanups.push(() => ws.terminate());
  return new Promise((resolve, reject) => {
    ws.once("open", () => resolve(ws));
    ws.once("unexpected-response", (_req, res) => reject(new Error(`HTTP ${res.statusCode}`)));
  });
}

function nextMessage(ws: WsClient, timeoutMs = 1000): Promise<Buffer | "timeout"> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      ws.off("message", onMessage);
      resolve("timeout");
    }, timeoutMs);
    const onMessage = (data: Buffer) => {
      clearTimeout(timer);
      resolve(data);
    };
    ws.once("message", onMessage);
  });
}

function closed(ws: WsClient): Promise<number> {
  if (ws.readyState === WebSocket.CLOSED) return Promise.resolve(1006);
  return new Promise((resolve) => ws.once("close", (code: number) => resolve(code)));
}

/** A raw socket to the proxy; `closed` is set once the other side closed it. */
function rawSocket(port: number, send?: string): { closed: () => boolean; close: Promise<void> } {
  const socket = connect({ host: "127.0.0.1", port });
  socket.on("error", () => undefined);
  cleanups.push(() => void socket.destroy());
  if (send !== undefined) socket.write(send);
  socket.resume();
  let closed = false;
  const close = new Promise<void>((resolve) =>
    socket.once("close", () => {
      closed = true;
      resolve();
    }),
  );
  return { closed: () => closed, close };
}

async function control(proxy: WsProxy, path: string): Promise<{ status: number; stats?: WsProxyStats }> {
  const response = await fetch(`http://127.0.0.1:${proxy.port}/__control/${path}`);
  if (response.status !== 200) return { status: response.status };
  return { status: 200, stats: (await response.json()) as WsProxyStats };
}

describe("wsproxy", () => {
  it("forwards both ways to an allowed target, refuses others, and cuts a blocked one", async () => {
    const target = await startTarget();
    const proxy = await startProxy(target);
    const ws = await openTunnel(proxy, target.address);
    ws.send(Buffer.from("ping"));
    expect(String(await nextMessage(ws))).toBe("ping");
    await expect(openTunnel(proxy, "127.0.0.1:1")).rejects.toThrow("HTTP 403");
    proxy.block(target.address);
    expect(await closed(ws)).toBe(1006);
    await expect(openTunnel(proxy, target.address)).rejects.toThrow("HTTP 403");
  });

  it("serves the published wsproxy's path (/v1) and the driver's default (/v2), and nothing else", async () => {
    const target = await startTarget();
    const proxy = await startProxy(target);
    for (const path of ["/v1", "/v2"]) {
      const ws = await openTunnel(proxy, target.address, path);
      ws.send(Buffer.from(`ping ${path}`));
      expect(String(await nextMessage(ws))).toBe(`ping ${path}`);
    }
    await expect(openTunnel(proxy, target.address, "/v3")).rejects.toThrow("HTTP 403");
  });

  it("closes a socket that sends nothing, half an upgrade, or upgrades and stays silent", async () => {
    const target = await startTarget();
    // The proxy's timers run on a clock the test moves (sockets stay real).
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    try {
      const proxy = await startProxy(target, { handshakeTimeoutMs: 200 });
      const silent = rawSocket(proxy.port);
      const halfUpgrade = rawSocket(
        proxy.port,
        `GET /v2?address=${target.address} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n`,
      );
      const mute = await openTunnel(proxy, target.address);
      const muteClosed = closed(mute);
      const talker = await openTunnel(proxy, target.address);
      talker.send(Buffer.from("hello"));
      expect(String(await nextMessage(talker))).toBe("hello");

      // Just before the deadline nothing is closed; at it, every socket that has not spoken is.
      vi.advanceTimersByTime(199);
      await sleep(50);
      expect([silent.closed(), halfUpgrade.closed(), mute.readyState]).toEqual([
        false,
        false,
        WebSocket.OPEN,
      ]);
      vi.advanceTimersByTime(1);
      await Promise.all([silent.close, halfUpgrade.close]);
      expect(await muteClosed).toBe(1006);
      // The talker finished its handshake by speaking: the deadline no longer applies to it.
      expect(talker.readyState).toBe(WebSocket.OPEN);
      talker.send(Buffer.from("still here"));
      expect(String(await nextMessage(talker))).toBe("still here");
    } finally {
      vi.useRealTimers();
    }
  });

  it("drops sockets past the handshake cap on accept", async () => {
    const target = await startTarget();
    // The handshake deadline's clock never moves here: a socket that closes was dropped on accept.
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    try {
      const proxy = await startProxy(target, { handshakeTimeoutMs: 5000, maxHandshakes: 2 });
      const held = [0, 1].map(() =>
        connect({ host: "127.0.0.1", port: proxy.port }).on("error", () => undefined),
      );
      await sleep(100);
      await rawSocket(proxy.port).close;
      for (const socket of held) socket.destroy();
      await sleep(50);
      const ws = await openTunnel(proxy, target.address);
      ws.send(Buffer.from("ok"));
      expect(String(await nextMessage(ws))).toBe("ok");
    } finally {
      vi.useRealTimers();
    }
  });

  it("closes a tunnel idle both ways, and keeps one that has traffic", async () => {
    const target = await startTarget();
    // The proxy's timers run on a clock the test moves (sockets stay real): which tunnel is idle is
    // decided by the test's steps, not by how busy the machine is.
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    try {
      const proxy = await startProxy(target, { idleTimeoutMs: 300 });
      const idle = await openTunnel(proxy, target.address);
      idle.send(Buffer.from("x"));
      await nextMessage(idle);
      const busy = await openTunnel(proxy, target.address);
      const idleClosed = closed(idle);
      // 800 ms of the proxy's clock in steps of 100, the busy tunnel answering at every step.
      for (let i = 0; i < 8; i++) {
        busy.send(Buffer.from(`tick ${i}`));
        expect(String(await nextMessage(busy))).toBe(`tick ${i}`);
        vi.advanceTimersByTime(100);
      }
      expect(await idleClosed).toBe(1001);
      expect(busy.readyState).toBe(WebSocket.OPEN);
      expect(proxy.stats().open[target.address]).toBe(1);
    } finally {
      vi.useRealTimers();
    }
  });

  it("answers 503 past the tunnel cap, and opens again once a tunnel closes", async () => {
    const target = await startTarget();
    const proxy = await startProxy(target, { maxTunnels: 2 });
    const first = await openTunnel(proxy, target.address);
    await openTunnel(proxy, target.address);
    await expect(openTunnel(proxy, target.address)).rejects.toThrow("HTTP 503");
    first.close();
    await closed(first);
    await sleep(50);
    const third = await openTunnel(proxy, target.address);
    third.send(Buffer.from("in"));
    expect(String(await nextMessage(third))).toBe("in");
  });

  it("stops reading the client while the database does not read (bounded buffer, nothing lost)", async () => {
    const target = await startTarget((socket) => socket.pause());
    const proxy = await startProxy(target);
    const ws = await openTunnel(proxy, target.address);
    const chunk = Buffer.alloc(MiB, 7);
    const total = 96;
    for (let i = 0; i < total; i++) ws.send(chunk);
    let maxBuffered = 0;
    for (let i = 0; i < 20; i++) {
      maxBuffered = Math.max(maxBuffered, proxy.stats().bufferedBytes);
      await sleep(20);
    }
    // Without backpressure the proxy would take in everything the kernel does not hold (tens of MiB).
    expect(maxBuffered).toBeLessThan(4 * MiB);
    expect(ws.bufferedAmount).toBeGreaterThan(0);
    for (const socket of target.sockets) socket.resume();
    for (let i = 0; i < 1_500 && target.received() < total * MiB; i++) await sleep(20);
    expect(target.received()).toBe(total * MiB);
  });

  it("stops reading the database while the client does not read (bounded buffer, nothing lost)", async () => {
    const total = 96;
    const chunk = Buffer.alloc(MiB, 9);
    let written = 0;
    const target = await startTarget((socket) => {
      socket.once("data", () => {
        const pump = () => {
          while (written < total) {
            written++;
            if (!socket.write(chunk)) return void socket.once("drain", pump);
          }
        };
        pump();
      });
    });
    const proxy = await startProxy(target);
    const ws = await openTunnel(proxy, target.address);
    let received = 0;
    ws.on("message", (data: Buffer) => {
      received += data.length;
    });
    ws.pause();
    ws.send(Buffer.from("go"));
    let maxBuffered = 0;
    for (let i = 0; i < 20; i++) {
      maxBuffered = Math.max(maxBuffered, proxy.stats().bufferedBytes);
      await sleep(20);
    }
    expect(maxBuffered).toBeLessThan(4 * MiB);
    expect(written).toBeLessThan(total);
    ws.resume();
    for (let i = 0; i < 1_500 && received < total * MiB; i++) await sleep(20);
    expect(received).toBe(total * MiB);
  });

  it("closes a tunnel that sends more than the bound before its database connects", async () => {
    const target = await startTarget();
    // A TCP connection that never completes, as a slow network would leave it.
    const proxy = await startProxy(target, { maxPendingBytes: 64 * 1024 }, { dial: () => new Socket() });
    const small = await openTunnel(proxy, target.address);
    small.send(Buffer.alloc(16 * 1024));
    const large = await openTunnel(proxy, target.address);
    large.send(Buffer.alloc(40 * 1024));
    large.send(Buffer.alloc(40 * 1024));
    expect(await closed(large)).toBe(1009);
    expect(small.readyState).toBe(WebSocket.OPEN);
    expect(proxy.stats().bufferedBytes).toBe(16 * 1024);
  });

  it("stall: open and new tunnels pass no byte either way; unstall cuts them and new ones forward", async () => {
    const target = await startTarget();
    const proxy = await startProxy(target, {}, { control: true });
    const old = await openTunnel(proxy, target.address);
    old.send(Buffer.from("before"));
    expect(String(await nextMessage(old))).toBe("before");

    expect((await control(proxy, "stall?address=127.0.0.1:1")).status).toBe(404);
    const stalled = await control(proxy, `stall?address=${target.address}`);
    expect(stalled.stats).toMatchObject({ stalled: [target.address], frozen: { [target.address]: 1 } });

    const receivedBefore = target.received();
    const fresh = await openTunnel(proxy, target.address);
    for (let i = 0; i < 50 && target.sockets.length < 2; i++) await sleep(10);
    expect(target.sockets).toHaveLength(2); // the TCP connection of the new tunnel was opened
    old.send(Buffer.from("into the void"));
    fresh.send(Buffer.from("startup"));
    for (const socket of target.sockets) socket.write("from the database");
    expect(await Promise.all([nextMessage(old, 300), nextMessage(fresh, 300)])).toEqual([
      "timeout",
      "timeout",
    ]);
    expect(target.received()).toBe(receivedBefore);
    expect(old.readyState).toBe(WebSocket.OPEN);
    expect(fresh.readyState).toBe(WebSocket.OPEN);
    expect((await control(proxy, "stats")).stats?.frozen).toEqual({ [target.address]: 2 });

    const oldClosed = closed(old);
    const freshClosed = closed(fresh);
    const unstalled = await control(proxy, `unstall?address=${target.address}`);
    expect(unstalled.stats?.stalled).toEqual([]);
    await Promise.all([oldClosed, freshClosed]);
    const after = await openTunnel(proxy, target.address);
    after.send(Buffer.from("after"));
    expect(String(await nextMessage(after))).toBe("after");
  });
});
