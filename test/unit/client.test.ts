/**
 * lessor/client end to end through the real Neon driver, against a fake Lessor (`fakeLessor`: a
 * fetch function answering from a script) and a fake clock (`fakeClock`: waits are recorded, not
 * slept). The stack tests (test/integration/client.test.ts) run the same client against real Lessor.
 */
import { type AddressInfo, createServer } from "node:net";
import { NeonDbError, neon, neonConfig } from "@neondatabase/serverless";
import { afterEach, describe, expect, it, vi } from "vitest";
import { createClient } from "../../src/client/client.ts";
import { LessorResponseError } from "../../src/client/errors.ts";
import type { Clock } from "../../src/client/retry.ts";

const connectionString = "postgres://acme:lsk_unit-test-key@127.0.0.1:8787/acme";

interface SentRequest {
  url: string;
  method: string;
  headers: Headers;
  body: unknown;
}

/** A fake Lessor: answers each request with the next scripted answer (the last one repeats). */
function fakeLessor(...answers: Array<Response | (() => Response)>) {
  const sent: SentRequest[] = [];
  const fetch = async (url: string, init: RequestInit): Promise<Response> => {
    sent.push({
      url,
      method: init.method ?? "GET",
      headers: new Headers(init.headers),
      body: typeof init.body === "string" ? JSON.parse(init.body) : undefined,
    });
    const next = answers[Math.min(sent.length, answers.length) - 1];
    if (next === undefined) throw new Error("fakeLessor has no answer");
    return typeof next === "function" ? next() : next.clone();
  };
  return { fetch, sent };
}

/** A fake clock: `sleep` records the wait and moves time on at once. */
function fakeClock(): Clock & { waits: number[] } {
  let now = Date.parse("2026-11-30T12:00:00Z");
  const waits: number[] = [];
  return {
    waits,
    now: () => now,
    sleep: async (ms) => {
      waits.push(ms);
      now += ms;
    },
  };
}

function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

function refusal(status: number, code: string, retryAfter?: number): Response {
  return json(
    status,
    { code, message: `Lessor says ${code}.` },
    retryAfter === undefined ? {} : { "Retry-After": String(retryAfter) },
  );
}

/** The `/sql` single-result shape, rows as raw text arrays (what the driver asks for). */
function result(fields: Array<[string, number]>, rows: (string | null)[][], command = "SELECT") {
  return json(200, {
    fields: fields.map(([name, dataTypeID]) => ({
      name,
      dataTypeID,
      tableID: 0,
      columnID: 0,
      dataTypeSize: -1,
      dataTypeModifier: -1,
      format: "text",
    })),
    rows,
    command,
    rowCount: rows.length,
    rowAsArray: true,
  });
}

const int4 = 23;
const int8 = 20;
const text = 25;
const timestamptz = 1184;
const textArray = 1009;

const savedFetchFunction: unknown = neonConfig.fetchFunction;
afterEach(() => {
  neonConfig.fetchFunction = savedFetchFunction;
});

