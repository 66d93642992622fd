/**
 * The official `neon()` client and drizzle's neon-http driver drive Lessor unchanged: queries,
 * parameters and type parsing, arrayMode and fullResults, transaction batches with their options,
 * and Postgres errors surfacing as NeonDbError with their Postgres fields.
 */
import { NeonDbError } from "@neondatabase/serverless";
import { eq, inArray } from "drizzle-orm";
import { drizzle } from "drizzle-orm/neon-http";
import { beforeAll, describe, expect, it } from "vitest";
import { notes } from "../fixtures/tenant-schema/schema.ts";
import { type CreatedTenant, createTenant, sqlFor, uniqueTenantId } from "./harness.ts";

let tenant: CreatedTenant;

beforeAll(async () => {
  tenant = await createTenant(uniqueTenantId("clients"), { tier: "free" });
});

/** The NeonDbError a query rejects with (fails the test if it resolves or rejects with anything else). */
async function neonError(query: Promise<unknown>): Promise<NeonDbError> {
  const error = await query.then(
    () => null,
    (cause: unknown) => cause,
  );
  expect(error).toBeInstanceOf(NeonDbError);
  if (!(error instanceof NeonDbError)) throw new Error("unreachable");
  return error;
}

describe("neon(): queries and parameters", () => {
  it("runs a query and reads its rows as objects", async () => {
    const sql = sqlFor(tenant);
    const rows = await sql`SELECT current_database() AS db, 1 + 1 AS two`;
    expect(rows).toEqual([{ db: tenant.database, two: 2 }]);
  });

  it("binds parameters in tagged templates and in sql.query", async () => {
    const sql = sqlFor(tenant);
    expect(await sql`SELECT ${"it's"}::text AS s, ${7}::int * ${6}::int AS n`).toEqual([
      { s: "it's", n: 42 },
    ]);
    expect(await sql.query("SELECT $1::text || $2::text AS s", ["a", "b"])).toEqual([{ s: "ab" }]);
    // A parameter is a value, never SQL.
    const injection = "x'); DROP TABLE notes; --";
    expect(await sql`SELECT ${injection}::text AS s`).toEqual([{ s: injection }]);
    expect(await sql`SELECT count(*)::int AS n FROM notes WHERE false`).toEqual([{ n: 0 }]);
  });

  it("parses int8 as an exact string and accepts bigint parameters", async () => {
    const sql = sqlFor(tenant);
    const [row] = await sql`SELECT 9007199254740993::int8 AS literal, ${9007199254740993n}::int8 AS param,
      ${"-9223372036854775808"}::int8 AS min`;
    expect(row).toEqual({
      literal: "9007199254740993",
      param: "9007199254740993",
      min: "-9223372036854775808",
    });
  });

  it("parses numeric exactly", async () => {
    const sql = sqlFor(tenant);
    const [row] =
      await sql`SELECT ${"12345678901234567890.123456789"}::numeric AS big, 0.1::numeric + 0.2 AS sum`;
    expect(row).toEqual({ big: "12345678901234567890.123456789", sum: "0.3" });
  });

  it("round-trips json and jsonb", async () => {
    const sql = sqlFor(tenant);
    const value = { a: [1, "two", null, true], nested: { k: 'ü ✓ "quoted"' }, n: 1.5 };
    const [row] = await sql`SELECT ${value}::jsonb AS b, ${JSON.stringify(value)}::json AS j,
      ${value}::jsonb -> 'nested' ->> 'k' AS k, 'null'::jsonb AS jnull`;
    expect(row).toEqual({ b: value, j: value, k: 'ü ✓ "quoted"', jnull: null });
  });

  it("round-trips timestamptz as a Date", async () => {
    const sql = sqlFor(tenant);
    const when = new Date("2024-02-29T23:59:58.123Z");
    const [row] =
      await sql`SELECT ${when}::timestamptz AS t, ${when}::timestamptz + interval '2 seconds' AS later,
      '2001-02-03 04:05:06+02'::timestamptz AS literal`;
    expect(row?.t).toBeInstanceOf(Date);
    expect(row).toEqual({
      t: new Date("2024-02-29T23:59:58.123Z"),
      later: new Date("2024-03-01T00:00:00.123Z"),
      literal: new Date("2001-02-03T02:05:06.000Z"),
    });
  });

  it("round-trips bool", async () => {
    const sql = sqlFor(tenant);
    expect(await sql`SELECT ${true}::bool AS t, ${false}::bool AS f, NOT ${true}::bool AS nt`).toEqual([
      { t: true, f: false, nt: false },
    ]);
  });

  it("round-trips text[] and int[] arrays, with awkward elements and nulls", async () => {
    const sql = sqlFor(tenant);
    const texts = ["plain", "with,comma", 'with"quote', "with\\backslash", "{braces}", "", null, "NULL"];
    const [row] = await sql`SELECT ${texts}::text[] AS texts, ${[1, -2, 3]}::int[] AS ints,
      ${[]}::int[] AS empty, array_length(${texts}::text[], 1) AS len, ARRAY[[1,2],[3,4]] AS matrix`;
    expect(row).toEqual({
      texts,
      ints: [1, -2, 3],
      empty: [],
      len: texts.length,
      matrix: [
        [1, 2],
        [3, 4],
      ],
    });
  });

  it("round-trips bytea from Uint8Array and Buffer parameters", async () => {
    const sql = sqlFor(tenant);
    const bytes = new Uint8Array([0, 1, 2, 127, 128, 254, 255]);
    const [row] =
      await sql`SELECT ${bytes}::bytea AS fromu8, ${Buffer.from([222, 173, 190, 239])}::bytea AS frombuf,
      octet_length(${bytes}::bytea) AS len, '\\x00ff'::bytea AS literal`;
    expect([...new Uint8Array(row?.fromu8 as Uint8Array)]).toEqual([...bytes]);
    expect([...new Uint8Array(row?.frombuf as Uint8Array)]).toEqual([222, 173, 190, 239]);
    expect(row?.len).toBe(bytes.length);
    expect([...new Uint8Array(row?.literal as Uint8Array)]).toEqual([0, 255]);
  });

  it("round-trips null for every type", async () => {
    const sql = sqlFor(tenant);
    const [row] = await sql`SELECT ${null}::text AS t, ${null}::int8 AS i, ${null}::jsonb AS j,
      ${null}::timestamptz AS ts, ${null}::bytea AS b, ${null}::int[] AS a, ${undefined}::bool AS u`;
    expect(row).toEqual({ t: null, i: null, j: null, ts: null, b: null, a: null, u: null });
  });

  it("stores and reads typed values through a table", async () => {
    const sql = sqlFor(tenant);
    const body = `typed-${crypto.randomUUID()}`;
    await sql`INSERT INTO notes (body, tags, attributes, stars)
      VALUES (${body}, ${["a", "b c"]}, ${{ x: [1, 2] }}, ${5})`;
    const rows = await sql`SELECT body, tags, attributes, stars, created_at FROM notes WHERE body = ${body}`;
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ body, tags: ["a", "b c"], attributes: { x: [1, 2] }, stars: 5 });
    expect(rows[0]?.created_at).toBeInstanceOf(Date);
  });
});

