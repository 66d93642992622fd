/**
 * What Lessor's hot path uses of the Neon driver beyond its public API (pg's `Client` and pg-pool's
 * `Pool` under it), in one file behind named functions. Nothing in `src/tenant-object/` reaches a
 * private field of the driver except through here; `test/unit/driver-internals.test.ts` pins each
 * field against the installed driver, so an upgrade that changes one fails there, by name, and
 * `test/unit/driver-seam.test.ts` fails if a file outside `src/postgres/` reaches one itself.
 *
 * - a pool's maximum, read and resized in place (adaptive admission, docs/adr/022), and its
 *   connections (ending a pool waits for each one's end, src/postgres/index.ts `endPool`);
 * - a connection's socket (the driver's `stream`), which `/sql` reads a statement's answer from and
 *   the wire endpoint relays (execute.ts, wire-server.ts);
 * - a connection's ReadyForQuery, whose status the reset checks (connection-state.ts);
 * - a `Submittable` handed to `client.query` (pg's own protocol for pg-cursor and pg-query-stream:
 *   the driver gives it the connection and calls its `handle*` methods);
 * - a flight written straight to the WebSocket, past the driver's coalescing timer, when the socket
 *   is plain and holds nothing of its own (docs/adr/025).
 */
import type { Pool, PoolClient } from "@neondatabase/serverless";

export type ChunkListener = (chunk: Uint8Array) => void;

/** The driver's socket, as far as a statement or the wire relay uses it. */
export interface DriverStream {
  on(event: "data", listener: ChunkListener): void;
  on(event: "close", listener: () => void): void;
  removeListener(event: "data", listener: ChunkListener): void;
  removeListener(event: "close", listener: () => void): void;
  listeners(event: "data"): ChunkListener[];
  write(bytes: Uint8Array): boolean;
}

/** The driver's connection, as a `Submittable` is given it: its socket, and COPY's refusal. */
export interface DriverConnection {
  sendCopyFail(message: string): void;
  stream: DriverStream;
}

/** pg's protocol for a query object of one's own (`client.query(submittable)`). */
export interface Submittable {
  submit(connection: DriverConnection): null;
}

interface PoolInternals {
  options: { max: number };
  _pulseQueue?: () => void;
  _clients?: object[];
}

/** Every connection the driver pool holds now, idle or checked out (pg-pool's `_clients`). */
export function driverPoolClients(pool: Pool): object[] {
  return [...((pool as unknown as PoolInternals)._clients ?? [])];
}

/** The most connections the driver pool may hold (pg-pool's `options.max`, read at each checkout). */
export function driverPoolMax(pool: Pool): number {
  return (pool as unknown as PoolInternals).options.max;
}

/**
 * Sets the most connections the driver pool may hold. pg-pool reads `options.max` each time it
 * decides whether it may open a connection (`_isFull`), so the new maximum holds from the next
 * checkout on. A raised maximum does not by itself serve the checkouts already queued (pg-pool opens
 * a connection for a queued one only when it pulses its queue, on a release or a removal), so the
 * queue is pulsed once per connection added. Lowering it closes nothing: the caller closes idle
 * connections itself. `test/integration/adaptive.test.ts` proves against Postgres that a grown pool
 * opens more backends and a shrunk one fewer.
 */
export function setDriverPoolMax(pool: Pool, max: number): void {
  const internals = pool as unknown as PoolInternals;
  const before = internals.options.max;
  internals.options.max = max;
  for (let added = before; added < max && pool.waitingCount > 0; added++) internals._pulseQueue?.();
}

/** A connection's socket (pg's `client.connection.stream`). */
export function driverStream(client: PoolClient): DriverStream {
  return (client as unknown as { connection: { stream: DriverStream } }).connection.stream;
}

/** Calls `listener` with every ReadyForQuery the driver parses on this connection. */
export function onReadyForQuery(client: PoolClient, listener: (message: { status?: string }) => void): void {
  const connection = (client as unknown as { connection?: { on(event: string, listener: unknown): void } })
    .connection;
  connection?.on("readyForQuery", listener);
}

/** Hands a query object of Lessor's to the driver, which queues it as it queues its own. */
export function submitQuery(client: PoolClient, query: Submittable): void {
  (client as unknown as { query(submittable: Submittable): void }).query(query);
}

/**
 * Part of a chunk the driver's socket emitted, as the driver's parser takes it: the chunk is the
 * driver's `Buffer`, whose `slice` (unlike Uint8Array's) is a view of the same bytes, of its class.
 */
export function chunkPart(chunk: Uint8Array, start: number, end?: number): Uint8Array {
  return (chunk as unknown as { slice(start: number, end?: number): Uint8Array }).slice(start, end);
}

/** The driver's socket, as far as sending a flight goes: read only to decide nothing is in the way. */
interface DriverSocket {
  tlsState?: unknown;
  writeBuffer?: unknown;
  ws?: { send(data: Uint8Array): void } | null;
}

/**
 * Writes a flight that is one buffer already. The driver coalesces its writes (`coalesceWrites`):
 * each write is kept and sent from a `setTimeout(…, 0)`, so that the messages it writes one by one
 * leave in one WebSocket frame. A flight built whole gains nothing from it and pays a timer per
 * request and a turn of the event loop before its bytes leave; it goes straight to the WebSocket
 * when the socket is plain (no TLS inside it) and holds no bytes of its own still waiting, which
 * the flight would otherwise overtake. Anything else (the TCP path's socket, another driver version
 * whose fields differ) takes the driver's own path.
 */
export function sendFlight(stream: Pick<DriverStream, "write">, flight: Uint8Array): void {
  const socket = stream as unknown as DriverSocket;
  const ws = socket.ws;
  if (
    "tlsState" in socket &&
    socket.tlsState === 0 &&
    "writeBuffer" in socket &&
    socket.writeBuffer === undefined &&
    ws &&
    typeof ws.send === "function"
  ) {
    ws.send(flight);
    return;
  }
  stream.write(flight);
}
