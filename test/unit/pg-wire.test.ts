/**
 * The wire protocol's pure core (src/core/pg-wire.ts): framing under any split, the startup and the
 * messages Lessor reads, the decision to give a connection back, and named prepared statements
 * across connections, checked against a model of one Postgres session. fast-check drives the
 * splits, the byte soup and the statement scripts.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  backend,
  bindStatementName,
  cancelRequest,
  checkStartup,
  commandTag,
  concatBytes,
  decodePassword,
  decodeStartupPacket,
  describedTarget,
  errorFields,
  errorResponse,
  frontend,
  frontendMessage,
  isFrameProblem,
  type Message,
  MessageReader,
  NamedStatements,
  namedStatementLimits,
  parseStatementName,
  readyForQuery,
  readyForQueryStatus,
  refuseCycles,
  ServerFlight,
  splitOptions,
  startupMessage,
  textMessage,
} from "../../src/core/pg-wire.ts";

const encoder = new TextEncoder();

function cstr(text: string): Uint8Array {
  return concatBytes([encoder.encode(text), new Uint8Array([0])]);
}

function parse(name: string, query: string): Uint8Array {
  return frontendMessage(frontend.parse, concatBytes([cstr(name), cstr(query), new Uint8Array([0, 0])]));
}

function bind(statement: string, portal = ""): Uint8Array {
  return frontendMessage(
    frontend.bind,
    concatBytes([cstr(portal), cstr(statement), new Uint8Array([0, 0, 0, 0, 0, 0])]),
  );
}

function close(kind: "S" | "P", name: string): Uint8Array {
  return frontendMessage(frontend.close, concatBytes([encoder.encode(kind), cstr(name)]));
}

function describe_(kind: "S" | "P", name: string): Uint8Array {
  return frontendMessage(frontend.describe, concatBytes([encoder.encode(kind), cstr(name)]));
}

const sync = frontendMessage(frontend.sync, new Uint8Array(0));
const flush = frontendMessage(frontend.flush, new Uint8Array(0));

/** Reads every whole message of `bytes`, fed in the given chunks. */
function readAll(chunks: readonly Uint8Array[], max = 1 << 20): (Message | string)[] {
  const reader = new MessageReader(max);
  const out: (Message | string)[] = [];
  for (const chunk of chunks) {
    reader.push(chunk);
    for (;;) {
      const next = reader.next();
      if (next === null) break;
      if (isFrameProblem(next)) {
        out.push(next.problem);
        return out;
      }
      out.push(next);
    }
  }
  return out;
}

/** Splits `bytes` at the given cut points. */
function split(bytes: Uint8Array, cuts: readonly number[]): Uint8Array[] {
  const points = [...new Set(cuts.map((cut) => cut % (bytes.byteLength + 1)))].sort((a, b) => a - b);
  const chunks: Uint8Array[] = [];
  let at = 0;
  for (const point of points) {
    chunks.push(bytes.slice(at, point));
    at = point;
  }
  chunks.push(bytes.slice(at));
  return chunks;
}

const anyMessage = fc
  .record({
    type: fc.constantFrom(...Object.values(frontend)),
    body: fc.uint8Array({ maxLength: 300 }),
  })
  .map(({ type, body }) => frontendMessage(type, body));

