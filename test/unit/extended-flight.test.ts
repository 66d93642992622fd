/**
 * `extendedFlight` (src/core/extended-flight.ts): the bytes of a `/sql` statement's flight, read
 * back message by message as Postgres reads them. Every integration test then runs it against the
 * real server (parameters, NULLs, multibyte text, the JWT prelude).
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { extendedFlight, type FlightStatement } from "../../src/core/extended-flight.ts";
import { type Message, textMessage } from "../../src/core/pg-wire.ts";
import { messagesIn } from "./wire-bytes.ts";

const decoder = new TextDecoder();

/** A body read as Postgres's pq_getmsg* functions read it. */
class Body {
  private at = 0;
  private readonly view: DataView;
  constructor(private readonly bytes: Uint8Array) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }
  cstring(): string {
    const nul = this.bytes.indexOf(0, this.at);
    const text = decoder.decode(this.bytes.subarray(this.at, nul));
    this.at = nul + 1;
    return text;
  }
  byte(): number {
    return this.bytes[this.at++] ?? -1;
  }
  uint16(): number {
    const value = this.view.getUint16(this.at);
    this.at += 2;
    return value;
  }
  int32(): number {
    const value = this.view.getInt32(this.at);
    this.at += 4;
    return value;
  }
  take(length: number): string {
    const text = decoder.decode(this.bytes.subarray(this.at, this.at + length));
    this.at += length;
    return text;
  }
  get done(): boolean {
    return this.at === this.bytes.byteLength;
  }
}

/** Reads back a Parse and its Bind: the statement they carry. */
function statementOf(parse: Message, bind: Message): FlightStatement {
  const p = new Body(parse.body);
  expect(p.cstring()).toBe("");
  const query = p.cstring();
  expect(p.uint16()).toBe(0);
  expect(p.done).toBe(true);
  const b = new Body(bind.body);
  expect([b.cstring(), b.cstring(), b.uint16()]).toEqual(["", "", 0]);
  const params: (string | null)[] = [];
  for (let count = b.uint16(); count > 0; count--) {
    const length = b.int32();
    params.push(length === -1 ? null : b.take(length));
  }
  expect(b.uint16()).toBe(0);
  expect(b.done).toBe(true);
  return { query, params };
}

const types = (messages: Message[]) => messages.map((m) => String.fromCharCode(m.type)).join("");
const textWithoutNul = fc.string({ unit: "grapheme", maxLength: 40 }).map((s) => s.replaceAll("\0", ""));

describe("extendedFlight", () => {
  it("encodes any statement as Parse, Bind, Describe portal, Execute all rows, Sync", () => {
    fc.assert(
      fc.property(
        textWithoutNul.filter((s) => s.length > 0),
        fc.array(fc.option(fc.string({ unit: "grapheme", maxLength: 30 }), { nil: null }), { maxLength: 12 }),
        (query, params) => {
          const messages = messagesIn(extendedFlight({ query, params }));
          expect(types(messages)).toBe("PBDES");
          const [parse, bind, describe, execute, sync] = messages as [
            Message,
            Message,
            Message,
            Message,
            Message,
          ];
          expect(statementOf(parse, bind)).toEqual({ query, params });
          expect([...describe.body]).toEqual([0x50, 0]);
          expect([...execute.body]).toEqual([0, 0, 0, 0, 0]);
          expect(sync.body.byteLength).toBe(0);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("puts a prelude first (no Describe: its rows are nobody's) and a trailer last", () => {
    const trailer = textMessage(0x51, "ROLLBACK; DISCARD TEMP");
    const messages = messagesIn(
      extendedFlight(
        { query: "SELECT $1::int", params: ["7"] },
        { query: "SELECT set_config('x', $1, true)", params: ["{}"] },
        trailer,
      ),
    );
    expect(types(messages)).toBe("PBEPBDESQ");
    const [p1, b1, , p2, b2] = messages as Message[];
    expect(statementOf(p1 as Message, b1 as Message)).toEqual({
      query: "SELECT set_config('x', $1, true)",
      params: ["{}"],
    });
    expect(statementOf(p2 as Message, b2 as Message)).toEqual({ query: "SELECT $1::int", params: ["7"] });
    expect(messages.at(-1)?.bytes).toEqual(trailer);
  });

  it("counts parameters up to the protocol's 65,535 and tells an empty string from NULL", () => {
    const params = Array.from({ length: 65_535 }, (_, i) => (i % 3 === 0 ? null : i % 3 === 1 ? "" : "é"));
    const [parse, bind] = messagesIn(extendedFlight({ query: "SELECT 1", params })) as [Message, Message];
    expect(statementOf(parse, bind).params).toEqual(params);
  });
});
