/**
 * The per-request reset pipelined in a statement's flight (src/tenant-object/execute.ts): what is
 * written, in what order, and how each of the two ReadyForQuery messages settles what. A recording
 * connection stands in for the driver's (the real path runs in every integration test: every
 * single-statement `/sql` request takes it, and test/integration/isolation.test.ts proves no
 * state passes between requests).
 */
import { describe, expect, it } from "vitest";
import { sessionResetSql } from "../../src/tenant-object/connection-state.ts";
import { ResponseBudget, runStatement } from "../../src/tenant-object/execute.ts";

interface Phased {
  phasesLeft: number;
  submit(connection: unknown): void;
  handleRowDescription(message: unknown): void;
  handleDataRow(message: unknown): void;
  handleCommandComplete(message: unknown): void;
  handleReadyForQuery(connection: unknown): void;
  handleError(error: unknown, connection: unknown): void;
}

/** A driver client reduced to what runStatement uses: it takes the submittable and lets the test drive it. */
function recordingClient() {
  const written: string[] = [];
  const connection = {
    query: (text: string) => written.push(`Query ${text}`),
    parse: (c: { text: string }) => written.push(`Parse ${c.text}`),
    bind: () => written.push("Bind"),
    describe: () => written.push("Describe"),
    execute: () => written.push("Execute"),
    sync: () => written.push("Sync"),
    sendCopyFail: () => written.push("CopyFail"),
  };
  let active: Phased | null = null;
  const client = {
    query(submittable: Phased) {
      active = submittable;
      submittable.submit(connection);
    },
  };
  const driven = () => {
    if (!active) throw new Error("nothing submitted");
    return active;
  };
  return { client, written, driven };
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

describe("the reset pipelined in the statement's flight", () => {
  it("is written right after the statement's Sync, in the same flight", async () => {
    const { client, written } = recordingClient();
    let reset: Promise<Error | undefined> | null = null;
    void runStatement(
      client as never,
      { query: "SELECT 1 AS one", params: [] },
      new ResponseBudget(1_000_000),
      () => undefined,
      null,
      (done) => {
        reset = done;
      },
    ).catch(() => undefined);
    expect(written).toEqual([
      "Parse SELECT 1 AS one",
      "Bind",
      "Describe",
      "Execute",
      "Sync",
      `Query ${sessionResetSql}`,
    ]);
    expect(reset).not.toBeNull();
  });

  it("answers at the statement's ReadyForQuery, and is clean only at the reset's", async () => {
    const { client, driven } = recordingClient();
    let reset: Promise<Error | undefined> = new Promise(() => undefined);
    const result = runStatement(
      client as never,
      { query: "SELECT 1 AS one", params: [] },
      new ResponseBudget(1_000_000),
      () => undefined,
      null,
      (done) => {
        reset = done;
      },
    );
    const statement = driven();
    expect(statement.phasesLeft).toBe(2);
    statement.handleRowDescription({ fields: [field] });
    statement.handleDataRow({ fields: ["1"] });
    statement.handleCommandComplete({ text: "SELECT 1" });
    // The client keeps a phased query active past its first ReadyForQuery (src/postgres/clients.ts).
    statement.phasesLeft--;
    statement.handleReadyForQuery(null);
    expect(await result).toMatchObject({ command: "SELECT", rowCount: 1, rows: ['["1"]'] });
    expect(await settledState(reset)).toBe("pending");
    // The reset's own messages (its advisory-unlock row among them) are nobody's answer.
    statement.handleRowDescription({ fields: [field] });
    statement.handleDataRow({ fields: ["t"] });
    statement.handleCommandComplete({ text: "DISCARD SEQUENCES" });
    statement.handleReadyForQuery(null);
    expect(await reset).toBeUndefined();
  });

  it("still resets after the statement's own error, and reports a failed reset", async () => {
    const { client, driven } = recordingClient();
    let reset: Promise<Error | undefined> = new Promise(() => undefined);
    const result = runStatement(
      client as never,
      { query: "SELECT nope", params: [] },
      new ResponseBudget(1_000_000),
      () => undefined,
      null,
      (done) => {
        reset = done;
      },
    );
    const statement = driven();
    const failure = Object.assign(new Error('column "nope" does not exist'), {
      severity: "ERROR",
      code: "42703",
    });
    statement.handleError(failure, null);
    await expect(result).rejects.toBe(failure);
    expect(await settledState(reset)).toBe("pending");
    statement.phasesLeft--;
    statement.handleReadyForQuery(null);
    expect(await settledState(reset)).toBe("pending");
    // The reset itself fails: the connection must not be reused.
    const resetFailure = Object.assign(new Error("reset failed"), { severity: "ERROR", code: "XX000" });
    statement.handleError(resetFailure, null);
    expect(await reset).toBe(resetFailure);
  });

  it("settles both at once when the connection dies mid-flight", async () => {
    const { client, driven } = recordingClient();
    let reset: Promise<Error | undefined> = new Promise(() => undefined);
    const result = runStatement(
      client as never,
      { query: "SELECT pg_sleep(10)", params: [] },
      new ResponseBudget(1_000_000),
      () => undefined,
      null,
      (done) => {
        reset = done;
      },
    );
    const dead = new Error("Connection terminated unexpectedly");
    driven().handleError(dead, null);
    await expect(result).rejects.toBe(dead);
    expect(await reset).toBe(dead);
  });

  it("is not pipelined for a statement that may be a COPY (its protocol state would take the reset for data)", () => {
    const { client, written } = recordingClient();
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
    expect(written.at(-1)).toBe("Sync");
    expect(handed).toBe(false);
    expect((written as string[]).some((w) => w.startsWith("Query"))).toBe(false);
  });
});