describe("MessageReader: frame reassembly", () => {
  it("reads the same messages however the stream is split into frames", () => {
    fc.assert(
      fc.property(
        fc.array(anyMessage, { maxLength: 20 }),
        fc.array(fc.nat(), { maxLength: 30 }),
        (messages, cuts) => {
          const stream = concatBytes(messages);
          const read = readAll(split(stream, cuts));
          expect(read.map((m) => (typeof m === "string" ? m : [...m.bytes]))).toEqual(
            messages.map((m) => [...m]),
          );
        },
      ),
    );
  });

  it("keeps every message it handed out intact while later frames arrive", () => {
    fc.assert(
      fc.property(fc.array(anyMessage, { minLength: 2, maxLength: 10 }), (messages) => {
        const reader = new MessageReader(1 << 20);
        const seen: Message[] = [];
        for (const bytes of messages) {
          // Half a message at a time: the reader must copy, never overwrite, what it returned.
          const half = bytes.byteLength >> 1;
          reader.push(bytes.slice(0, half));
          reader.push(bytes.slice(half));
          const next = reader.next();
          if (next && !isFrameProblem(next)) seen.push(next);
        }
        expect(seen.map((m) => [...m.bytes])).toEqual(messages.map((m) => [...m]));
      }),
    );
  });

  it("refuses a declared length past its bound, and one below 4, for good", () => {
    const big = new Uint8Array([frontend.query, 0, 1, 0, 0]);
    expect(readAll([big], 1024)).toEqual(["oversized"]);
    const reader = new MessageReader(1024);
    reader.push(new Uint8Array([frontend.query, 0, 0, 0, 3]));
    expect(reader.next()).toEqual({ problem: "malformed" });
    reader.push(textMessage(frontend.query, "SELECT 1"));
    expect(reader.next()).toEqual({ problem: "malformed" });
  });

  it("never throws on any bytes, and reads only well-formed frames", () => {
    fc.assert(
      fc.property(fc.array(fc.uint8Array({ maxLength: 64 }), { maxLength: 10 }), (chunks) => {
        for (const m of readAll(chunks, 4096)) {
          if (typeof m === "string") continue;
          expect(m.bytes.byteLength).toBe(1 + 4 + m.body.byteLength);
        }
      }),
    );
  });

  it("reads an untyped startup packet first, then typed messages; takeRest hands over what is left", () => {
    const reader = new MessageReader(10_000, true);
    const stream = concatBytes([
      startupMessage({ user: "acme", database: "acme" }),
      textMessage(frontend.password, "lsk_key"),
      textMessage(frontend.query, "SELECT 1"),
    ]);
    reader.push(stream);
    const startup = reader.next();
    const password = reader.next();
    if (!startup || isFrameProblem(startup) || !password || isFrameProblem(password)) throw new Error("read");
    expect(decodeStartupPacket(startup.body)).toMatchObject({ kind: "startup", minor: 0 });
    expect(decodePassword(password.body)).toBe("lsk_key");
    expect([...reader.takeRest()]).toEqual([...textMessage(frontend.query, "SELECT 1")]);
    expect(reader.buffered).toBe(0);
  });
});

describe("decoding the messages Lessor reads", () => {
  it("round-trips a startup packet's parameters", () => {
    fc.assert(
      fc.property(
        fc.dictionary(
          fc.string({ minLength: 1 }).filter((s) => !s.includes("\0")),
          fc.string().filter((s) => !s.includes("\0")),
          { maxKeys: 6 },
        ),
        (params) => {
          const packet = startupMessage(params);
          const decoded = decodeStartupPacket(packet.subarray(4));
          expect(decoded).toEqual({ kind: "startup", minor: 0, params: new Map(Object.entries(params)) });
        },
      ),
    );
  });

  it("tells SSLRequest, GSSENCRequest and CancelRequest apart, and refuses what is not a packet", () => {
    const code = (n: number) =>
      new Uint8Array([(n >>> 24) & 255, (n >>> 16) & 255, (n >>> 8) & 255, n & 255]);
    expect(decodeStartupPacket(code(80877103))).toEqual({ kind: "ssl" });
    expect(decodeStartupPacket(code(80877104))).toEqual({ kind: "gssenc" });
    expect(decodeStartupPacket(cancelRequest(1234, -5).subarray(4))).toEqual({
      kind: "cancel",
      pid: 1234,
      secret: -5,
    });
    expect(decodeStartupPacket(code(2 << 16))).toEqual({ kind: "unsupported", version: 2 << 16 });
    expect(decodeStartupPacket(new Uint8Array([0, 3]))).toEqual({ kind: "malformed" });
    // A parameter twice, or no terminator: malformed.
    const twice = concatBytes([code(3 << 16), cstr("user"), cstr("a"), cstr("user"), cstr("b"), cstr("")]);
    expect(decodeStartupPacket(twice)).toEqual({ kind: "malformed" });
    expect(decodeStartupPacket(concatBytes([code(3 << 16), cstr("user"), cstr("a")]))).toEqual({
      kind: "malformed",
    });
  });

  it("never throws on any body", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), (body) => {
        decodeStartupPacket(body);
        decodePassword(body);
        parseStatementName(body);
        bindStatementName(body);
        describedTarget(body);
        readyForQueryStatus(body);
        commandTag(body);
        errorFields(body);
      }),
    );
  });

  it("reads statement names from Parse, Bind, Describe and Close", () => {
    expect(parseStatementName(parse("s1", "SELECT 1").subarray(5))).toBe("s1");
    expect(bindStatementName(bind("s1", "p").subarray(5))).toBe("s1");
    expect(describedTarget(describe_("S", "s1").subarray(5))).toEqual({ kind: "S", name: "s1" });
    expect(describedTarget(close("P", "").subarray(5))).toEqual({ kind: "P", name: "" });
  });

  it("writes ErrorResponse fields a reader reads back", () => {
    const bytes = errorResponse({
      severity: "FATAL",
      code: "53300",
      message: "full",
      detail: "capacity_saturated",
    });
    expect(Object.fromEntries(errorFields(bytes.subarray(5)))).toEqual({
      S: "FATAL",
      V: "FATAL",
      C: "53300",
      M: "full",
      D: "capacity_saturated",
    });
  });
});

