/**
 * The bytes of a `/sql` statement's flight, encoded in one buffer: Parse, Bind, Describe (portal),
 * Execute and Sync for the statement (the unnamed statement and portal, text parameters, every
 * row), optionally after a prelude (Parse, Bind, Execute: an end user's claims, inside the same
 * transaction) and before a trailer (the pipelined reset's Query message).
 *
 * The driver writes the same messages one at a time, each through its buffer writer and each
 * copied again into the socket's growing write buffer; written here at once, the flight costs one
 * allocation per string and one for the whole (issue 25). The messages are the driver's, byte for
 * byte, but for Bind's parameter formats: none listed (all text), where the driver lists a 0 for
 * each parameter, which means the same.
 *
 * Pure: no runtime.
 */

export interface FlightStatement {
  query: string;
  params: readonly (string | null)[];
}

const encoder = new TextEncoder();

const parseType = 0x50; // P
const bindType = 0x42; // B
const describeType = 0x44; // D
const executeType = 0x45; // E
const syncType = 0x53; // S
const portalKind = 0x50; // P

interface Encoded {
  query: Uint8Array;
  params: (Uint8Array | null)[];
  /** Bytes of its Parse, Bind and Execute (and Describe, for the statement). */
  bytes: number;
}

function encode(statement: FlightStatement, describe: boolean): Encoded {
  const query = encoder.encode(statement.query);
  const params = statement.params.map((value) => (value === null ? null : encoder.encode(value)));
  let paramBytes = 0;
  for (const value of params) paramBytes += 4 + (value?.byteLength ?? 0);
  const parse = 5 + 1 + query.byteLength + 1 + 2;
  const bind = 5 + 1 + 1 + 2 + 2 + paramBytes + 2;
  const execute = 5 + 1 + 4;
  return { query, params, bytes: parse + bind + (describe ? 7 : 0) + execute };
}

function int16At(bytes: Uint8Array, at: number, value: number): number {
  bytes[at] = (value >>> 8) & 0xff;
  bytes[at + 1] = value & 0xff;
  return at + 2;
}

function int32At(bytes: Uint8Array, at: number, value: number): number {
  bytes[at] = (value >>> 24) & 0xff;
  bytes[at + 1] = (value >>> 16) & 0xff;
  bytes[at + 2] = (value >>> 8) & 0xff;
  bytes[at + 3] = value & 0xff;
  return at + 4;
}

/** Writes a message's type and, once its body is written (`body`), its length; returns where it ends. */
function message(bytes: Uint8Array, at: number, type: number, body: (from: number) => number): number {
  bytes[at] = type;
  const end = body(at + 5);
  int32At(bytes, at + 1, end - at - 1);
  return end;
}

/** Writes `statement`'s Parse, Bind, [Describe portal,] Execute at `at`; returns where they end. */
function write(bytes: Uint8Array, start: number, statement: Encoded, describe: boolean): number {
  let at = message(bytes, start, parseType, (from) => {
    bytes[from] = 0; // the unnamed statement
    bytes.set(statement.query, from + 1);
    const end = from + 1 + statement.query.byteLength;
    bytes[end] = 0;
    return int16At(bytes, end + 1, 0); // no parameter types: Postgres infers them
  });
  at = message(bytes, at, bindType, (from) => {
    bytes[from] = 0; // the unnamed portal
    bytes[from + 1] = 0; // of the unnamed statement
    let next = int16At(bytes, from + 2, 0); // no parameter formats: all text
    next = int16At(bytes, next, statement.params.length);
    for (const value of statement.params) {
      if (value === null) {
        next = int32At(bytes, next, -1);
        continue;
      }
      next = int32At(bytes, next, value.byteLength);
      bytes.set(value, next);
      next += value.byteLength;
    }
    return int16At(bytes, next, 0); // no result formats: all text
  });
  if (describe) {
    at = message(bytes, at, describeType, (from) => {
      bytes[from] = portalKind;
      bytes[from + 1] = 0;
      return from + 2;
    });
  }
  return message(bytes, at, executeType, (from) => {
    bytes[from] = 0;
    return int32At(bytes, from + 1, 0); // every row
  });
}

/** The whole flight: [prelude's Parse, Bind, Execute], the statement's five messages, [trailer]. */
export function extendedFlight(
  statement: FlightStatement,
  prelude: FlightStatement | null = null,
  trailer: Uint8Array | null = null,
): Uint8Array {
  const main = encode(statement, true);
  const first = prelude ? encode(prelude, false) : null;
  const bytes = new Uint8Array((first?.bytes ?? 0) + main.bytes + 5 + (trailer?.byteLength ?? 0));
  let at = first ? write(bytes, 0, first, false) : 0;
  at = write(bytes, at, main, true);
  at = message(bytes, at, syncType, (from) => from);
  if (trailer) bytes.set(trailer, at);
  return bytes;
}
