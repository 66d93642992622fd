/**
 * What a wire connection buffers (docs/adr/017-wire-protocol.md, "Bounds"): the queues its bytes
 * wait in, whose every operation costs a constant, and the counts of what each hop holds, per
 * direction, which tests read instead of a clock (`WireLedger`, one per side and isolate).
 *
 * Pure: data structures and counts.
 */

/** First in, first out, with a constant cost per operation (`Array.shift` moves every element). */
export class Fifo<T> {
  private entries: T[] = [];
  private first = 0;

  get size(): number {
    return this.entries.length - this.first;
  }

  push(item: T): void {
    this.entries.push(item);
  }

  peek(): T | undefined {
    return this.entries[this.first];
  }

  /** Replaces the first item (what is left of it, once part was taken). */
  replaceFirst(item: T): void {
    if (this.size > 0) this.entries[this.first] = item;
  }

  shift(): T | undefined {
    if (this.size === 0) return undefined;
    const item = this.entries[this.first];
    this.first++;
    if (this.first === this.entries.length) {
      this.entries = [];
      this.first = 0;
    } else if (this.first >= 64 && this.first * 2 >= this.entries.length) {
      this.entries = this.entries.slice(this.first);
      this.first = 0;
    }
    return item;
  }

  /** The item `index` places from the first, without taking it. */
  at(index: number): T | undefined {
    return this.entries[this.first + index];
  }

  /** Takes every item, oldest first; the queue is empty after. */
  takeAll(): T[] {
    const items = this.entries.slice(this.first);
    this.clear();
    return items;
  }

  clear(): void {
    this.entries = [];
    this.first = 0;
  }
}

/**
 * The next `size` bytes of a queue of byte arrays (it holds at least that many), as one array: a
 * part, or a view of one, when it is that large; smaller parts joined, each byte copied once.
 */
export function takeBytes(queue: Fifo<Uint8Array>, size: number): Uint8Array {
  const head = queue.peek() ?? new Uint8Array(0);
  if (head.byteLength >= size) {
    if (head.byteLength === size) queue.shift();
    else queue.replaceFirst(head.subarray(size));
    return head.subarray(0, size);
  }
  const out = new Uint8Array(size);
  let filled = 0;
  while (filled < size) {
    const part = queue.peek();
    if (!part) break;
    const piece = Math.min(part.byteLength, size - filled);
    out.set(part.subarray(0, piece), filled);
    filled += piece;
    if (piece === part.byteLength) queue.shift();
    else queue.replaceFirst(part.subarray(piece));
  }
  return out;
}

// ── What each hop holds, for tests and status ────────────────────────────────────────────────────

/** The places a wire connection holds bytes, per direction and hop. */
export const wireBufferFields = [
  // Client to server: held at the edge, in flight to the object, held in the object, owed by the server.
  "toServerEdge",
  "toServerInFlight",
  "toServerObject",
  "toServerOwed",
  // Server to client: held in the object, in flight to the edge, held at the edge.
  "toClientObject",
  "toClientInFlight",
  "toClientEdge",
] as const;
export type WireBufferField = (typeof wireBufferFields)[number];

export type WireBufferCounts = Record<WireBufferField, number>;

/** One connection's counts now and the most each reached. */
export interface WireBufferSnapshot {
  pid: number;
  now: Partial<WireBufferCounts>;
  peak: Partial<WireBufferCounts>;
  ended: boolean;
}

/** One connection's counts on one side (edge or object). */
export class WireGauge {
  readonly now: Partial<WireBufferCounts> = {};
  readonly peak: Partial<WireBufferCounts> = {};
  ended = false;

  constructor(readonly pid: number) {}

  set(field: WireBufferField, value: number): void {
    this.now[field] = value;
    if (value > (this.peak[field] ?? 0)) this.peak[field] = value;
  }

  snapshot(): WireBufferSnapshot {
    return { pid: this.pid, now: { ...this.now }, peak: { ...this.peak }, ended: this.ended };
  }
}

/** The gauges of one isolate's wire connections on one side, and the last ones that ended. */
export class WireLedger {
  private readonly live = new Map<number, WireGauge>();
  private readonly endedGauges: WireGauge[] = [];

  constructor(private readonly keepEnded = 64) {}

  open(pid: number): WireGauge {
    const gauge = new WireGauge(pid);
    this.live.set(pid, gauge);
    return gauge;
  }

  /** The connection ended; its gauge (read after everything it held was released) is kept a while. */
  close(gauge: WireGauge): void {
    gauge.ended = true;
    if (this.live.get(gauge.pid) === gauge) this.live.delete(gauge.pid);
    this.endedGauges.push(gauge);
    if (this.endedGauges.length > this.keepEnded) this.endedGauges.shift();
  }

  /** The connection with `pid`: live, or among the last that ended (the latest first). */
  find(pid: number): WireBufferSnapshot | null {
    const gauge =
      this.live.get(pid) ?? [...this.endedGauges].reverse().find((candidate) => candidate.pid === pid);
    return gauge ? gauge.snapshot() : null;
  }

  /** The sums over the live connections, per field. */
  totals(): WireBufferCounts {
    const totals = Object.fromEntries(wireBufferFields.map((field) => [field, 0])) as WireBufferCounts;
    for (const gauge of this.live.values()) {
      for (const field of wireBufferFields) totals[field] += gauge.now[field] ?? 0;
    }
    return totals;
  }

  get size(): number {
    return this.live.size;
  }
}

/**
 * What goes in the next frame of a queue of whole messages (each part one or more whole messages):
 * whole parts joined while they fit in `size`; a part larger than `frameBytes` is cut, as it must
 * cross in frames anyway. Null when the first part fits a frame but not `size` (it waits for room),
 * so that frames end between messages whenever a message fits one: a connection ended mid-stream
 * can then still be told why, after the last whole message.
 */
export function takeWhole(
  queue: Fifo<Uint8Array>,
  size: number,
  frameBytes: number,
): { bytes: Uint8Array; cut: boolean } | null {
  const head = queue.peek();
  if (!head) return null;
  if (head.byteLength > frameBytes) {
    const piece = Math.min(size, frameBytes);
    const bytes = head.subarray(0, piece);
    queue.replaceFirst(head.subarray(piece));
    return { bytes, cut: true };
  }
  if (head.byteLength > size) return null;
  let total = 0;
  let count = 0;
  for (let part = queue.at(0); part !== undefined; part = queue.at(count)) {
    if (total + part.byteLength > size || part.byteLength > frameBytes) break;
    total += part.byteLength;
    count++;
  }
  if (count === 1) {
    queue.shift();
    return { bytes: head, cut: false };
  }
  const bytes = new Uint8Array(total);
  let at = 0;
  for (let i = 0; i < count; i++) {
    const part = queue.shift() ?? new Uint8Array(0);
    bytes.set(part, at);
    at += part.byteLength;
  }
  return { bytes, cut: false };
}