describe("createClient: sql", () => {
  it("sends the driver's request to <url>/sql and returns rows parsed as neon() parses them", async () => {
    const lessor = fakeLessor(
      result(
        [
          ["id", int4],
          ["big", int8],
          ["body", text],
          ["tags", textArray],
          ["at", timestamptz],
        ],
        [["7", "9007199254740993", "hi", "{a,b}", "2026-11-30 12:00:00+00"]],
      ),
    );
    const { sql } = createClient(connectionString, { url: "http://lessor.local:9000/", fetch: lessor.fetch });
    const rows = await sql`SELECT ${"x"} AS body`;
    expect(rows).toEqual([
      { id: 7, big: "9007199254740993", body: "hi", tags: ["a", "b"], at: new Date("2026-11-30T12:00:00Z") },
    ]);
    const [request] = lessor.sent;
    expect(request?.url).toBe("http://lessor.local:9000/sql");
    expect(request?.headers.get("Neon-Connection-String")).toMatch(
      /^postgres(ql)?:\/\/acme:lsk_unit-test-key@/,
    );
    expect(request?.body).toEqual({ query: "SELECT $1 AS body", params: ["x"] });
  });

  it("defaults the URL to the connection string's host: http on loopback, https elsewhere", async () => {
    const local = fakeLessor(result([["n", int4]], [["1"]]));
    await createClient(connectionString, { fetch: local.fetch }).sql`SELECT 1 AS n`;
    expect(local.sent[0]?.url).toBe("http://127.0.0.1:8787/sql");
    const remote = fakeLessor(result([["n", int4]], [["1"]]));
    await createClient("postgres://acme:lsk_k@lessor.example.com/acme", { fetch: remote.fetch })
      .sql`SELECT 1 AS n`;
    expect(remote.sent[0]?.url).toBe("https://lessor.example.com/sql");
  });

  it("retries a retryable refusal after Retry-After with jitter, then succeeds", async () => {
    const lessor = fakeLessor(
      refusal(503, "tenant_draining", 1),
      refusal(503, "capacity_saturated", 2),
      result([["n", int4]], [["1"]]),
    );
    const clock = fakeClock();
    const { sql } = createClient(connectionString, { fetch: lessor.fetch, clock, random: () => 0.5 });
    expect(await sql`SELECT 1 AS n`).toEqual([{ n: 1 }]);
    expect(lessor.sent).toHaveLength(3);
    expect(clock.waits).toEqual([1250, 2500]);
  });

  it("gives up at maxAttempts with a typed error: code, status, retryAfter, attempts", async () => {
    const lessor = fakeLessor(refusal(503, "lease_timeout", 1));
    const clock = fakeClock();
    const { sql } = createClient(connectionString, {
      fetch: lessor.fetch,
      clock,
      random: () => 0,
      retry: { maxAttempts: 3 },
    });
    const error = await sql`SELECT 1`.catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(LessorResponseError);
    expect(error).toMatchObject({
      code: "lease_timeout",
      status: 503,
      retryAfter: 1,
      attempts: 3,
      message: "Lessor says lease_timeout.",
    });
    expect(clock.waits).toEqual([1000, 1000]);
  });

  it("gives up before a wait that would overrun maxWaitMs", async () => {
    const lessor = fakeLessor(refusal(503, "tenant_starting_failed", 30));
    const clock = fakeClock();
    const { sql } = createClient(connectionString, {
      fetch: lessor.fetch,
      clock,
      retry: { maxWaitMs: 5000 },
    });
    await expect(sql`SELECT 1`).rejects.toMatchObject({
      code: "tenant_starting_failed",
      retryAfter: 30,
      attempts: 1,
    });
    expect(clock.waits).toEqual([]);
  });

  it("retries stale_generation on /sql", async () => {
    const lessor = fakeLessor(refusal(409, "stale_generation", 1), result([["n", int4]], [["1"]]));
    const { sql } = createClient(connectionString, { fetch: lessor.fetch, clock: fakeClock() });
    expect(await sql`SELECT 1 AS n`).toEqual([{ n: 1 }]);
  });

  it("does not retry connection_lost unless the caller opts in", async () => {
    const refused = fakeLessor(refusal(503, "connection_lost", 1), result([["n", int4]], [["1"]]));
    const strict = createClient(connectionString, { fetch: refused.fetch, clock: fakeClock() });
    await expect(strict.sql`UPDATE counters SET n = n + 1`).rejects.toMatchObject({
      code: "connection_lost",
      attempts: 1,
    });
    const retried = fakeLessor(refusal(503, "connection_lost", 1), result([["n", int4]], [["1"]]));
    const optedIn = createClient(connectionString, {
      fetch: retried.fetch,
      clock: fakeClock(),
      retry: { retryConnectionLost: true },
    });
    expect(await optedIn.sql`SELECT 1 AS n`).toEqual([{ n: 1 }]);
  });

  it("leaves Postgres errors to the driver (a NeonDbError with its fields), never retried", async () => {
    const lessor = fakeLessor(
      json(400, {
        code: "23505",
        message: 'duplicate key value violates unique constraint "notes_slug_unique"',
        constraint: "notes_slug_unique",
        severity: "ERROR",
      }),
    );
    const { sql } = createClient(connectionString, { fetch: lessor.fetch, clock: fakeClock() });
    const error = await sql`INSERT INTO notes (slug) VALUES ('a')`.catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(NeonDbError);
    expect(error).toMatchObject({ code: "23505", constraint: "notes_slug_unique" });
    expect(lessor.sent).toHaveLength(1);
  });

  it.each([
    [400, "statement_timeout"],
    [507, "response_too_large"],
    [401, "invalid_credentials"],
    [423, "tenant_disabled"],
  ])("turns %i %s into a LessorResponseError at once", async (status, code) => {
    const lessor = fakeLessor(refusal(status, code));
    const { sql } = createClient(connectionString, { fetch: lessor.fetch, clock: fakeClock() });
    await expect(sql`SELECT 1`).rejects.toMatchObject({
      name: "LessorResponseError",
      code,
      status,
      attempts: 1,
    });
    expect(lessor.sent).toHaveLength(1);
  });

  it("types errors from sql.query() and sql.transaction() too, and keeps transaction([...]) working", async () => {
    const lessor = fakeLessor(refusal(503, "tenant_migrating", 1));
    const { sql } = createClient(connectionString, {
      fetch: lessor.fetch,
      clock: fakeClock(),
      retry: { maxAttempts: 1 },
    });
    await expect(sql.query("SELECT 1")).rejects.toMatchObject({ code: "tenant_migrating" });
    await expect(sql.transaction([sql`SELECT 1`, sql`SELECT 2`])).rejects.toMatchObject({
      code: "tenant_migrating",
    });
    await expect(sql.transaction((tx) => [tx`SELECT 1`])).rejects.toMatchObject({ code: "tenant_migrating" });
    expect(lessor.sent.at(-1)?.body).toEqual({ queries: [{ query: "SELECT 1", params: [] }] });
  });

  it("passes other neon() clients' requests to the fetchFunction set before it", async () => {
    const other: string[] = [];
    neonConfig.fetchFunction = async (url: string) => {
      other.push(url);
      return result([["n", int4]], [["2"]]);
    };
    neonConfig.fetchEndpoint = "http://elsewhere.test/sql";
    try {
      const lessor = fakeLessor(result([["n", int4]], [["1"]]));
      const client = createClient(connectionString, { fetch: lessor.fetch });
      const plain = neon("postgres://u:p@db.example/app");
      expect(await client.sql`SELECT 1 AS n`).toEqual([{ n: 1 }]);
      expect(await plain`SELECT 2 AS n`).toEqual([{ n: 2 }]);
      expect(other).toEqual(["http://elsewhere.test/sql"]);
      expect(lessor.sent).toHaveLength(1);
    } finally {
      neonConfig.fetchEndpoint = neonConfig.defaults.fetchEndpoint;
    }
  });

  it("still routes through itself when an app replaces neonConfig.fetchFunction afterwards", async () => {
    const lessor = fakeLessor(result([["n", int4]], [["1"]]));
    const client = createClient(connectionString, { fetch: lessor.fetch });
    neonConfig.fetchFunction = async () => {
      throw new Error("the app's own fetchFunction must not see the client's requests");
    };
    expect(await client.sql`SELECT 1 AS n`).toEqual([{ n: 1 }]);
  });

  it("stops waiting when the caller's signal aborts", async () => {
    const lessor = fakeLessor(refusal(503, "tenant_draining", 1));
    const controller = new AbortController();
    // A clock whose waits end only when the signal aborts: the call can settle only by stopping.
    const waits: number[] = [];
    const { sql } = createClient(connectionString, {
      fetch: lessor.fetch,
      fetchOptions: { signal: controller.signal },
      clock: {
        now: () => 0,
        sleep: (ms, signal) =>
          new Promise<void>((_resolve, reject) => {
            waits.push(ms);
            signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
          }),
      },
    });
    const pending = sql`SELECT 1`.catch((caught: unknown) => caught);
    await vi.waitFor(() => expect(waits).toHaveLength(1));
    controller.abort(new Error("gave up"));
    const error = await pending;
    expect(String(error)).toContain("gave up");
  });
});