describe("neon(): arrayMode and fullResults", () => {
  it("arrayMode returns rows as arrays", async () => {
    const sql = sqlFor(tenant, { arrayMode: true });
    expect(await sql`SELECT 1 AS a, ${"x"}::text AS b, ${null}::int AS c`).toEqual([[1, "x", null]]);
  });

  it("arrayMode can be chosen per query", async () => {
    const sql = sqlFor(tenant);
    expect(await sql.query("SELECT 1 AS a, 2 AS b", [], { arrayMode: true })).toEqual([[1, 2]]);
  });

  it("fullResults returns fields, rowCount and command", async () => {
    const sql = sqlFor(tenant, { fullResults: true });
    const result = await sql`SELECT n, n::text AS label FROM generate_series(1, 3) AS n`;
    expect(result.command).toBe("SELECT");
    expect(result.rowCount).toBe(3);
    expect(result.fields.map((field) => field.name)).toEqual(["n", "label"]);
    expect(result.fields.map((field) => field.dataTypeID)).toEqual([23, 25]);
    expect(result.rows).toEqual([
      { n: 1, label: "1" },
      { n: 2, label: "2" },
      { n: 3, label: "3" },
    ]);
  });

  it("fullResults reports the command and row count of writes", async () => {
    const sql = sqlFor(tenant, { fullResults: true });
    const body = `full-${crypto.randomUUID()}`;
    const inserted = await sql`INSERT INTO notes (body) VALUES (${body}), (${body})`;
    expect(inserted).toMatchObject({ command: "INSERT", rowCount: 2, rows: [] });
    const updated = await sql`UPDATE notes SET stars = stars + 1 WHERE body = ${body}`;
    expect(updated).toMatchObject({ command: "UPDATE", rowCount: 2 });
    const deleted = await sql`DELETE FROM notes WHERE body = ${body}`;
    expect(deleted).toMatchObject({ command: "DELETE", rowCount: 2 });
  });

  it("arrayMode and fullResults together", async () => {
    const sql = sqlFor(tenant, { arrayMode: true, fullResults: true });
    const result = await sql`SELECT 1 AS a, 'b' AS b`;
    expect(result.rows).toEqual([[1, "b"]]);
    expect(result.fields.map((field) => field.name)).toEqual(["a", "b"]);
    expect(result.rowAsArray).toBe(true);
  });
});

