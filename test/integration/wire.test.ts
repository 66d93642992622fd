/**
 * The wire endpoint's conformance (issue 29): the Neon driver's `Pool` and `Client`, drizzle's
 * `neon-serverless` and node-postgres over the driver's socket, each through Lessor's `/v2` against
 * the real Postgres, with types, errors (SQLSTATE, position) and LISTEN as docs/wire-protocol.md
 * says; then what each pool mode keeps, and what no mode lets through.
 */
import { neonConfig } from "@neondatabase/serverless";
import { sql, TransactionRollbackError } from "drizzle-orm";
import { drizzle } from "drizzle-orm/neon-serverless";
import { integer, pgTable, serial, text } from "drizzle-orm/pg-core";
import pg from "pg";
import { afterEach, describe, expect, it } from "vitest";
import { parameterStatusOf } from "../../src/core/pg-wire.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  asSuperuser,
  type CreatedTenant,
  createTenant,
  pollUntil,
  runtimeOf,
  sqlFor,
  uniqueTenantId,
} from "./harness.ts";
import { inMode, RawWire, WireClient, wirePool, wireSettings } from "./wire-client.ts";

const notes = pgTable("notes", {
  id: serial("id").primaryKey(),
  body: text("body").notNull(),
  stars: integer("stars").notNull().default(0),
});

async function bodiesOf(tenant: CreatedTenant): Promise<string[]> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT body FROM notes ORDER BY id");
    return rows.map((row: { body: string }) => row.body);
  }, tenant.database);
}

/** A query that exercises the driver's type parsers, read through Lessor and around it. */
const typesQuery = `SELECT 42::int4 AS i4, 9007199254740993::int8 AS i8, 1.5::numeric AS num, 2.25::float8 AS f8,
  true AS b, 'héllo ☃'::text AS t, '{"a":[1,2]}'::jsonb AS jb, '{"x":1}'::json AS j,
  '2026-01-02T03:04:05.678Z'::timestamptz AS ts, '2026-01-02'::date AS d, '\\xdeadbeef'::bytea AS by,
  ARRAY[1,2,3]::int4[] AS arr, ARRAY['a', NULL, 'c"d']::text[] AS tarr,
  '6c0f3a5e-2b1d-4a8e-9c3f-1b2a3c4d5e6f'::uuid AS u, NULL::text AS nothing, $1::text AS param`;

const ended: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  // Bounded: a client the test already ended (or Lessor closed) may never report its end again.
  for (const end of ended.splice(0)) {
    await Promise.race([end().catch(() => undefined), new Promise((resolve) => setTimeout(resolve, 2_000))]);
  }
  tenantHooksForTests.config = undefined;
});

function track<T extends { end(): Promise<unknown> }>(closable: T): T {
  ended.push(() => closable.end());
  return closable;
}

describe("the Neon driver's Pool and Client through /v2", () => {
  it("Pool.query round-trips every common type as a direct connection reads it", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-types"));
    const pool = track(wirePool({ connectionString: tenant.connectionString }));
    const through = await pool.query(typesQuery, ["a param"]);
    const direct = await asSuperuser((client) => client.query(typesQuery, ["a param"]), tenant.database);
    expect(through.rows).toEqual(direct.rows);
    expect(through.fields.map((f) => [f.name, f.dataTypeID])).toEqual(
      direct.fields.map((f) => [f.name, f.dataTypeID]),
    );
    const [row] = through.rows;
    expect(row).toMatchObject({ i4: 42, i8: "9007199254740993", b: true, t: "héllo ☃", jb: { a: [1, 2] } });
    expect(row.ts).toBeInstanceOf(Date);
    expect([...row.by]).toEqual([0xde, 0xad, 0xbe, 0xef]);
    expect(row.tarr).toEqual(["a", null, 'c"d']);
  });

  it("errors keep their SQLSTATE, position and fields; the connection serves the next query", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-errors"));
    const pool = track(wirePool({ connectionString: tenant.connectionString, max: 1 }));
    const missing = await pool.query("SELECT * FROM no_such_table").catch((error: unknown) => error);
    expect(missing).toMatchObject({ code: "42P01", position: "15", severity: "ERROR" });
    const zero = await pool.query("SELECT 1 / $1::int", [0]).catch((error: unknown) => error);
    expect(zero).toMatchObject({ code: "22012" });
    await pool.query("CREATE TABLE uniq (k int PRIMARY KEY)");
    await pool.query("INSERT INTO uniq VALUES (1)");
    const duplicate = await pool.query("INSERT INTO uniq VALUES (1)").catch((error: unknown) => error);
    expect(duplicate).toMatchObject({ code: "23505", constraint: "uniq_pkey", table: "uniq" });
    expect((await pool.query("SELECT count(*)::int AS n FROM uniq")).rows).toEqual([{ n: 1 }]);
  });

  it("Client: BEGIN … COMMIT across round trips commits; a ROLLBACK leaves nothing", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-client"));
    const client = track(new WireClient(tenant.connectionString));
    await client.connect();
    await client.query("BEGIN");
    await client.query("INSERT INTO notes (body) VALUES ($1)", ["kept"]);
    expect((await client.query("SELECT count(*)::int AS n FROM notes")).rows).toEqual([{ n: 1 }]);
    await client.query("COMMIT");
    await client.query("BEGIN");
    await client.query("INSERT INTO notes (body) VALUES ($1)", ["dropped"]);
    await client.query("ROLLBACK");
    // A failed statement aborts the transaction as on Postgres; the client's ROLLBACK ends it.
    await client.query("BEGIN");
    await client.query("INSERT INTO notes (body) VALUES ($1)", ["failed"]);
    await expect(client.query("SELECT 1/0")).rejects.toMatchObject({ code: "22012" });
    await expect(client.query("SELECT 1")).rejects.toMatchObject({ code: "25P02" });
    await client.query("ROLLBACK");
    expect(await bodiesOf(tenant)).toEqual(["kept"]);
  });

  it("named prepared statements work across transactions in transaction mode (re-prepared on each connection)", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-named"));
    const client = track(new WireClient(tenant.connectionString));
    await client.connect();
    const named = { name: "count-notes", text: "SELECT count(*)::int AS n FROM notes WHERE body = $1" };
    // Each query is its own transaction: a connection of the pool each time, the statement known to none of them.
    for (let i = 0; i < 4; i++) {
      await client.query("INSERT INTO notes (body) VALUES ('x')");
      expect((await client.query({ ...named, values: ["x"] })).rows).toEqual([{ n: i + 1 }]);
    }
    // And inside an explicit transaction, where it runs on the transaction's connection.
    await client.query("BEGIN");
    expect((await client.query({ ...named, values: ["y"] })).rows).toEqual([{ n: 0 }]);
    await client.query("COMMIT");
  });

  it("pool.end() gives every connection back: no lease is left", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-end"));
    const pool = wirePool({ connectionString: tenant.connectionString, max: 3 });
    await Promise.all([1, 2, 3].map((n) => pool.query("SELECT pg_sleep(0.05), $1::int", [n])));
    await pool.end();
    expect(
      (
        await pollUntil(
          () => runtimeOf(tenant.id),
          (r) => r.leases === 0,
        )
      ).leases,
    ).toBe(0);
  });
});