describe("checkStartup", () => {
  const params = (extra: Record<string, string> = {}) => new Map(Object.entries({ user: "acme", ...extra }));

  it("takes the user as the tenant, the database as the same one, transaction mode by default", () => {
    expect(checkStartup(params(), "transaction")).toEqual({
      ok: true,
      user: "acme",
      database: "acme",
      mode: "transaction",
      applicationName: "",
      protocolOptions: [],
    });
  });

  it("chooses the mode from options, in both spellings", () => {
    for (const options of [
      "-c lessor.pool_mode=session",
      "-clessor.pool_mode=session",
      "--lessor.pool_mode=session",
    ]) {
      expect(checkStartup(params({ options }), "transaction")).toMatchObject({ ok: true, mode: "session" });
    }
    expect(
      checkStartup(params({ options: "endpoint=ep-1 -c lessor.pool_mode=transaction" }), "session"),
    ).toMatchObject({
      ok: true,
      mode: "transaction",
    });
  });

  it("refuses settings it would not apply, an unknown mode, another encoding and no user", () => {
    expect(checkStartup(params({ options: "-c search_path=x" }), "transaction")).toMatchObject({
      ok: false,
      code: "0A000",
    });
    expect(checkStartup(params({ statement_timeout: "0" }), "transaction")).toMatchObject({ ok: false });
    expect(checkStartup(params({ options: "-c lessor.pool_mode=statement" }), "transaction")).toMatchObject({
      ok: false,
      code: "22023",
    });
    expect(checkStartup(params({ client_encoding: "LATIN1" }), "transaction")).toMatchObject({ ok: false });
    expect(checkStartup(params({ client_encoding: "UTF8" }), "transaction")).toMatchObject({ ok: true });
    expect(checkStartup(new Map(), "transaction")).toMatchObject({ ok: false, code: "28000" });
  });

  it("splits options as Postgres does (backslash escapes)", () => {
    expect(splitOptions("  -c a=b\\ c   --d=e ")).toEqual(["-c", "a=b c", "--d=e"]);
  });
});

// ── A connection's flight ───────────────────────────────────────────────────────────────────────

function serverMessage(type: number, body: Uint8Array = new Uint8Array(0)): Message {
  const bytes = frontendMessage(type, body);
  return { type, bytes, body: bytes.subarray(5) };
}

function clientMessage(bytes: Uint8Array): Message {
  return { type: bytes[0] ?? 0, bytes, body: bytes.subarray(5) };
}

