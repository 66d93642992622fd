/**
 * The per-request reset pipelined in a statement's flight (src/tenant-object/execute.ts): what is
 * written, in what order; that the driver sees the statement's answer and nothing of the reset's;
 * and how each of the two ReadyForQuery messages settles what. A recording connection with a real
 * event emitter as its socket stands in for the driver's (the real path runs in every integration
 * test: every single-statement `/sql` request takes it, and test/integration/isolation.test.ts
 * proves no state passes between requests).
 */
import { EventEmitter } from "node:events";
import { neonConfig } from "@neondatabase/serverless";
import { describe, expect, it } from "vitest";
import {
  concatBytes,
  errorResponse,
  parameterStatus,
  readyForQuery,
  textMessage,
} from "../../src/core/pg-wire.ts";
import { serverParameters } from "../../src/postgres/index.ts";
import { ResponseBudget, runStatement } from "../../src/tenant-object/execute.ts";
import {
  isIdleOutsideTransaction,
  noteTransactionStatus,
  sessionResetSql,
} from "../../src/tenant-object/pool/connection-state.ts";
import { commandComplete, messagesIn, resetOpeningInTransaction } from "./wire-bytes.ts";

interface Driven {
  submit(connection: unknown): void;
  handleRowDescription(message: unknown): void;
  handleDataRow(message: unknown): void;
  handleCommandComplete(message: unknown): void;
  handleReadyForQuery(connection: unknown): void;
  handleError(error: unknown, connection: unknown): void;
}

/** The type letters of the messages in `bytes` (`PBDES` = Parse … Sync). */
function typesIn(bytes: Uint8Array): string {
  return messagesIn(bytes)
    .map((message) => String.fromCharCode(message.type))
    .join("");
}

/**
 * The fields of the Neon driver's socket that decide how a flight leaves (its TLS state, the bytes
 * its coalescing still holds, its WebSocket); without them the socket is another driver's.
 */
interface DriverFields {
  tlsState: number;
  writeBuffer: Uint8Array | undefined;
  sentToWebSocket: Uint8Array[];
}

/** A driver client reduced to what runStatement uses; its socket is an event emitter of Buffers. */
function recordingClient(driver?: Omit<DriverFields, "sentToWebSocket">) {
  const written: string[] = [];
  const socketWrites: Uint8Array[] = [];
  const sentToWebSocket: Uint8Array[] = [];
  const stream = Object.assign(
    new EventEmitter(),
    {
      write(bytes: Uint8Array) {
        written.push(typesIn(bytes));
        socketWrites.push(bytes);
        return true;
      },
    },
    driver
      ? {
          tlsState: driver.tlsState,
          writeBuffer: driver.writeBuffer,
          ws: { send: (bytes: Uint8Array) => sentToWebSocket.push(bytes) },
        }
      : {},
  );
  /** What the driver's parser was given. */
  const driverSaw: Uint8Array[] = [];
  const driverListener = (chunk: Uint8Array) => driverSaw.push(chunk);
  stream.on("data", driverListener);
  const connection = { stream, sendCopyFail: () => written.push("CopyFail") };
  let active: Driven | null = null;
  const client = {
    query(submittable: Driven) {
      active = submittable;
      submittable.submit(connection);
    },
  };
  const driven = () => {
    if (!active) throw new Error("nothing submitted");
    return active;
  };
  /** The server sends `bytes` (as the driver's socket emits them: a Buffer). */
  const serverSends = (bytes: Uint8Array) => stream.emit("data", Buffer.from(bytes));
  return {
    client,
    stream,
    written,
    socketWrites,
    sentToWebSocket,
    driverSaw,
    driverListener,
    driven,
    serverSends,
  };
}

const field = {
  name: "one",
  tableID: 0,
  columnID: 0,
  dataTypeID: 23,
  dataTypeSize: 4,
  dataTypeModifier: -1,
  format: 0,
};