describe("drizzle neon-serverless through /v2", () => {
  it("commits a transaction, and one that rolls back inside leaves nothing", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-drizzle"));
    const pool = track(wirePool({ connectionString: tenant.connectionString }));
    const db = drizzle({ client: pool });
    await db.transaction(async (tx) => {
      await tx.insert(notes).values({ body: "committed", stars: 2 });
      await tx.update(notes).set({ stars: sql`${notes.stars} + 1` });
    });
    const rolledBack = await db
      .transaction(async (tx) => {
        await tx.insert(notes).values({ body: "rolled back" });
        tx.rollback();
      })
      .catch((error: unknown) => error);
    expect(rolledBack).toBeInstanceOf(TransactionRollbackError);
    // A nested transaction (a savepoint) that fails, inside one that commits.
    await db.transaction(async (tx) => {
      await tx.insert(notes).values({ body: "outer" });
      await tx
        .transaction(async (inner) => {
          await inner.insert(notes).values({ body: "inner" });
          inner.rollback();
        })
        .catch(() => undefined);
    });
    expect(await db.select({ body: notes.body, stars: notes.stars }).from(notes).orderBy(notes.id)).toEqual([
      { body: "committed", stars: 3 },
      { body: "outer", stars: 0 },
    ]);
  });
});

describe("node-postgres over the Neon driver's socket", () => {
  it("pg.Client connects through /v2, with types, errors and a transaction", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-pg"));
    const client = track(
      new pg.Client({
        connectionString: tenant.connectionString,
        // pg takes any Duplex-like stream; the Neon driver's Socket (exported as `neonConfig`, whose
        // instances are sockets) is one that speaks WebSocket.
        stream: () => Object.assign(new neonConfig(), wireSettings) as never,
      }),
    );
    await client.connect();
    const { rows } = await client.query("SELECT $1::int + 1 AS n, now() AS at", [41]);
    expect(rows[0]).toMatchObject({ n: 42 });
    expect(rows[0].at).toBeInstanceOf(Date);
    await expect(client.query("SELECT nope")).rejects.toMatchObject({ code: "42703", position: "8" });
    await client.query("BEGIN");
    await client.query("INSERT INTO notes (body) VALUES ('from pg')");
    await client.query("COMMIT");
    expect(await bodiesOf(tenant)).toEqual(["from pg"]);
  });
});

