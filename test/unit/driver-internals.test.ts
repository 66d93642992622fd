/**
 * The driver behind one seam (src/postgres/internals.ts, issue 42): each private part of the Neon
 * driver that Lessor's hot path uses is pinned here against the installed driver, by name, so an
 * upgrade that changes one fails in this file and says which; and no file outside `src/postgres/`
 * reaches one itself.
 */
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { Client, Pool, type PoolClient } from "@neondatabase/serverless";
import { describe, expect, it } from "vitest";
import { readyForQuery } from "../../src/core/pg-wire.ts";
import {
  chunkPart,
  driverPoolClients,
  driverPoolMax,
  driverStream,
  onReadyForQuery,
  setDriverPoolMax,
} from "../../src/postgres/internals.ts";

/** A client that never connects (nothing listens on port 1): only its objects are looked at. */
function idleClient(): PoolClient {
  return new Client("postgres://nobody:nothing@127.0.0.1:1/none") as unknown as PoolClient;
}

describe("the driver's parts the seam uses, on the installed driver", () => {
  it("a pool's maximum is pg-pool's options.max, which decides whether the pool is full", () => {
    const pool = new Pool({ max: 3 });
    const internals = pool as unknown as { _isFull(): boolean; _clients: unknown[] };
    expect(driverPoolMax(pool)).toBe(3);
    internals._clients.push({}, {});
    expect(internals._isFull()).toBe(false);
    setDriverPoolMax(pool, 2);
    expect(driverPoolMax(pool)).toBe(2);
    expect(internals._isFull()).toBe(true);
    setDriverPoolMax(pool, 4);
    expect(internals._isFull()).toBe(false);
  });

  it("a pool's connections are pg-pool's _clients, copied (ending a pool waits for each)", () => {
    const pool = new Pool({ max: 3 });
    const internals = pool as unknown as { _clients: unknown[] };
    const [a, b] = [{}, {}];
    internals._clients.push(a, b);
    const seen = driverPoolClients(pool);
    expect(seen).toEqual([a, b]);
    seen.pop();
    expect(internals._clients).toEqual([a, b]);
  });

  it("a raised maximum pulses the queue once per connection added (pg-pool's _pulseQueue)", () => {
    const pool = new Pool({ max: 1 });
    const internals = pool as unknown as { _pulseQueue: () => void; _pendingQueue: unknown[] };
    expect(typeof internals._pulseQueue).toBe("function");
    let pulses = 0;
    internals._pulseQueue = () => {
      pulses++;
    };
    // Three checkouts waiting (waitingCount is the pending queue's length).
    internals._pendingQueue.push({}, {}, {});
    expect(pool.waitingCount).toBe(3);
    setDriverPoolMax(pool, 3);
    expect(pulses).toBe(2);
  });

  it("a connection's socket is client.connection.stream, with the events and write the relay uses", () => {
    const stream = driverStream(idleClient());
    for (const method of ["on", "removeListener", "listeners", "write"] as const) {
      expect(typeof stream[method], method).toBe("function");
    }
    // The fields `sendFlight` reads to go past the coalescing timer, as a new socket has them.
    const socket = stream as unknown as Record<string, unknown>;
    expect(socket.tlsState).toBe(0);
    expect("writeBuffer" in socket && socket.writeBuffer === undefined).toBe(true);
    expect("ws" in socket).toBe(true);
  });

  it("the connection parses a ReadyForQuery from its socket and emits it with its status", () => {
    const client = idleClient();
    const seen: (string | undefined)[] = [];
    onReadyForQuery(client, (message) => seen.push(message.status));
    const connection = (client as unknown as { connection: { attachListeners(stream: unknown): void } })
      .connection;
    const stream = driverStream(client) as unknown as { emit(event: string, chunk: unknown): void };
    connection.attachListeners(stream);
    stream.emit("data", Buffer.from(readyForQuery("T")));
    stream.emit("data", Buffer.from(readyForQuery("I")));
    expect(seen).toEqual(["T", "I"]);
  });

  it("a chunk's part is a view of the same bytes, of the driver's Buffer class", () => {
    const chunk = Buffer.from([1, 2, 3, 4]);
    const part = chunkPart(chunk, 1, 3);
    expect(Buffer.isBuffer(part)).toBe(true);
    chunk[1] = 9;
    expect([...part]).toEqual([9, 3]);
  });

  it("client.query takes a Submittable: the driver calls its submit with the connection", () => {
    const client = idleClient() as unknown as {
      query(submittable: unknown): void;
      queryQueue: unknown[];
    };
    const submittable = { submit: () => null };
    client.query(submittable);
    // Not connected: it waits in the client's queue, as the driver's own queries do.
    expect(client.queryQueue).toContain(submittable);
  });
});

/** Names of the driver's private parts; only `src/postgres/` may reach them. */
const privateParts =
  /\b(_pulseQueue|_clients|_pendingQueue|_isFull|_ending|_handleAuth\w*|tlsState|writeBuffer|getStartupConf|processID)\b|options\.max\b|\.connection\.stream\b|as unknown as \{ (connection|query)\b/;

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return path.endsWith(".ts") ? [path] : [];
  });
}

describe("the seam", () => {
  it("no file outside src/postgres/ reaches a private part of the driver", () => {
    const root = new URL("../../src/", import.meta.url).pathname;
    const offenders: string[] = [];
    for (const file of sourceFiles(root)) {
      const path = relative(root, file);
      if (path.startsWith("postgres/")) continue;
      readFileSync(file, "utf8")
        .split("\n")
        .forEach((line, index) => {
          const code = line.replace(/\/\/.*$/, "");
          if (/^\s*\*/.test(code)) return;
          if (privateParts.test(code)) offenders.push(`src/${path}:${index + 1}: ${line.trim()}`);
        });
    }
    expect(offenders).toEqual([]);
  });
});