function settledState<T>(promise: Promise<T>): Promise<"pending" | "resolved" | "rejected"> {
  return Promise.race([
    promise.then(
      () => "resolved" as const,
      () => "rejected" as const,
    ),
    new Promise<"pending">((resolve) => setTimeout(() => resolve("pending"), 10)),
  ]);
}

function start(query: string, client: ReturnType<typeof recordingClient>["client"]) {
  let reset: Promise<Error | undefined> | null = null;
  const result = runStatement(
    client as never,
    { query, params: [] },
    new ResponseBudget(1_000_000),
    () => undefined,
    null,
    (done) => {
      reset = done;
    },
  );
  result.catch(() => undefined);
  return { result, reset: () => reset ?? Promise.reject(new Error("no reset handed over")) };
}

/** What the driver's parser got, as plain bytes; each piece must be a Buffer (a view, of the driver's class). */
function seen(chunks: Uint8Array[]): Uint8Array {
  expect(chunks.every((chunk) => Buffer.isBuffer(chunk))).toBe(true);
  return Uint8Array.from(concatBytes(chunks));
}

const statementAnswer = concatBytes([commandComplete("SELECT 1"), readyForQuery("T")]);
/** The reset's answer after a statement that left a transaction open: its `BEGIN` warns. */
const resetAnswer = concatBytes([
  ...resetOpeningInTransaction,
  parameterStatus("application_name", "lessor:t:1"),
  commandComplete("DISCARD SEQUENCES"),
  readyForQuery("I"),
]);

describe("the reset pipelined in the statement's flight", () => {
  it("is written right after the statement's Sync, in the same write, as one Query message", () => {
    const { client, written, socketWrites } = recordingClient();
    start("SELECT 1 AS one", client);
    expect(written).toEqual(["PBDESQ"]);
    const last = messagesIn(socketWrites[0] ?? new Uint8Array(0)).at(-1);
    expect(last?.bytes).toEqual(textMessage(0x51, sessionResetSql));
  });

  it("answers at the statement's ReadyForQuery; the reset's answer never reaches the driver", async () => {
    const { client, stream, driverSaw, driverListener, driven, serverSends } = recordingClient();
    const { result, reset } = start("SELECT 1 AS one", client);
    noteTransactionStatus(client as never, "T");
    // The statement's answer and half of the reset's in one chunk, the rest in another.
    const whole = concatBytes([statementAnswer, resetAnswer]);
    const cut = statementAnswer.byteLength + 9;
    serverSends(whole.subarray(0, cut));
    expect(seen(driverSaw)).toEqual(statementAnswer);
    // The driver, given those bytes, drives the statement as it would.
    const statement = driven();
    statement.handleRowDescription({ fields: [field] });
    statement.handleDataRow({ fields: ["1"] });
    statement.handleCommandComplete({ text: "SELECT 1" });
    statement.handleReadyForQuery(null);
    expect(await result).toMatchObject({ command: "SELECT", rowCount: 1, rows: ['["1"]'] });
    expect(await settledState(reset())).toBe("pending");
    expect(stream.listeners("data")).not.toContain(driverListener);
    serverSends(whole.subarray(cut));
    expect(await reset()).toBeUndefined();
    // Nothing of the reset reached the driver; its listener is back; what the reset said is noted.
    expect(seen(driverSaw)).toEqual(statementAnswer);
    expect(stream.listeners("data")).toEqual([driverListener]);
    expect(isIdleOutsideTransaction(client as never)).toBe(true);
  });

  it("gives the driver what the server sends after the reset's answer", async () => {
    const { client, driverSaw, serverSends, driven, stream, driverListener } = recordingClient();
    const { reset } = start("SELECT 1 AS one", client);
    const after = parameterStatus("is_superuser", "off");
    serverSends(concatBytes([statementAnswer, resetAnswer, after]));
    driven().handleReadyForQuery(null);
    expect(await reset()).toBeUndefined();
    expect(seen(driverSaw)).toEqual(concatBytes([statementAnswer, after]));
    expect(stream.listeners("data")).toEqual([driverListener]);
    // A tenant connection records reported parameters; this stand-in is not one, so none are kept.
    expect(serverParameters(client).size).toBe(0);
  });

  it("still resets after the statement's own error, and reports a failed reset", async () => {
    const { client, driven, serverSends } = recordingClient();
    const { result, reset } = start("SELECT nope", client);
    const failure = Object.assign(new Error('column "nope" does not exist'), {
      severity: "ERROR",
      code: "42703",
    });
    serverSends(
      concatBytes([errorResponse({ severity: "ERROR", code: "42703", message: "nope" }), readyForQuery("I")]),
    );
    driven().handleError(failure, null);
    await expect(result).rejects.toBe(failure);
    driven().handleReadyForQuery(null);
    expect(await settledState(reset())).toBe("pending");
    serverSends(
      concatBytes([
        errorResponse({ severity: "ERROR", code: "XX000", message: "reset broke" }),
        readyForQuery("I"),
      ]),
    );
    const failed = await reset();
    expect(failed).toBeInstanceOf(Error);
    expect(failed?.message).toBe("the reset failed: XX000 reset broke");
  });

  it("settles both when the connection dies mid-flight, and gives the driver its listener back", async () => {
    const { client, driven, stream, driverListener, serverSends } = recordingClient();
    const { result, reset } = start("SELECT pg_sleep(10)", client);
    serverSends(statementAnswer.subarray(0, 3));
    const dead = new Error("Connection terminated unexpectedly");
    stream.emit("close");
    driven().handleError(dead, null);
    await expect(result).rejects.toBe(dead);
    expect((await reset())?.message).toBe("the reset did not finish");
    expect(stream.listeners("data")).toEqual([driverListener]);
  });

  it("is not pipelined for a statement that may be a COPY (its protocol state would take the reset for data)", () => {
    const { client, written, stream, driverListener } = recordingClient();
    let handed = false;
    void runStatement(
      client as never,
      { query: "COPY notes FROM STDIN", params: [] },
      new ResponseBudget(1_000_000),
      () => undefined,
      null,
      () => {
        handed = true;
      },
    ).catch(() => undefined);
    expect(written).toEqual(["PBDES"]);
    expect(handed).toBe(false);
    expect(stream.listeners("data")).toContain(driverListener);
  });
});