describe("createClient: Lessor not there", () => {
  it("rejects with code unreachable and where it looked, not a bare TypeError: fetch failed (real fetch)", async () => {
    // A port nothing listens on: the real fetch fails as it does with Lessor down.
    const closed = await new Promise<number>((done) => {
      const server = createServer();
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo;
        server.close(() => done(port));
      });
    });
    const { sql, lease } = createClient(`postgres://acme:lsk_unit-test-key@127.0.0.1:${closed}/acme`, {
      retry: { maxAttempts: 4 },
    });
    for (const attempt of [() => sql`SELECT 1`, () => lease({ ttlMs: 1000 })]) {
      const error = await Promise.resolve(attempt()).catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(LessorResponseError);
      expect(error).toMatchObject({ code: "unreachable", status: 0, attempts: 1 });
      expect((error as Error).message).toBe(
        `Could not reach Lessor at http://127.0.0.1:${closed} (connect ECONNREFUSED 127.0.0.1:${closed}). ` +
          "Is it running there? Its URL is the client's url option, or the connection string's host and port.",
      );
      expect((error as Error).cause).toBeInstanceOf(TypeError);
    }
  });
});

describe("createClient: session leases", () => {
  const token = `lsl_acme_${"ab".repeat(24)}`;
  const opened = () => json(201, { lease: token, generation: 3, expiresAt: "2026-11-30T12:00:30.000Z" });

  it("opens, queries with typed rows, and releases; authenticated by the bearer key alone", async () => {
    const lessor = fakeLessor(
      opened(),
      result(
        [
          ["id", int4],
          ["body", text],
        ],
        [["1", "kept"]],
      ),
      new Response(null, { status: 204 }),
    );
    const client = createClient(connectionString, { fetch: lessor.fetch, clock: fakeClock() });
    const lease = await client.lease({ ttlMs: 5000 });
    expect(lease).toMatchObject({ id: token, generation: 3, expiresAt: new Date("2026-11-30T12:00:30Z") });
    expect(await lease.query("SELECT id, body FROM notes WHERE id = $1", [1])).toEqual([
      { id: 1, body: "kept" },
    ]);
    await lease.release();
    await lease.release();

    const [open, statement, release] = lessor.sent;
    expect(open).toMatchObject({
      url: "http://127.0.0.1:8787/v1/tenants/acme/leases",
      method: "POST",
      body: { ttlMs: 5000 },
    });
    expect(statement).toMatchObject({
      url: `http://127.0.0.1:8787/v1/leases/${token}/sql`,
      method: "POST",
      body: { query: "SELECT id, body FROM notes WHERE id = $1", params: ["1"] },
    });
    expect(statement?.headers.get("Neon-Connection-String")).toBeNull();
    expect(release).toMatchObject({ url: `http://127.0.0.1:8787/v1/leases/${token}`, method: "DELETE" });
    for (const request of lessor.sent)
      expect(request.headers.get("Authorization")).toBe("Bearer lsk_unit-test-key");
    // Released once: the second release() sent nothing.
    expect(lessor.sent).toHaveLength(3);
  });

  it("retries opening a lease refused with lease_limit", async () => {
    const lessor = fakeLessor(refusal(503, "lease_limit", 1), opened());
    const clock = fakeClock();
    const client = createClient(connectionString, { fetch: lessor.fetch, clock, random: () => 0 });
    expect((await client.lease()).id).toBe(token);
    expect(clock.waits).toEqual([1000]);
    expect(lessor.sent[1]?.body).toEqual({});
  });

  it("runs a transaction as BEGIN … COMMIT, and ROLLBACK when the callback throws", async () => {
    const empty = () => result([], [], "BEGIN");
    const lessor = fakeLessor(opened(), empty);
    const client = createClient(connectionString, { fetch: lessor.fetch, clock: fakeClock() });
    const lease = await client.lease();
    const value = await lease.transaction(
      async (tx) => {
        await tx.query("INSERT INTO notes (body) VALUES ($1)", ["a"]);
        return "done";
      },
      { isolationLevel: "Serializable", readOnly: false },
    );
    expect(value).toBe("done");
    await expect(
      lease.transaction(async (tx) => {
        await tx.query("INSERT INTO notes (body) VALUES ($1)", ["b"]);
        throw new Error("changed my mind");
      }),
    ).rejects.toThrow("changed my mind");
    expect(lessor.sent.slice(1).map((request) => (request.body as { query: string }).query)).toEqual([
      "BEGIN ISOLATION LEVEL SERIALIZABLE, READ WRITE",
      "INSERT INTO notes (body) VALUES ($1)",
      "COMMIT",
      "BEGIN",
      "INSERT INTO notes (body) VALUES ($1)",
      "ROLLBACK",
    ]);
  });

  it("refuses to report a commit that Postgres turned into a rollback", async () => {
    const lessor = fakeLessor(opened(), result([], [], "BEGIN"), result([], [], "ROLLBACK"));
    const client = createClient(connectionString, { fetch: lessor.fetch, clock: fakeClock() });
    const lease = await client.lease();
    await expect(lease.transaction(async () => "swallowed an error inside")).rejects.toThrow(
      /rolled back, not committed/,
    );
  });

  it("does not retry stale_generation on a lease; release() of a lease that is gone resolves", async () => {
    const lessor = fakeLessor(opened(), refusal(409, "stale_generation", 1), refusal(409, "lease_expired"));
    const clock = fakeClock();
    const client = createClient(connectionString, { fetch: lessor.fetch, clock });
    const lease = await client.lease();
    await expect(lease.query("SELECT 1")).rejects.toMatchObject({
      code: "stale_generation",
      status: 409,
      attempts: 1,
    });
    expect(clock.waits).toEqual([]);
    await lease.release();
    expect(lessor.sent.at(-1)?.method).toBe("DELETE");
  });

  it("keeps Postgres errors on a lease as the driver's NeonDbError", async () => {
    const lessor = fakeLessor(opened(), json(400, { code: "22012", message: "division by zero" }));
    const client = createClient(connectionString, { fetch: lessor.fetch, clock: fakeClock() });
    const lease = await client.lease();
    await expect(lease.query("SELECT 1/0")).rejects.toSatisfy(
      (error) => error instanceof NeonDbError && error.code === "22012",
    );
  });
});
