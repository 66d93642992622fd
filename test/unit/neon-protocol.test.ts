import { describe, expect, it } from "vitest";
import {
  beginStatement,
  maxStatementsPerTransaction,
  parseSqlRequest,
  postgresErrorBody,
  type SqlRequest,
  type TransactionOptions,
} from "../../src/core/neon-protocol.ts";

function headers(values: Record<string, string> = {}): Headers {
  return new Headers(values);
}

function parsed(body: unknown, values: Record<string, string> = {}): SqlRequest {
  const result = parseSqlRequest(body, headers(values));
  if ("problem" in result) throw new Error(`unexpected problem: ${result.problem}`);
  return result;
}

function problem(body: unknown, values: Record<string, string> = {}): string {
  const result = parseSqlRequest(body, headers(values));
  if (!("problem" in result)) throw new Error(`expected a problem, got ${JSON.stringify(result)}`);
  return result.problem;
}

describe("parseSqlRequest: single statements", () => {
  it("reads a query with parameters", () => {
    expect(parsed({ query: "SELECT $1, $2", params: ["a", null] })).toEqual({
      kind: "single",
      statement: { query: "SELECT $1, $2", params: ["a", null] },
      output: { rawText: false, arrayMode: false },
    });
  });

  it("treats absent or null params as none", () => {
    expect(parsed({ query: "SELECT 1" })).toMatchObject({
      kind: "single",
      statement: { query: "SELECT 1", params: [] },
    });
    expect(parsed({ query: "SELECT 1", params: null })).toMatchObject({
      kind: "single",
      statement: { query: "SELECT 1", params: [] },
    });
  });

  it("serialises numbers, booleans and objects to Postgres text", () => {
    const request = parsed({ query: "SELECT $1, $2, $3, $4", params: [42, true, { a: 1 }, 1.5] });
    expect(request).toMatchObject({
      kind: "single",
      statement: { query: "SELECT $1, $2, $3, $4", params: ["42", "true", '{"a":1}', "1.5"] },
    });
  });

  it("turns JSON array parameters into Postgres array literals, as Neon does", () => {
    const request = parsed({
      query: "SELECT $1, $2",
      params: [
        [true, null, "NULL", 'a"b', "c\\d"],
        [[1, 2], [{ k: 1 }]],
      ],
    });
    expect(request).toMatchObject({
      statement: { params: ['{true,NULL,"NULL","a\\"b","c\\\\d"}', '{{1,2},{"{\\"k\\":1}"}}'] },
    });
  });

  it.each([
    ["a string", "SELECT 1"],
    ["null", null],
    ["an array", [{ query: "SELECT 1" }]],
    ["a number", 1],
  ])("refuses a body that is %s", (_name, body) => {
    expect(problem(body)).toMatch(/JSON object/);
  });

  it.each([
    ["no query", {}],
    ["an empty query", { query: "" }],
    ["a blank query", { query: "   \n" }],
    ["a numeric query", { query: 1 }],
  ])("refuses %s", (_name, body) => {
    expect(problem(body)).toMatch(/query/);
  });

  it("refuses params that are not an array", () => {
    expect(problem({ query: "SELECT $1", params: "a" })).toMatch(/params/);
    expect(problem({ query: "SELECT $1", params: { 0: "a" } })).toMatch(/params/);
  });

  it("refuses parameters that have no Postgres text form", () => {
    expect(problem({ query: "SELECT $1", params: [undefined] })).toMatch(/parameter/);
  });

  it("refuses more parameters than the protocol can bind", () => {
    expect(problem({ query: "SELECT 1", params: new Array(65_536).fill("x") })).toMatch(/parameters/);
  });

  it("ignores batch headers on a single statement", () => {
    expect(parsed({ query: "SELECT 1" }, { "Neon-Batch-Isolation-Level": "nonsense" }).kind).toBe("single");
  });
});

describe("parseSqlRequest: output mode", () => {
  it("answers as the driver asks only when a header says exactly true, as Neon does", () => {
    expect(
      parsed({ query: "SELECT 1" }, { "Neon-Raw-Text-Output": "true", "Neon-Array-Mode": "true" }).output,
    ).toEqual({
      rawText: true,
      arrayMode: true,
    });
    expect(
      parsed({ query: "SELECT 1" }, { "Neon-Raw-Text-Output": "True", "Neon-Array-Mode": "1" }).output,
    ).toEqual({
      rawText: false,
      arrayMode: false,
    });
  });
});

