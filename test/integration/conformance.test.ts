/**
 * Neon HTTP protocol conformance (issue 20, items 1–5): what the official driver and other HTTP
 * clients see where Lessor once differed from Neon's endpoint. The driver where it can; raw HTTP for
 * the header variants the driver never sends. docs/neon-conformance.md points here.
 */
import { neon } from "@neondatabase/serverless";
import { beforeAll, describe, expect, it } from "vitest";
import { type CreatedTenant, createTenant, lessor, runtimeOf, sqlFor, uniqueTenantId } from "./harness.ts";

let tenant: CreatedTenant;

beforeAll(async () => {
  tenant = await createTenant(uniqueTenantId("conform"));
});

async function neonError(promise: Promise<unknown>): Promise<Record<string, unknown>> {
  try {
    await promise;
  } catch (error) {
    return error as Record<string, unknown>;
  }
  throw new Error("expected the query to fail");
}

/** A raw `/sql` request with exactly these headers (the driver always sends both output flags as true). */
async function raw(body: unknown, headers: Record<string, string> = {}) {
  const response = await lessor("/sql", {
    method: "POST",
    headers: { "Neon-Connection-String": tenant.connectionString, ...headers },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

describe("1. a parameter-count mismatch is an ordinary Postgres error", () => {
  it("answers 400 08P01 with Postgres's bind message, and the connection stays in service", async () => {
    const sql = sqlFor(tenant);
    await sql`SELECT 1`;
    const before = await runtimeOf(tenant.id);
    const tooMany = await neonError(sql.query("SELECT $1::int AS n", [1, 2]));
    expect(tooMany).toMatchObject({ name: "NeonDbError", code: "08P01" });
    expect(tooMany.message).toBe('bind message supplies 2 parameters, but prepared statement "" requires 1');
    const unexpected = await neonError(sql.query("SELECT 1", [1]));
    expect(unexpected).toMatchObject({ code: "08P01" });
    expect(unexpected.message).toMatch(/supplies 1 parameters, but prepared statement "" requires 0/);
    // Same generation, next query fine: nothing was treated as a dead connection.
    expect(await sql`SELECT 2 AS n`).toEqual([{ n: 2 }]);
    expect((await runtimeOf(tenant.id)).generation).toBe(before.generation);
  });
});

describe("2. every statement goes through the extended protocol", () => {
  it("a missing parameter is a bind error, not 42P02", async () => {
    const error = await neonError(sqlFor(tenant).query("SELECT $1::int AS n", []));
    expect(error.code).toBe("08P01");
    expect(error.message).toMatch(/supplies 0 parameters, but prepared statement "" requires 1/);
  });

  it("a multi-statement string is refused by Postgres (42601), as on Neon", async () => {
    const error = await neonError(sqlFor(tenant).query("SELECT 1; SELECT 2"));
    expect(error).toMatchObject({
      code: "42601",
      message: "cannot insert multiple commands into a prepared statement",
    });
  });
});

describe("3. an empty batch is an empty transaction", () => {
  it("answers {results: []} to the driver and to raw HTTP", async () => {
    expect(await sqlFor(tenant).transaction([])).toEqual([]);
    expect(await raw({ queries: [] })).toEqual({ status: 200, body: { results: [] } });
  });
});

describe("4. authentication failures look like Postgres's", () => {
  it("a wrong key, an unknown tenant and a user that is not the database are all NeonDbError 28P01", async () => {
    const wrongKey = tenant.connectionString.replace(tenant.key, `${tenant.key.slice(0, -4)}AAAA`);
    const unknown = tenant.connectionString.replaceAll(tenant.id, "no-such-tenant-here");
    // The Neon driver's own HTTP tests expect this one to fail exactly as a wrong password does.
    const mismatch = tenant.connectionString.replace(`/${tenant.id}`, "/other-tenant");
    for (const connectionString of [wrongKey, unknown, mismatch]) {
      const error = await neonError(neon(connectionString, { disableWarningInBrowsers: true })`SELECT 1`);
      expect(error).toMatchObject({
        name: "NeonDbError",
        code: "28P01",
        message: "password authentication failed",
      });
    }
  });
});

describe("5. the output headers are honoured", () => {
  const query =
    "SELECT 1 AS n, 'a' AS s, '{1,2,3}'::int4[] AS arr, 42::int8 AS big, 1.50::numeric AS num, true AS b, " +
    `'{"x":[1,null]}'::jsonb AS j, 2.5::float8 AS f, 'NaN'::float8 AS nan, NULL::text AS z, '{}'::int4[] AS e, ` +
    `'{{t,NULL},{NULL,f}}'::bool[] AS nested, '{"a b",NULL,"NULL"}'::text[] AS texts`;

  it("without them: objects with JSON-typed values, int8 and numeric as strings, arrays parsed", async () => {
    const answer = await raw({ query });
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({ command: "SELECT", rowCount: 1, rowAsArray: false });
    expect((answer.body.rows as unknown[])[0]).toEqual({
      n: 1,
      s: "a",
      arr: [1, 2, 3],
      big: "42",
      num: "1.50",
      b: true,
      j: { x: [1, null] },
      f: 2.5,
      nan: "NaN",
      z: null,
      e: [],
      nested: [
        [true, null],
        [null, false],
      ],
      texts: ["a b", null, "NULL"],
    });
    // Anything but the exact value `true` is false, as on Neon.
    expect(
      await raw({ query: "SELECT 1 AS n" }, { "Neon-Raw-Text-Output": "True", "Neon-Array-Mode": "1" }),
    ).toMatchObject({
      body: { rows: [{ n: 1 }], rowAsArray: false },
    });
  });

  it("array mode with typed values, and raw text as objects", async () => {
    const arrays = await raw(
      { query: "SELECT 1 AS n, 'a' AS s, '{1,2,3}'::int4[] AS arr" },
      { "Neon-Array-Mode": "true" },
    );
    expect(arrays.body).toMatchObject({ rows: [[1, "a", [1, 2, 3]]], rowAsArray: true });
    const rawText = await raw(
      { query: "SELECT 1 AS n, 'a' AS s, '{1,2,3}'::int4[] AS arr, true AS b" },
      { "Neon-Raw-Text-Output": "true" },
    );
    expect(rawText.body).toMatchObject({
      rows: [{ n: "1", s: "a", arr: "{1,2,3}", b: "t" }],
      rowAsArray: false,
    });
    // The fields are the same in every mode.
    expect(
      (arrays.body.fields as { name: string; dataTypeID: number }[]).map((f) => [f.name, f.dataTypeID]),
    ).toEqual([
      ["n", 23],
      ["s", 25],
      ["arr", 1007],
    ]);
  });

  it("a batch answers every result in the mode asked for", async () => {
    const answer = await raw({ queries: [{ query: "SELECT 1 AS n" }, { query: "SELECT true AS b" }] });
    expect(answer.body).toMatchObject({ results: [{ rows: [{ n: 1 }] }, { rows: [{ b: true }] }] });
  });
});

describe("JSON parameters from other HTTP clients", () => {
  it("reach Postgres as array literals, as Neon's endpoint sends them", async () => {
    const answer = await raw({
      query:
        "SELECT $1::int4[] AS ints, $2::text[] AS texts, $3::int4[] AS grid, $4::jsonb AS doc, $5::bool AS yes",
      params: [
        [1, 2, null],
        ["x", 'y "z"', "back\\slash", null, "NULL", "{a,b}"],
        [
          [1, 2],
          [3, 4],
        ],
        { k: [1] },
        true,
      ],
    });
    expect(answer.status).toBe(200);
    expect((answer.body.rows as unknown[])[0]).toEqual({
      ints: [1, 2, null],
      texts: ["x", 'y "z"', "back\\slash", null, "NULL", "{a,b}"],
      grid: [
        [1, 2],
        [3, 4],
      ],
      doc: { k: [1] },
      yes: true,
    });
  });

  it("the driver's own array parameters (already literals) round-trip unchanged", async () => {
    const [row] = await sqlFor(tenant)`SELECT ${[1, 2, 3]}::int4[] AS ints, ${["a", "b c"]}::text[] AS texts`;
    expect(row).toEqual({ ints: [1, 2, 3], texts: ["a", "b c"] });
  });
});