describe("neon(): transactions", () => {
  it("commits a batch: both writes are visible, with each statement's result", async () => {
    const sql = sqlFor(tenant);
    const body = `commit-${crypto.randomUUID()}`;
    const [first, second, count] = await sql.transaction([
      sql`INSERT INTO notes (body) VALUES (${body}) RETURNING body`,
      sql`INSERT INTO notes (body, stars) VALUES (${body}, 2) RETURNING stars`,
      sql`SELECT count(*)::int AS n FROM notes WHERE body = ${body}`,
    ]);
    expect(first).toEqual([{ body }]);
    expect(second).toEqual([{ stars: 2 }]);
    // Statements see each other's writes: they run in one transaction.
    expect(count).toEqual([{ n: 2 }]);
    expect(await sql`SELECT count(*)::int AS n FROM notes WHERE body = ${body}`).toEqual([{ n: 2 }]);
  });

  it("rolls back a batch on a unique violation: no write is visible", async () => {
    const sql = sqlFor(tenant);
    const body = `rollback-${crypto.randomUUID()}`;
    const [existing] = await sql`INSERT INTO notes (body) VALUES (${"pk-holder"}) RETURNING id`;
    const error = await neonError(
      sql.transaction([
        sql`INSERT INTO notes (body) VALUES (${body})`,
        sql`INSERT INTO notes (id, body) VALUES (${existing?.id}, ${body})`,
      ]),
    );
    expect(error.code).toBe("23505");
    expect(error.constraint).toBe("notes_pkey");
    expect(error.table).toBe("notes");
    expect(error.detail).toBe(`Key (id)=(${existing?.id}) already exists.`);
    expect(await sql`SELECT count(*)::int AS n FROM notes WHERE body = ${body}`).toEqual([{ n: 0 }]);
  });

  it("rolls back a batch on division by zero", async () => {
    const sql = sqlFor(tenant);
    const body = `div0-${crypto.randomUUID()}`;
    const error = await neonError(
      sql.transaction([sql`INSERT INTO notes (body) VALUES (${body})`, sql`SELECT 1 / ${0}::int AS boom`]),
    );
    expect(error.code).toBe("22012");
    expect(error.message).toMatch(/division by zero/);
    expect(await sql`SELECT count(*)::int AS n FROM notes WHERE body = ${body}`).toEqual([{ n: 0 }]);
  });

  it("leaves the connection usable after a failed batch", async () => {
    const sql = sqlFor(tenant);
    await neonError(sql.transaction([sql`SELECT 1`, sql`SELECT nope FROM nowhere`]));
    // The pool is small; every connection must come back outside the aborted transaction.
    const answers = await Promise.all(Array.from({ length: 6 }, () => sql`SELECT 1 AS ok`));
    expect(answers).toEqual(Array.from({ length: 6 }, () => [{ ok: 1 }]));
    expect(await sql`SELECT current_setting('transaction_isolation') AS iso`).toEqual([
      { iso: "read committed" },
    ]);
  });

  it("applies the isolation level", async () => {
    const sql = sqlFor(tenant);
    for (const [level, shown] of [
      ["Serializable", "serializable"],
      ["RepeatableRead", "repeatable read"],
      ["ReadCommitted", "read committed"],
      ["ReadUncommitted", "read uncommitted"],
    ] as const) {
      const [rows] = await sql.transaction([sql`SHOW transaction_isolation`], { isolationLevel: level });
      expect(rows).toEqual([{ transaction_isolation: shown }]);
    }
  });

  it("applies isolation level, read-only and deferrable set on the client", async () => {
    const sql = sqlFor(tenant, { isolationLevel: "Serializable", readOnly: true, deferrable: true });
    const [iso, readOnly, deferrable] = await sql.transaction([
      sql`SHOW transaction_isolation`,
      sql`SHOW transaction_read_only`,
      sql`SHOW transaction_deferrable`,
    ]);
    expect(iso).toEqual([{ transaction_isolation: "serializable" }]);
    expect(readOnly).toEqual([{ transaction_read_only: "on" }]);
    expect(deferrable).toEqual([{ transaction_deferrable: "on" }]);
  });

  it("refuses a write in a read-only batch with 25006, and writes nothing", async () => {
    const sql = sqlFor(tenant);
    const body = `ro-${crypto.randomUUID()}`;
    const error = await neonError(
      sql.transaction([sql`INSERT INTO notes (body) VALUES (${body})`], { readOnly: true }),
    );
    expect(error.code).toBe("25006");
    expect(await sql`SELECT count(*)::int AS n FROM notes WHERE body = ${body}`).toEqual([{ n: 0 }]);
    // readOnly: false is an explicit READ WRITE.
    await sql.transaction([sql`INSERT INTO notes (body) VALUES (${body})`], { readOnly: false });
    expect(await sql`SELECT count(*)::int AS n FROM notes WHERE body = ${body}`).toEqual([{ n: 1 }]);
  });

  it("keeps batch options to their batch: the next query runs with the defaults", async () => {
    const sql = sqlFor(tenant);
    await sql.transaction([sql`SELECT 1`], { isolationLevel: "Serializable", readOnly: true });
    const rows = await Promise.all(
      Array.from({ length: 4 }, () => sql`SELECT current_setting('transaction_read_only') AS ro`),
    );
    expect(rows).toEqual(Array.from({ length: 4 }, () => [{ ro: "off" }]));
  });
});

