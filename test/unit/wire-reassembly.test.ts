/**
 * Reassembly is linear (issue 40): however a stream of messages is split into frames, the reader
 * copies each byte at most once, and only the bytes of a message that spans frames. The copies are
 * counted where they happen (every copy of a typed array into another goes through
 * `Uint8Array.prototype.set`), not by a clock.
 */
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";
import {
  concatBytes,
  frontend,
  isFrameProblem,
  type Message,
  MessageReader,
  textMessage,
} from "../../src/core/pg-wire.ts";

const nativeSet = Uint8Array.prototype.set;
let copied = 0;

/** Counts the bytes every `Uint8Array.prototype.set` copies while `run` runs. */
function countingCopies<T>(run: () => T): { result: T; copied: number } {
  copied = 0;
  Uint8Array.prototype.set = function (this: Uint8Array, source: ArrayLike<number>, offset?: number) {
    copied += source.length;
    return nativeSet.call(this, source, offset);
  } as typeof Uint8Array.prototype.set;
  try {
    return { result: run(), copied };
  } finally {
    Uint8Array.prototype.set = nativeSet;
  }
}

afterEach(() => {
  Uint8Array.prototype.set = nativeSet;
});

/** Splits `bytes` at the given cut points (sorted, deduplicated, inside the array). */
function split(bytes: Uint8Array, cuts: readonly number[]): Uint8Array[] {
  const points = [...new Set(cuts.map((cut) => cut % (bytes.byteLength + 1)))].sort((a, b) => a - b);
  const chunks: Uint8Array[] = [];
  let at = 0;
  for (const point of [...points, bytes.byteLength]) {
    if (point <= at) continue;
    chunks.push(bytes.slice(at, point));
    at = point;
  }
  return chunks;
}

/** Feeds the chunks and reads every message; the copies the reader made are counted. */
function reassemble(chunks: readonly Uint8Array[], max: number): { messages: Message[]; copied: number } {
  const reader = new MessageReader(max);
  const { result, copied: bytes } = countingCopies(() => {
    const messages: Message[] = [];
    for (const chunk of chunks) {
      reader.push(chunk);
      for (;;) {
        const next = reader.next();
        if (next === null) break;
        if (isFrameProblem(next)) throw new Error(`unexpected ${next.problem}`);
        messages.push(next);
      }
    }
    return messages;
  });
  return { messages: result, copied: bytes };
}

describe("MessageReader copies each byte at most once, however the stream is split", () => {
  it("a 64 KiB message in 64-byte frames is copied once, not once per frame", () => {
    const message = textMessage(frontend.query, "x".repeat(64 * 1024));
    const chunks = split(
      message,
      Array.from({ length: Math.ceil(message.byteLength / 64) }, (_, i) => i * 64),
    );
    const { messages, copied: bytes } = reassemble(chunks, 1 << 20);
    expect(messages).toHaveLength(1);
    expect(messages[0]?.bytes).toEqual(message);
    expect(bytes).toBeLessThanOrEqual(message.byteLength);
  });

  it("for any messages and any split, the bytes copied are at most the bytes sent", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 3000 }), { minLength: 1, maxLength: 12 }),
        fc.array(fc.nat(), { maxLength: 400 }),
        (sizes, cuts) => {
          const sent = sizes.map((size, i) =>
            textMessage(frontend.query, String.fromCharCode(97 + (i % 26)).repeat(size)),
          );
          const stream = concatBytes(sent);
          const { messages, copied: bytes } = reassemble(split(stream, cuts), 1 << 20);
          expect(messages.map((m) => [...m.bytes])).toEqual(sent.map((m) => [...m]));
          expect(bytes).toBeLessThanOrEqual(stream.byteLength);
        },
      ),
      { numRuns: 300 },
    );
  });
});
