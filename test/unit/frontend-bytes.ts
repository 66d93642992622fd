/** Test helper: the whole messages in `bytes`, as Postgres would frame them (every byte accounted for). */
import { expect } from "vitest";
import { isFrameProblem, type Message, MessageReader } from "../../src/core/pg-wire.ts";

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