describe("ServerFlight: when a connection may go back", () => {
  it("gives back only at a ReadyForQuery that says idle with nothing owed", () => {
    const flight = new ServerFlight();
    flight.fromClient(frontend.query, 20); // BEGIN
    expect(flight.releasable).toBe(false);
    flight.fromServer(serverMessage(backend.readyForQuery, encoder.encode("T")));
    expect(flight.idle).toBe(true);
    expect(flight.releasable).toBe(false);
    flight.fromClient(frontend.parse, 20);
    flight.fromClient(frontend.bind, 20);
    flight.fromClient(frontend.execute, 20);
    expect(flight.idle).toBe(false);
    flight.fromClient(frontend.sync, 5);
    flight.fromClient(frontend.query, 20); // COMMIT, pipelined
    flight.fromServer(serverMessage(backend.readyForQuery, encoder.encode("T")));
    expect(flight.releasable).toBe(false);
    flight.fromServer(serverMessage(backend.readyForQuery, encoder.encode("I")));
    expect(flight.releasable).toBe(true);
  });

  it("holds an extended-protocol batch that has no Sync yet (a cursor read with Flush)", () => {
    const flight = new ServerFlight();
    flight.fromClient(frontend.parse, 10);
    flight.fromClient(frontend.flush, 5);
    expect(flight.idle).toBe(false);
    flight.fromClient(frontend.sync, 5);
    flight.fromServer(serverMessage(backend.readyForQuery, encoder.encode("I")));
    expect(flight.releasable).toBe(true);
  });

  it("counts COPY data both ways, and the answer bytes of a cycle", () => {
    const flight = new ServerFlight();
    flight.fromClient(frontend.query, 30);
    flight.fromServer(serverMessage(backend.copyInResponse, new Uint8Array(3)));
    flight.fromClient(frontend.copyData, 100);
    flight.fromClient(frontend.copyData, 50);
    expect(flight.copyInBytes).toBe(150);
    expect(flight.idle).toBe(false);
    flight.fromClient(frontend.copyDone, 5);
    flight.fromServer(serverMessage(backend.dataRow, new Uint8Array(95)));
    expect(flight.answerBytes).toBe(100);
    flight.fromServer(serverMessage(backend.readyForQuery, encoder.encode("I")));
    expect(flight.answerBytes).toBe(0);
    expect(flight.releasable).toBe(true);
  });

  it("matches a model: releasable exactly when every cycle was answered, no batch is open, and the last status was idle", () => {
    type Step = { kind: "client"; type: number } | { kind: "rfq"; status: "I" | "T" | "E" };
    const step = fc.oneof(
      fc
        .constantFrom(frontend.query, frontend.sync, frontend.parse, frontend.bind, frontend.execute)
        .map((type): Step => ({ kind: "client", type })),
      fc
        .constantFrom("I", "T", "E")
        .map((status): Step => ({ kind: "rfq", status: status as "I" | "T" | "E" })),
    );
    fc.assert(
      fc.property(fc.array(step, { maxLength: 40 }), (steps) => {
        const flight = new ServerFlight();
        let owed = 0;
        let open = false;
        let status = "I";
        for (const s of steps) {
          if (s.kind === "client") {
            flight.fromClient(s.type, 10);
            if (s.type === frontend.query || s.type === frontend.sync) owed++;
            if (s.type === frontend.sync) open = false;
            else if (s.type !== frontend.query) open = true;
          } else if (owed > 0) {
            flight.fromServer(serverMessage(backend.readyForQuery, encoder.encode(s.status)));
            owed--;
            status = s.status;
          }
          expect(flight.releasable).toBe(owed === 0 && !open && status === "I");
        }
      }),
    );
  });
});

// ── Named prepared statements across connections ───────────────────────────────────────────────

/**
 * A Postgres session, as far as named statements go: Parse defines (42P05 if the name is taken),
 * Bind and Describe need one (26000), Close forgets, an error skips the rest of the cycle.
 */
class ModelSession {
  private readonly statements = new Set<string>();
  private skipping = false;