describe("neon(): Postgres errors", () => {
  it("a unique violation carries code, message, detail and constraint", async () => {
    const sql = sqlFor(tenant);
    const [row] = await sql`INSERT INTO notes (body) VALUES ('dup') RETURNING id`;
    const error = await neonError(sql`INSERT INTO notes (id, body) VALUES (${row?.id}, 'dup')`);
    expect(error.name).toBe("NeonDbError");
    expect(error.code).toBe("23505");
    expect(error.severity).toBe("ERROR");
    expect(error.message).toBe('duplicate key value violates unique constraint "notes_pkey"');
    expect(error.detail).toBe(`Key (id)=(${row?.id}) already exists.`);
    expect(error.schema).toBe("public");
    expect(error.table).toBe("notes");
    expect(error.constraint).toBe("notes_pkey");
  });

  it("a syntax error carries its code and position", async () => {
    const sql = sqlFor(tenant);
    const query = "SELECT id FROM notes WHERE";
    const error = await neonError(sql.query(query));
    expect(error.code).toBe("42601");
    expect(error.message).toMatch(/syntax error at end of input/);
    expect(error.position).toBe(String(query.length + 1));

    const misplaced = "SELECT id, FROM notes";
    const other = await neonError(sql.query(misplaced));
    expect(other.code).toBe("42601");
    expect(other.message).toBe('syntax error at or near "FROM"');
    expect(other.position).toBe(String(misplaced.indexOf("FROM") + 1));
  });

  it("an undefined table, a not-null violation and a bad cast carry their codes", async () => {
    const sql = sqlFor(tenant);
    expect((await neonError(sql`SELECT * FROM no_such_table`)).code).toBe("42P01");
    const notNull = await neonError(sql`INSERT INTO notes (body) VALUES (${null})`);
    expect(notNull.code).toBe("23502");
    expect(notNull.column).toBe("body");
    expect((await neonError(sql`SELECT ${"abc"}::int`)).code).toBe("22P02");
  });

  it("a raised exception carries its hint and where", async () => {
    const sql = sqlFor(tenant);
    const error = await neonError(
      sql.query(
        `DO $$ BEGIN RAISE EXCEPTION 'custom failure' USING ERRCODE = 'P0001', HINT = 'try again'; END $$`,
      ),
    );
    expect(error.code).toBe("P0001");
    expect(error.message).toBe("custom failure");
    expect(error.hint).toBe("try again");
    expect(error.where).toMatch(/PL\/pgSQL/);
  });

  it("a tenant cannot reach beyond its database", async () => {
    const sql = sqlFor(tenant);
    // Its role is neither superuser nor allowed to create roles or databases.
    expect((await neonError(sql.query("CREATE DATABASE escape"))).code).toBe("42501");
    expect((await neonError(sql.query("CREATE ROLE escape"))).code).toBe("42501");
    expect((await neonError(sql.query("SELECT pg_read_file('/etc/passwd')"))).code).toBe("42501");
  });
});