describe("what each pool mode keeps", () => {
  it("transaction mode: settings, temp tables and advisory locks end with the transaction", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-txmode"));
    const client = track(new WireClient(tenant.connectionString));
    await client.connect();
    await client.query("SET application_name = 'set-by-tenant'");
    await client.query("CREATE TEMP TABLE scratch (x int)");
    await client.query("SELECT pg_advisory_lock(42)");
    // The next statement is a new transaction, on a connection reset in between.
    const { rows } = await client.query(
      `SELECT current_setting('application_name') AS app,
              to_regclass('pg_temp.scratch') AS scratch,
              (SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory') AS locks`,
    );
    expect(rows).toEqual([{ app: expect.stringMatching(/^lessor:/), scratch: null, locks: 0 }]);
    // Inside one transaction everything holds.
    await client.query("BEGIN");
    await client.query("SET LOCAL application_name = 'local'");
    expect((await client.query("SELECT current_setting('application_name') AS app")).rows).toEqual([
      { app: "local" },
    ]);
    await client.query("COMMIT");
  });

  it("session mode: one connection for the client's life, counted as a lease, reset when it ends", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-session"), { tier: "free" });
    const session = new WireClient(inMode(tenant.connectionString, "session"));
    await session.connect();
    await session.query("SET application_name = 'session-kept'");
    await session.query("CREATE TEMP TABLE scratch (x int)");
    const first = (await session.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
    expect(
      (await session.query("SELECT pg_backend_pid() AS pid, current_setting('application_name') AS app"))
        .rows,
    ).toEqual([{ pid: first, app: "session-kept" }]);
    expect((await runtimeOf(tenant.id)).leases).toBe(1);
    await session.end();
    expect(
      (
        await pollUntil(
          () => runtimeOf(tenant.id),
          (r) => r.leases === 0,
        )
      ).leases,
    ).toBe(0);
    // The same backend, reset: nothing of the session is left for the next client.
    const next = track(new WireClient(inMode(tenant.connectionString, "session")));
    await next.connect();
    const { rows } = await next.query(
      "SELECT current_setting('application_name') AS app, to_regclass('pg_temp.scratch') AS scratch",
    );
    expect(rows).toEqual([{ app: expect.stringMatching(/^lessor:/), scratch: null }]);
  });

  it("session mode shares the pool's size with session leases: past it, a clean retryable FATAL 53300", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-limit"), { tier: "free" });
    const a = new WireClient(inMode(tenant.connectionString, "session"));
    const b = track(new WireClient(inMode(tenant.connectionString, "session")));
    await a.connect();
    await b.connect();
    await a.query("SELECT 1");
    await b.query("SELECT 1");
    const c = new WireClient(inMode(tenant.connectionString, "session"));
    c.on("error", () => undefined);
    const refused = await c
      .connect()
      .then(() => c.query("SELECT 1"))
      .catch((error: unknown) => error);
    expect(refused).toMatchObject({ code: "53300", detail: "lease_limit", severity: "FATAL" });
    expect((refused as { hint?: string }).hint).toMatch(/Retryable/);
    // A slot comes back when a session ends.
    await a.end();
    const d = track(new WireClient(inMode(tenant.connectionString, "session")));
    await d.connect();
    expect((await d.query("SELECT 2 AS n")).rows).toEqual([{ n: 2 }]);
  });

  it("LISTEN: notifications reach a session-mode client; in transaction mode it is told they cannot", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-listen"));
    const listener = track(new WireClient(inMode(tenant.connectionString, "session")));
    await listener.connect();
    const heard: string[] = [];
    listener.on("notification", (message) => heard.push(message.payload ?? ""));
    await listener.query("LISTEN lessor_test");
    const sender = track(new WireClient(tenant.connectionString));
    await sender.connect();
    await sender.query("SELECT pg_notify('lessor_test', 'hello')");
    expect(
      await pollUntil(
        async () => heard,
        (h) => h.length > 0,
      ),
    ).toEqual(["hello"]);

    const notices: string[] = [];
    sender.on("notice", (notice) => notices.push(notice.message ?? ""));
    await sender.query("LISTEN lessor_test");
    expect(
      await pollUntil(
        async () => notices,
        (n) => n.length > 0,
      ),
    ).toEqual([expect.stringMatching(/LISTEN lasts only until this transaction ends/)]);
  });
});

describe("the greeting after /sql requests", () => {
  it("repeats no setting a /sql statement changed: the pipelined reset's report puts it back", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-greeting"));
    const greeting = async () => {
      const wire = await RawWire.connect(tenant.id, tenant.key);
      const messages = await wire.untilReady();
      wire.close();
      return new Map(
        messages.flatMap((m) => (m.type === 0x53 ? [parameterStatusOf(m.body) ?? ["?", "?"]] : [])),
      );
    };
    // The first wire client has the room learn the parameters of a pooled connection (the pool's
    // only one, which the sequential requests below then reuse).
    const before = (await greeting()).get("TimeZone");
    expect(before).toBeDefined();
    expect(before).not.toBe("Pacific/Chatham");
    const sql = sqlFor(tenant);
    for (let i = 0; i < 4; i++) await sql.query("SET TimeZone TO 'Pacific/Chatham'");
    expect(await sql.query("SHOW TimeZone")).toEqual([{ TimeZone: before }]);
    // The statement's ParameterStatus said Chatham (the driver read it); the reset's, read off the
    // wire by Lessor, said it back.
    expect((await greeting()).get("TimeZone")).toBe(before);
  });
});