  /** The answers to the messages, as `1` `2` `t` `3` `Z` or `E:<sqlstate>`. */
  receive(message: Message): string[] {
    if (message.type === frontend.sync) {
      this.skipping = false;
      return ["Z"];
    }
    if (this.skipping) return [];
    switch (message.type) {
      case frontend.parse: {
        const name = parseStatementName(message.body) ?? "";
        if (name !== "" && this.statements.has(name)) return this.fail("42P05");
        if (new TextDecoder().decode(message.body).includes("BROKEN")) return this.fail("42601");
        if (name !== "") this.statements.add(name);
        return ["1"];
      }
      case frontend.bind: {
        const name = bindStatementName(message.body) ?? "";
        if (name !== "" && !this.statements.has(name)) return this.fail("26000");
        return ["2"];
      }
      case frontend.describe: {
        const target = describedTarget(message.body);
        if (target?.kind === "S" && target.name !== "" && !this.statements.has(target.name))
          return this.fail("26000");
        return ["t"];
      }
      case frontend.close: {
        const target = describedTarget(message.body);
        if (target?.kind === "S") this.statements.delete(target.name);
        return ["3"];
      }
      default:
        return [];
    }
  }

  private fail(code: string): string[] {
    this.skipping = true;
    return [`E:${code}`];
  }
}

function answerMessage(answer: string): Message {
  if (answer === "Z") return serverMessage(backend.readyForQuery, encoder.encode("I"));
  if (answer.startsWith("E:")) {
    const bytes = errorResponse({ severity: "ERROR", code: answer.slice(2), message: "x" });
    return { type: backend.errorResponse, bytes, body: bytes.subarray(5) };
  }
  return serverMessage(answer.charCodeAt(0));
}

describe("NamedStatements: a client's prepared statements follow it from connection to connection", () => {
  const names = fc.constantFrom("a", "b", "c", "");
  type Op =
    | { op: "parse"; name: string }
    | { op: "broken"; name: string }
    | { op: "bind"; name: string }
    | { op: "describe"; name: string }
    | { op: "close"; name: string }
    | { op: "sync" }
    | { op: "switch" };
  const op: fc.Arbitrary<Op> = fc.oneof(
    names.map((name): Op => ({ op: "parse", name })),
    names.map((name): Op => ({ op: "broken", name })),
    names.map((name): Op => ({ op: "bind", name })),
    names.map((name): Op => ({ op: "describe", name })),
    names.map((name): Op => ({ op: "close", name })),
    fc.constant<Op>({ op: "sync" }),
    fc.constant<Op>({ op: "switch" }),
  );

  function bytesOf(o: Exclude<Op, { op: "sync" } | { op: "switch" }>): Uint8Array {
    switch (o.op) {
      case "parse":
        return parse(o.name, `SELECT '${o.name}'`);
      case "broken":
        return parse(o.name, "BROKEN SQL");
      case "bind":
        return bind(o.name);
      case "describe":
        return describe_("S", o.name);
      case "close":
        return close("S", o.name);
    }
  }

  it("answers as one Postgres session would, though each transaction runs on a fresh connection", () => {
    fc.assert(
      fc.property(fc.array(op, { maxLength: 60 }), (ops) => {
        // What the client would see on one session that lasts.
        const single = new ModelSession();
        // What it sees through Lessor: a fresh session at every switch between transactions.
        let server = new ModelSession();
        const statements = new NamedStatements();
        statements.attached();
        const direct: string[] = [];
        const relayed: string[] = [];
        let synced = true;
        for (const o of ops) {
          if (o.op === "switch") {
            // Only between transactions (after a Sync), as transaction mode gives connections back.
            if (!synced) continue;
            server = new ModelSession();
            statements.attached();
            continue;
          }
          const bytes = o.op === "sync" ? sync : bytesOf(o);
          synced = o.op === "sync";
          const message = clientMessage(bytes);
          direct.push(...single.receive(message));
          const sent = statements.fromClient(message);
          if (!Array.isArray(sent)) throw new Error("refused");
          for (const out of sent) {
            for (const answer of server.receive(clientMessage(out))) {
              if (statements.fromServer(answerMessage(answer))) relayed.push(answer);
            }
          }
        }
        expect(relayed).toEqual(direct);
      }),
      { numRuns: 500 },
    );
  });

  it("a re-preparation the server skipped (an error earlier in its cycle) is sent again", () => {
    // fast-check found it (seed -519728553): Parse a, Sync, another connection, Describe b (an
    // unknown statement: 26000), Describe a (re-prepared, but skipped with the rest of the cycle),
    // Sync, Bind a: a must be prepared again, not taken for prepared.
    const statements = new NamedStatements();
    statements.attached();
    statements.fromClient(clientMessage(parse("a", "SELECT 1")));
    statements.fromServer(serverMessage(backend.parseComplete));
    statements.fromClient(clientMessage(sync));
    statements.fromServer(answerMessage("Z"));
    statements.attached();
    statements.fromClient(clientMessage(describe_("S", "b")));
    statements.fromServer(answerMessage("E:26000"));
    expect(statements.fromClient(clientMessage(describe_("S", "a")))).toHaveLength(2);
    statements.fromClient(clientMessage(sync));
    statements.fromServer(answerMessage("Z"));
    expect(statements.fromClient(clientMessage(bind("a")))).toHaveLength(2);
  });

  it("refuses a statement past its limits rather than forgetting one", () => {
    const statements = new NamedStatements();
    statements.attached();
    const parseComplete = serverMessage(backend.parseComplete);
    for (let i = 0; i < namedStatementLimits.count; i++) {
      expect(Array.isArray(statements.fromClient(clientMessage(parse(`s${i}`, "SELECT 1"))))).toBe(true);
      statements.fromServer(parseComplete);
    }
    expect(statements.fromClient(clientMessage(parse("one-more", "SELECT 1")))).toEqual({
      refuse: "too_many_statements",
    });
    // A known one closed makes room for another.
    statements.fromClient(clientMessage(close("S", "s1")));
    expect(Array.isArray(statements.fromClient(clientMessage(parse("one-more", "SELECT 1"))))).toBe(true);
    statements.fromServer(parseComplete);
    expect(statements.size).toBe(namedStatementLimits.count);
  });

  it("re-prepares before a Describe too, and passes a Flush through untouched", () => {
    const statements = new NamedStatements();
    statements.attached();
    statements.fromClient(clientMessage(parse("q", "SELECT 1")));
    statements.fromServer(serverMessage(backend.parseComplete));
    statements.attached();
    const out = statements.fromClient(clientMessage(describe_("S", "q")));
    expect(Array.isArray(out) && out.length).toBe(2);
    expect(statements.fromClient(clientMessage(flush))).toEqual([flush]);
  });
});