describe("drizzle-orm neon-http", () => {
  it("inserts and selects through the example schema", async () => {
    const db = drizzle({ client: sqlFor(tenant) });
    const body = `drizzle-${crypto.randomUUID()}`;
    const inserted = await db
      .insert(notes)
      .values([
        { body, tags: ["x", "y z"], attributes: { level: 1, list: [true, null] }, stars: 3 },
        { body, tags: [] },
      ])
      .returning();
    expect(inserted).toHaveLength(2);
    expect(inserted[0]).toMatchObject({
      body,
      tags: ["x", "y z"],
      attributes: { level: 1, list: [true, null] },
      stars: 3,
    });
    expect(inserted[0]?.createdAt).toBeInstanceOf(Date);
    expect(inserted[1]).toMatchObject({ body, tags: [], attributes: null, stars: 0 });

    const selected = await db.select().from(notes).where(eq(notes.body, body)).orderBy(notes.id);
    expect(selected).toEqual(inserted);

    const updated = await db
      .update(notes)
      .set({ stars: 9 })
      .where(
        inArray(
          notes.id,
          inserted.map((row) => row.id),
        ),
      )
      .returning({ id: notes.id, stars: notes.stars });
    expect(updated.map((row) => row.stars)).toEqual([9, 9]);
  });

  it("runs a batch in one transaction and rolls it back on error", async () => {
    const db = drizzle({ client: sqlFor(tenant) });
    const body = `drizzle-batch-${crypto.randomUUID()}`;
    const [, rows] = await db.batch([
      db.insert(notes).values({ body }),
      db.select({ body: notes.body }).from(notes).where(eq(notes.body, body)),
    ]);
    expect(rows).toEqual([{ body }]);

    const [holder] = await db.select({ id: notes.id }).from(notes).where(eq(notes.body, body));
    const failed = await db
      .batch([
        db.insert(notes).values({ body: `${body}-2` }),
        db.insert(notes).values({ id: holder?.id, body }),
      ])
      .then(
        () => null,
        (error: unknown) => error,
      );
    // drizzle wraps the driver's error; the NeonDbError with the Postgres code is its cause.
    const cause = failed instanceof NeonDbError ? failed : (failed as { cause?: unknown } | null)?.cause;
    expect(cause).toBeInstanceOf(NeonDbError);
    expect((cause as NeonDbError).code).toBe("23505");
    expect(
      await db
        .select()
        .from(notes)
        .where(eq(notes.body, `${body}-2`)),
    ).toEqual([]);
  });
});
