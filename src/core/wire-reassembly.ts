/**
 * Reassembly of Postgres protocol messages from the frames they arrive in, in time and copies
 * linear in the bytes (docs/adr/017-wire-protocol.md, "Bounds"). A frame may hold half a message or
 * many; the reader keeps the frames it was given as they are, in a queue, and hands out:
 *
 * - a message that lies inside one frame as a view of that frame (no copy);
 * - a message that spans frames as one new buffer of exactly its size, each of its bytes copied
 *   once, when its last byte has arrived.
 *
 * So each byte is copied at most once, however the stream is split, and a push costs a constant
 * (the queue's head moves by an index; it is compacted when half of it is spent). Reading a header
 * that spans frames looks at five bytes. The bound on a message's declared length is checked as soon
 * as its header is whole, before anything of its body is waited for; with `limitFrames`, a message
 * may span at most `maxFramesPerMessage` frames, so that the per-frame cost of a client's frames is
 * paid for by the bytes they carry (a message in 1-byte frames is refused, not reassembled).
 *
 * Pure: bytes in, messages out, and counts (`copiedBytes`) that tests read.
 */

/** A whole message: its type (0 for the untyped startup packet), all its bytes, and its body. */
export interface Message {
  type: number;
  /** Type byte, length and body: what is forwarded. */
  bytes: Uint8Array;
  /** What follows the length. */
  body: Uint8Array;
}

/**
 * Why a stream cannot be read on: a length below 4, one past the bound, or a message spread over
 * more frames than its length allows.
 */
export type FrameProblem =
  | { problem: "malformed" }
  | { problem: "oversized"; declared: number }
  | { problem: "fragmented"; declared: number; frames: number };

/** Whether `next()` answered a problem rather than a message. */
export function isFrameProblem(value: Message | FrameProblem): value is FrameProblem {
  return "problem" in value;
}

/**
 * The most frames a message of `declared` bytes may arrive in: 16, and one more for every 4 KiB of
 * it. Drivers send a message in one frame (or many messages in one); a client that splits finer
 * pays per frame more than its bytes are worth to it, and every frame costs Lessor a dispatch at the
 * edge and in the object.
 */
export function maxFramesPerMessage(declared: number): number {
  return 16 + Math.floor(declared / 4096);
}

/** The queue is compacted once this many frames at its head are spent (and they are half of it). */
const compactAfterFrames = 64;

/**
 * Reassembles messages from chunks. `next()` answers a whole message, `null` until one is whole, or
 * a problem (sticky: a stream with a bad length cannot be resynchronised). Messages are views of
 * buffers that are never written again, so they stay valid after later pushes.
 */
export class MessageReader {
  private chunks: Uint8Array[] = [];
  /** The first chunk with unread bytes, and where they start in it. */
  private head = 0;
  private at = 0;
  private bytes = 0;
  private failed: FrameProblem | null = null;
  private readonly maxMessageBytes: number;
  private untyped: boolean;
  private readonly limitFrames: boolean;
  /** Bytes copied to put together messages that spanned chunks (each byte at most once). */
  copiedBytes = 0;

  /**
   * @param maxMessageBytes the largest message accepted, type byte and length included
   * @param untyped whether the next message is a startup packet (no type byte)
   * @param limitFrames whether a message may span at most `maxFramesPerMessage` chunks
   */
  constructor(maxMessageBytes: number, untyped = false, limitFrames = false) {
    this.maxMessageBytes = maxMessageBytes;
    this.untyped = untyped;
    this.limitFrames = limitFrames;
  }

  /** Bytes received and not yet returned as a message. */
  get buffered(): number {
    return this.bytes;
  }

  /** Chunks that still hold unread bytes. */
  get frames(): number {
    return this.chunks.length - this.head;
  }

  /** Everything received and not yet returned as a message, as one array; the reader is empty after. */
  takeRest(): Uint8Array {
    const rest =
      this.frames === 1
        ? (this.chunks[this.head] ?? new Uint8Array(0)).subarray(this.at)
        : this.copyOut(this.bytes);
    this.clear();
    return rest;
  }

  /** Drops everything held (the connection ended). */
  clear(): void {
    this.chunks = [];
    this.head = 0;
    this.at = 0;
    this.bytes = 0;
  }

  /** The next message will be an untyped startup packet (after an SSLRequest was answered). */
  expectStartupPacket(): void {
    this.untyped = true;
  }

  push(chunk: Uint8Array): void {
    if (chunk.byteLength === 0) return;
    this.chunks.push(chunk);
    this.bytes += chunk.byteLength;
  }

  next(): Message | FrameProblem | null {
    if (this.failed) return this.failed;
    const typeBytes = this.untyped ? 0 : 1;
    if (this.bytes < typeBytes + 4) return null;
    const length = this.peekInt32(typeBytes);
    if (length < 4) {
      this.failed = { problem: "malformed" };
      return this.failed;
    }
    const total = typeBytes + length;
    if (total > this.maxMessageBytes) {
      this.failed = { problem: "oversized", declared: total };
      return this.failed;
    }
    if (this.bytes < total) {
      if (this.limitFrames && this.frames > maxFramesPerMessage(total)) {
        this.failed = { problem: "fragmented", declared: total, frames: this.frames };
        return this.failed;
      }
      return null;
    }
    const first = this.chunks[this.head] ?? new Uint8Array(0);
    let bytes: Uint8Array;
    if (first.byteLength - this.at >= total) {
      bytes = first.subarray(this.at, this.at + total);
      this.at += total;
      this.bytes -= total;
      if (this.at === first.byteLength) this.advance();
    } else {
      bytes = this.copyOut(total);
    }
    const type = this.untyped ? 0 : (bytes[0] ?? 0);
    this.untyped = false;
    return { type, bytes, body: bytes.subarray(typeBytes + 4) };
  }

  /** The big-endian int32 `offset` bytes into the unread bytes (there are at least offset + 4). */
  private peekInt32(offset: number): number {
    let value = 0;
    let index = this.head;
    let at = this.at + offset;
    for (let i = 0; i < 4; i++) {
      let chunk = this.chunks[index] ?? new Uint8Array(0);
      while (at >= chunk.byteLength) {
        at -= chunk.byteLength;
        index++;
        chunk = this.chunks[index] ?? new Uint8Array(0);
      }
      value = (value << 8) | (chunk[at] ?? 0);
      at++;
    }
    return value | 0;
  }

  /** Copies the next `count` unread bytes (spanning chunks) into one new array, and consumes them. */
  private copyOut(count: number): Uint8Array {
    const out = new Uint8Array(count);
    let filled = 0;
    while (filled < count) {
      const chunk = this.chunks[this.head] ?? new Uint8Array(0);
      const take = Math.min(chunk.byteLength - this.at, count - filled);
      out.set(chunk.subarray(this.at, this.at + take), filled);
      filled += take;
      this.at += take;
      if (this.at === chunk.byteLength) this.advance();
    }
    this.bytes -= count;
    this.copiedBytes += count;
    return out;
  }

  /** The head chunk is spent: move to the next, compacting the queue now and then. */
  private advance(): void {
    this.head++;
    this.at = 0;
    if (this.head === this.chunks.length) {
      this.chunks = [];
      this.head = 0;
    } else if (this.head >= compactAfterFrames && this.head * 2 >= this.chunks.length) {
      this.chunks = this.chunks.slice(this.head);
      this.head = 0;
    }
  }
}