describe("refuseCycles: messages that got no connection", () => {
  const error = errorResponse({ severity: "ERROR", code: "53300", message: "full" });
  const kinds = (answer: Uint8Array[]) => answer.map((bytes) => String.fromCharCode(bytes[0] ?? 0)).join("");

  it("answers each cycle with one error and one ReadyForQuery, as Postgres answers a failed statement", () => {
    const messages = [
      clientMessage(parse("", "SELECT 1")),
      clientMessage(bind("")),
      clientMessage(sync),
      clientMessage(textMessage(frontend.query, "SELECT 2")),
    ];
    const { answer, skipping, terminate } = refuseCycles(messages, error, false);
    expect(kinds(answer)).toBe("EZEZ");
    expect(skipping).toBe(false);
    expect(terminate).toBe(false);
    expect([...(answer[1] ?? [])]).toEqual([...readyForQuery("I")]);
  });

  it("keeps skipping an open cycle until its Sync, and stops at Terminate", () => {
    const first = refuseCycles([clientMessage(parse("", "SELECT 1"))], error, false);
    expect(kinds(first.answer)).toBe("E");
    expect(first.skipping).toBe(true);
    const second = refuseCycles([clientMessage(bind("")), clientMessage(sync)], error, true);
    expect(kinds(second.answer)).toBe("Z");
    const third = refuseCycles(
      [clientMessage(frontendMessage(frontend.terminate, new Uint8Array(0)))],
      error,
      false,
    );
    expect(third.terminate).toBe(true);
  });
});