describe("parseSqlRequest: transactions", () => {
  const queries = [{ query: "SELECT 1" }, { query: "SELECT $1", params: ["x"] }];

  it("reads the statements with no options", () => {
    expect(parsed({ queries })).toMatchObject({
      kind: "transaction",
      statements: [
        { query: "SELECT 1", params: [] },
        { query: "SELECT $1", params: ["x"] },
      ],
      options: { isolationLevel: null, readOnly: null, deferrable: null },
    });
  });

  it.each([
    ["Serializable", "Serializable"],
    ["serializable", "Serializable"],
    ["SERIALIZABLE", "Serializable"],
    ["ReadUncommitted", "ReadUncommitted"],
    ["ReadCommitted", "ReadCommitted"],
    ["read committed", "ReadCommitted"],
    ["READ_COMMITTED", "ReadCommitted"],
    ["repeatable-read", "RepeatableRead"],
    ["RepeatableRead", "RepeatableRead"],
    ["Repeatable Read", "RepeatableRead"],
  ])("reads the isolation level spelled %j", (spelling, level) => {
    const request = parsed({ queries }, { "Neon-Batch-Isolation-Level": spelling });
    expect(request.kind === "transaction" ? request.options.isolationLevel : undefined).toBe(level);
  });

  it.each(["snapshot", "serial", "read", "1"])("refuses the isolation level %j", (spelling) => {
    expect(problem({ queries }, { "Neon-Batch-Isolation-Level": spelling })).toMatch(/Isolation-Level/);
  });

  it("reads the read-only and deferrable flags", () => {
    const request = parsed({ queries }, { "Neon-Batch-Read-Only": "true", "Neon-Batch-Deferrable": "false" });
    expect(request.kind === "transaction" ? request.options : undefined).toEqual({
      isolationLevel: null,
      readOnly: true,
      deferrable: false,
    });
  });

  it.each([
    ["Neon-Batch-Read-Only", "yes"],
    ["Neon-Batch-Read-Only", "1"],
    ["Neon-Batch-Deferrable", "maybe"],
  ])("refuses %s: %j", (header, value) => {
    expect(problem({ queries }, { [header]: value })).toMatch(/true or false/);
  });

  it("takes an empty batch (an empty transaction, as on Neon) and refuses a non-array one", () => {
    expect(parsed({ queries: [] })).toMatchObject({ kind: "transaction", statements: [] });
    expect(problem({ queries: "SELECT 1" })).toMatch(/must be an array/);
    expect(problem({ queries: null })).toMatch(/must be an array/);
  });

  it("names the statement that is invalid", () => {
    expect(problem({ queries: [{ query: "SELECT 1" }, { query: "" }] })).toMatch(/^queries\[1\]/);
    expect(problem({ queries: [{ query: "SELECT 1" }, "SELECT 2"] })).toMatch(/^queries\[1\]/);
  });

  it("bounds the number of statements in a batch", () => {
    const many = new Array(maxStatementsPerTransaction).fill({ query: "SELECT 1" });
    expect(parsed({ queries: many }).kind).toBe("transaction");
    expect(problem({ queries: [...many, { query: "SELECT 1" }] })).toMatch(/at most/);
  });
});

describe("beginStatement", () => {
  const none: TransactionOptions = { isolationLevel: null, readOnly: null, deferrable: null };

  it.each([
    [none, "BEGIN"],
    [{ ...none, isolationLevel: "Serializable" }, "BEGIN ISOLATION LEVEL SERIALIZABLE"],
    [{ ...none, isolationLevel: "RepeatableRead" }, "BEGIN ISOLATION LEVEL REPEATABLE READ"],
    [{ ...none, isolationLevel: "ReadCommitted" }, "BEGIN ISOLATION LEVEL READ COMMITTED"],
    [{ ...none, isolationLevel: "ReadUncommitted" }, "BEGIN ISOLATION LEVEL READ UNCOMMITTED"],
    [{ ...none, readOnly: true }, "BEGIN READ ONLY"],
    [{ ...none, readOnly: false }, "BEGIN READ WRITE"],
    [{ ...none, deferrable: true }, "BEGIN DEFERRABLE"],
    [{ ...none, deferrable: false }, "BEGIN NOT DEFERRABLE"],
    [
      { isolationLevel: "Serializable", readOnly: true, deferrable: true },
      "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE",
    ],
  ] satisfies [TransactionOptions, string][])("%j → %s", (options, expected) => {
    expect(beginStatement(options)).toBe(expected);
  });
});

describe("postgresErrorBody", () => {
  it("copies the Postgres fields of a database error", () => {
    const error = Object.assign(new Error('duplicate key value violates unique constraint "notes_pkey"'), {
      severity: "ERROR",
      code: "23505",
      detail: "Key (id)=(1) already exists.",
      schema: "public",
      table: "notes",
      constraint: "notes_pkey",
      position: 12,
      stack: "Error: at secret (file.ts:1:1)",
    });
    expect(postgresErrorBody(error)).toEqual({
      message: 'duplicate key value violates unique constraint "notes_pkey"',
      severity: "ERROR",
      code: "23505",
      detail: "Key (id)=(1) already exists.",
      schema: "public",
      table: "notes",
      constraint: "notes_pkey",
      position: "12",
    });
  });

  it.each(["42601", "P0001", "XX000", "HV000", "22012"])("accepts the SQLSTATE %s", (code) => {
    expect(postgresErrorBody({ code, message: "m", severity: "ERROR" })).toMatchObject({
      code,
      message: "m",
    });
  });

  it.each([
    ["a Lessor code", "invalid_credentials"],
    ["a Node errno", "ECONNREFUSED"],
    ["four characters", "2350"],
    ["six characters", "235050"],
    ["lowercase", "abcde"],
    ["a number", 23505],
    ["no code", undefined],
  ])("refuses an error with %s", (_name, code) => {
    expect(postgresErrorBody({ code, message: "m" })).toBeNull();
  });

  // A socket error such as `write EPIPE` has a five-letter code too; Postgres errors always carry
  // a severity. Passing it on would answer a lost connection as a non-retryable Postgres error.
  it.each(["EPIPE", "EBUSY", "EPERM"])(
    "refuses the system errno %s, which has no Postgres severity",
    (code) => {
      expect(postgresErrorBody(Object.assign(new Error(`write ${code}`), { code }))).toBeNull();
    },
  );

  it("refuses things that are not errors", () => {
    expect(postgresErrorBody(null)).toBeNull();
    expect(postgresErrorBody("23505")).toBeNull();
    expect(postgresErrorBody(undefined)).toBeNull();
  });
});