describe("a flight built whole leaves at once, not from the driver's coalescing timer", () => {
  it("relies only on fields the installed driver's socket has (`neonConfig` is its Socket class)", () => {
    const socket = new (neonConfig as unknown as new () => Record<string, unknown>)();
    expect(socket.tlsState).toBe(0);
    expect("writeBuffer" in socket && socket.writeBuffer === undefined).toBe(true);
    expect("ws" in socket).toBe(true);
  });

  it("goes to the WebSocket in one send when the driver's socket is plain and holds no bytes", () => {
    const { client, written, sentToWebSocket } = recordingClient({ tlsState: 0, writeBuffer: undefined });
    start("SELECT 1 AS one", client);
    expect(written).toEqual([]);
    expect(sentToWebSocket.map(typesIn)).toEqual(["PBDESQ"]);
    expect(messagesIn(sentToWebSocket[0] ?? new Uint8Array(0)).at(-1)?.bytes).toEqual(
      textMessage(0x51, sessionResetSql),
    );
  });

  it("waits behind bytes the driver still holds, which it would otherwise overtake", () => {
    const held = textMessage(0x51, "SELECT 'earlier'");
    const { client, written, sentToWebSocket } = recordingClient({ tlsState: 0, writeBuffer: held });
    start("SELECT 1 AS one", client);
    expect(sentToWebSocket).toEqual([]);
    expect(written).toEqual(["PBDESQ"]);
  });

  it("takes the driver's path through a socket with TLS inside it", () => {
    const { client, written, sentToWebSocket } = recordingClient({ tlsState: 1, writeBuffer: undefined });
    start("SELECT 1 AS one", client);
    expect(sentToWebSocket).toEqual([]);
    expect(written).toEqual(["PBDESQ"]);
  });
});
