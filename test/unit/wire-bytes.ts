/**
 * Test helpers for protocol bytes: backend messages built byte for byte as Postgres sends them, and
 * the whole messages in a run of bytes, framed as Postgres frames them.
 */
import { expect } from "vitest";
import {
  concatBytes,
  frontendMessage,
  isFrameProblem,
  type Message,
  MessageReader,
  noticeResponse,
} from "../../src/core/pg-wire.ts";

const encoder = new TextEncoder();

export const cstring = (text: string): Uint8Array => concatBytes([encoder.encode(text), new Uint8Array([0])]);

/** A backend message: its framing is the same as a frontend one's. */
export const backend = (type: string, body: Uint8Array = new Uint8Array(0)): Uint8Array =>
  frontendMessage(type.charCodeAt(0), body);

export const commandComplete = (tag: string): Uint8Array => backend("C", cstring(tag));

/**
 * How the reset's answer opens after a statement that left a transaction open
 * (src/tenant-object/pool/connection-state.ts): its `BEGIN` warns, then `BEGIN` and `ROLLBACK` complete.
 */
export const resetOpeningInTransaction: readonly Uint8Array[] = [
  noticeResponse({
    severity: "WARNING",
    code: "25001",
    message: "there is already a transaction in progress",
  }),
  commandComplete("BEGIN"),
  commandComplete("ROLLBACK"),
];

/** A DataRow of text values. */
export function dataRow(values: string[]): Uint8Array {
  const parts: Uint8Array[] = [new Uint8Array([0, values.length])];
  for (const value of values) {
    const bytes = encoder.encode(value);
    const length = new Uint8Array(4);
    new DataView(length.buffer).setInt32(0, bytes.byteLength);
    parts.push(length, bytes);
  }
  return backend("D", concatBytes(parts));
}

/** The whole messages in `bytes` (every byte accounted for). */
export function messagesIn(bytes: Uint8Array): Message[] {
  const reader = new MessageReader(bytes.byteLength + 1);
  reader.push(bytes);
  const messages: Message[] = [];
  for (let next = reader.next(); next !== null; next = reader.next()) {
    if (isFrameProblem(next)) throw new Error("unframed bytes");
    messages.push(next);
  }
  expect(reader.buffered).toBe(0);
  return messages;
}
