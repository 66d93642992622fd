/**
 * Every byte the wire relay holds for a connection is bounded, and every cost is linear in what the
 * client sends (issue 40). Each test makes the condition happen (a statement that sleeps while the
 * client floods, answers pipelined past the answer bound, a message in 1-byte frames, a client that
 * stops reading), asserts it happened, then asserts the outcome: the documented FATAL, or the client
 * served. What the relay holds is read from what Lessor counts per connection, per direction and
 * per hop (`wireEdgeBuffers`, `wireObjectBuffers`), never from a clock; after a client leaves, both
 * sides' counts are back at zero.
 */
import { env } from "cloudflare:test";
import { neonConfig } from "@neondatabase/serverless";
import pg from "pg";
import { afterEach, describe, expect, it } from "vitest";
import type { LessorConfig } from "../../src/config/index.ts";
import { loadConfig } from "../../src/config/index.ts";
import { cancelRequest, concatBytes, frontend, type Message, textMessage } from "../../src/core/pg-wire.ts";
import type { WireBufferCounts, WireBufferSnapshot } from "../../src/core/wire-buffers.ts";
import { wireBounds } from "../../src/core/wire-flow.ts";
import { mintCancelKey } from "../../src/routes/wire-cancel.ts";
import { wireEdgeBuffers, wireEdgeHooksForTests } from "../../src/routes/wire-relay.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import { wireObjectBuffers } from "../../src/tenant-object/wire.ts";
import {
  asSuperuser,
  type CreatedTenant,
  createTenant,
  pollUntil,
  runtimeOf,
  uniqueTenantId,
} from "./harness.ts";
import { fieldsOf, RawWire, typesOf, wirePool, wireSettings } from "./wire-client.ts";

afterEach(() => {
  tenantHooksForTests.config = undefined;
  wireEdgeHooksForTests.clientStopsReading = undefined;
});

function boundsFor(tenant: CreatedTenant, settings: Partial<LessorConfig>): void {
  tenantHooksForTests.config = (id) => (id === tenant.id ? settings : undefined);
}

/** The bounds a tenant's object gives its wire connections, with the tenant's own settings. */
function boundsOf(settings: Partial<LessorConfig> = {}) {
  return wireBounds({ ...loadConfig(env), ...settings });
}

const q = (sql: string) => textMessage(frontend.query, sql);

function errorOf(messages: readonly Message[]): Record<string, string> {
  return fieldsOf(messages.find((message) => message.type === 0x45));
}

/** What a client got, in a form whose diff says what happened: the error, the answers, the rows. */
function outcome(messages: readonly Message[]): {
  error: Record<string, string>;
  answered: number;
  rows: number;
  rowBytes: number;
} {
  const rows = messages.filter((message) => message.type === 0x44);
  return {
    error: errorOf(messages),
    answered: messages.filter((message) => message.type === 0x5a).length,
    rows: rows.length,
    rowBytes: rows.reduce((total, message) => total + message.bytes.byteLength, 0),
  };
}

/** Waits for the greeting; answers the connection's process id (its cancel key's). */
async function ready(wire: RawWire): Promise<{ pid: number; secret: number }> {
  const greeting = await wire.untilReady();
  const key = greeting.find((message) => message.type === 0x4b);
  if (!key)
    throw new Error(`no BackendKeyData in ${typesOf(greeting)}: ${JSON.stringify(errorOf(greeting))}`);
  const view = new DataView(key.body.buffer, key.body.byteOffset, key.body.byteLength);
  return { pid: view.getInt32(0), secret: view.getInt32(4) };
}

async function sleeping(tenant: CreatedTenant): Promise<boolean> {
  const rows = await asSuperuser(async (client) => {
    const { rows } = await client.query(
      `SELECT query FROM pg_stat_activity WHERE usename = $1 AND state = 'active' AND query LIKE '%pg_sleep%'`,
      [tenant.role],
    );
    return rows as { query: string }[];
  });
  return rows.length > 0;
}

/** Both sides' counts of one connection, merged; `ended` once both released everything. */
function buffersOf(pid: number): {
  now: Partial<WireBufferCounts>;
  peak: Partial<WireBufferCounts>;
  ended: boolean;
} {
  const sides = [wireEdgeBuffers(pid), wireObjectBuffers(pid)].filter(
    (side): side is WireBufferSnapshot => side !== null,
  );
  return {
    now: Object.assign({}, ...sides.map((side) => side.now)),
    peak: Object.assign({}, ...sides.map((side) => side.peak)),
    ended: sides.length === 2 && sides.every((side) => side.ended),
  };
}

/** Waits until both sides of the connection ended; asserts they hold nothing any more. */
async function released(pid: number): Promise<Partial<WireBufferCounts>> {
  const final = await pollUntil(
    async () => buffersOf(pid),
    (counts) => counts.ended,
  );
  expect(final.ended).toBe(true);
  expect(Object.values(final.now).every((bytes) => bytes === 0)).toBe(true);
  return final.peak;
}

async function leasesOf(tenant: CreatedTenant): Promise<number> {
  return (
    await pollUntil(
      () => runtimeOf(tenant.id),
      (r) => r.leases === 0,
    )
  ).leases;
}

describe("client to server: the bytes a client sends ahead of the server are bounded", () => {
  it("a flood behind a sleeping statement is ended with FATAL 54000 pipeline_limit; none of it reaches the server", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-flood"));
    const wire = await RawWire.connect(tenant.id, tenant.key);
    const { pid } = await ready(wire);
    wire.send(q("SELECT pg_sleep(3)"));
    expect(
      await pollUntil(
        () => sleeping(tenant),
        (busy) => busy,
      ),
    ).toBe(true);
    // 40 statements of 256 KiB each (10 MiB) behind the one that sleeps.
    const filler = q(`SELECT 1 /* ${"x".repeat(256 * 1024)} */`);
    for (let i = 0; i < 40; i++) wire.send(filler);
    const got = outcome(await wire.untilClosed());
    expect(got).toMatchObject({ error: { S: "FATAL", C: "54000", D: "pipeline_limit" }, rows: 0 });
    const bounds = boundsOf();
    const peak = await released(pid);
    // The edge held up to its bound, the object a window, the server was owed a cycle past its mark.
    expect(peak.toServerEdge ?? 0).toBeGreaterThan(0);
    expect(peak.toServerEdge ?? 0).toBeLessThanOrEqual(bounds.edgeHoldBytes);
    expect(peak.toServerInFlight ?? 0).toBeLessThanOrEqual(bounds.upWindowBytes);
    expect(peak.toServerObject ?? 0).toBeLessThanOrEqual(bounds.upWindowBytes);
    expect(peak.toServerOwed ?? 0).toBeLessThanOrEqual(bounds.owedHighBytes + bounds.maxCycleBytes);
    expect(await leasesOf(tenant)).toBe(0);
  });

  it("statements pipelined behind a sleeping one within the bounds wait, held at the edge, and are all served", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-held"));
    const settings = { maxBodyBytes: 256 * 1024, wireBufferBytes: 64 * 1024 };
    boundsFor(tenant, settings);
    const bounds = boundsOf(settings);
    const wire = await RawWire.connect(tenant.id, tenant.key);
    const { pid } = await ready(wire);
    wire.send(q("SELECT pg_sleep(1)"));
    expect(
      await pollUntil(
        () => sleeping(tenant),
        (busy) => busy,
      ),
    ).toBe(true);
    // Six of 100 KiB: one goes to the server, the object holds a window, the edge the rest.
    for (let i = 0; i < 6; i++) wire.send(q(`SELECT ${i} /* ${"y".repeat(100 * 1024)} */`));
    // The condition: the object holds what the server does not take, and the edge the rest.
    const holding = await pollUntil(
      async () => buffersOf(pid).now,
      (now) => (now.toServerEdge ?? 0) > 0,
    );
    expect(holding.toServerEdge ?? 0).toBeGreaterThan(0);
    const messages: Message[] = [];
    for (let i = 0; i < 7; i++) messages.push(...(await wire.untilReady()));
    expect(outcome(messages)).toMatchObject({ error: {}, answered: 7, rows: 7 });
    wire.close();
    const peak = await released(pid);
    expect(peak.toServerEdge ?? 0).toBeLessThanOrEqual(bounds.edgeHoldBytes);
    expect(peak.toServerObject ?? 0).toBeLessThanOrEqual(bounds.upWindowBytes);
    expect(peak.toServerOwed ?? 0).toBeLessThanOrEqual(bounds.owedHighBytes + bounds.maxCycleBytes);
  });
});

describe("server to client: what a client has not taken is bounded", () => {
  it("answers pipelined past the answer bound are cut with FATAL 54000 response_too_large together, not per cycle", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-pipeline"));
    boundsFor(tenant, { maxResponseBytes: 1_000_000 });
    const wire = await RawWire.connect(tenant.id, tenant.key);
    const { pid } = await ready(wire);
    // Each answer (400 kB) is within the bound; thirty of them pipelined are twelve times it.
    wire.send(concatBytes(Array.from({ length: 30 }, () => q("SELECT repeat('x', 400000)"))));
    const got = outcome(await wire.untilClosed());
    expect(got).toMatchObject({ error: { S: "FATAL", C: "54000", D: "response_too_large" } });
    expect(got.rowBytes).toBeLessThanOrEqual(1_000_000);
    await released(pid);
    expect(await leasesOf(tenant)).toBe(0);
  });

  it("a client that stops reading is ended with FATAL 54000 client_not_reading; its connection goes back first", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-stalled"));
    const settings = { wireBufferBytes: 128 * 1024, wireDrainMs: 1_000 };
    boundsFor(tenant, settings);
    const bounds = boundsOf(settings);
    const wire = await RawWire.connect(tenant.id, tenant.key);
    const { pid } = await ready(wire);
    wireEdgeHooksForTests.clientStopsReading = (candidate) => candidate === pid;
    // 3 MB in rows of 1 kB: frames end between rows, so the FATAL can follow the last one given.
    wire.send(q("SELECT repeat('z', 1000) FROM generate_series(1, 3000)"));
    // The condition: the edge holds a window it was not let hand on, the object the rest.
    const stalled = await pollUntil(
      async () => buffersOf(pid).now,
      (now) => (now.toClientObject ?? 0) > 0 && (now.toClientEdge ?? 0) > 0,
    );
    expect(stalled.toClientEdge ?? 0).toBeGreaterThan(0);
    expect(stalled.toClientObject ?? 0).toBeGreaterThan(0);
    // The server's answer was whole: the pool's connection went back while the client lagged.
    expect(await leasesOf(tenant)).toBe(0);
    const got = outcome(await wire.untilClosed());
    expect(got.error).toMatchObject({ S: "FATAL", C: "54000", D: "client_not_reading" });
    const peak = await released(pid);
    expect(peak.toClientEdge ?? 0).toBeLessThanOrEqual(bounds.downWindowBytes);
    expect(peak.toClientInFlight ?? 0).toBeLessThanOrEqual(bounds.downWindowBytes);
    expect(peak.toClientObject ?? 0).toBeLessThanOrEqual(3_100_000);
    // What the client got before the FATAL is whole rows, fewer than were answered.
    expect(got.rows).toBeLessThan(3000);
  });

  it("a client that leaves while answers wait for it leaves nothing behind", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-leaves"));
    boundsFor(tenant, { wireBufferBytes: 128 * 1024 });
    const wire = await RawWire.connect(tenant.id, tenant.key);
    const { pid } = await ready(wire);
    wireEdgeHooksForTests.clientStopsReading = (candidate) => candidate === pid;
    wire.send(q("SELECT repeat('w', 2000000)"));
    const stalled = await pollUntil(
      async () => buffersOf(pid).now,
      (now) => (now.toClientObject ?? 0) > 0,
    );
    expect(stalled.toClientObject ?? 0).toBeGreaterThan(0);
    wire.close();
    await released(pid);
    expect(await leasesOf(tenant)).toBe(0);
  });
});

describe("whichever side ends a connection, what it held is released", () => {
  it("its server connection ended under a running statement: the FATAL is passed on, nothing is left", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-server-ends"));
    const wire = await RawWire.connect(tenant.id, tenant.key);
    const { pid } = await ready(wire);
    wire.send(q("SELECT pg_sleep(30)"));
    expect(
      await pollUntil(
        () => sleeping(tenant),
        (busy) => busy,
      ),
    ).toBe(true);
    const terminated = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        `SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity
          WHERE usename = $1 AND state = 'active' AND query LIKE '%pg_sleep(30)%'`,
        [tenant.role],
      );
      return rows as { done: boolean }[];
    });
    expect(terminated).toEqual([{ done: true }]);
    const got = outcome(await wire.untilClosed());
    expect(got.error).toMatchObject({ S: "FATAL", C: "57P01" });
    await released(pid);
    expect(await leasesOf(tenant)).toBe(0);
  });
});

describe("reassembly: a message in 1-byte frames", () => {
  it("a short statement in 1-byte frames is served; an 8 KiB one is refused: FATAL 54000 frame_limit", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-frames"));
    const wire = await RawWire.connect(tenant.id, tenant.key);
    const { pid } = await ready(wire);
    for (const byte of q("SELECT 1")) wire.send(new Uint8Array([byte]));
    expect(typesOf(await wire.untilReady())).toBe("TDCZ");
    for (const byte of q(`SELECT 1 /* ${"x".repeat(8 * 1024)} */`)) wire.send(new Uint8Array([byte]));
    const got = outcome(await wire.untilClosed());
    expect(got).toMatchObject({ error: { S: "FATAL", C: "54000", D: "frame_limit" }, answered: 0 });
    await released(pid);
  });
});

describe("lifetime: a connection is told to reconnect between transactions", () => {
  it("past LESSOR_WIRE_MAX_LIFETIME_MS a Pool's idle connection ends with 57P01 wire_lifetime and the pool opens another", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-lifetime"));
    boundsFor(tenant, { wireMaxLifetimeMs: 500 });
    const pool = wirePool({ connectionString: tenant.connectionString, max: 1 });
    const errors: { code?: string; detail?: string }[] = [];
    pool.on("error", (error: Error & { code?: string; detail?: string }) => errors.push(error));
    const pids: number[] = [];
    pool.on("connect", (client: unknown) => pids.push((client as { processID: number }).processID));
    expect((await pool.query("SELECT 1 AS n")).rows).toEqual([{ n: 1 }]);
    const [firstPid = 0] = pids;
    const ended = await pollUntil(
      async () => buffersOf(firstPid),
      (counts) => counts.ended,
    );
    expect(ended.ended).toBe(true);
    expect(errors).toMatchObject([{ code: "57P01", detail: "wire_lifetime" }]);
    expect((await pool.query("SELECT 2 AS n")).rows).toEqual([{ n: 2 }]);
    expect(pids).toHaveLength(2);
    expect(pids[1]).not.toBe(firstPid);
    await pool.end();
  });

  it("node-postgres's own Pool over the driver's socket does the same: the idle client is dropped, the next query gets another", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-lifetime-pg"));
    boundsFor(tenant, { wireMaxLifetimeMs: 500 });
    const pool = new pg.Pool({
      connectionString: tenant.connectionString,
      max: 1,
      stream: () => Object.assign(new neonConfig(), wireSettings) as never,
    });
    const errors: { code?: string; detail?: string }[] = [];
    pool.on("error", (error: Error & { code?: string; detail?: string }) => errors.push(error));
    const pids: number[] = [];
    pool.on("connect", (client: unknown) => pids.push((client as { processID: number }).processID));
    expect((await pool.query("SELECT 1 AS n")).rows).toEqual([{ n: 1 }]);
    const [firstPid = 0] = pids;
    const ended = await pollUntil(
      async () => buffersOf(firstPid),
      (counts) => counts.ended,
    );
    expect(ended.ended).toBe(true);
    expect(errors).toMatchObject([{ code: "57P01", detail: "wire_lifetime" }]);
    expect((await pool.query("SELECT 2 AS n")).rows).toEqual([{ n: 2 }]);
    expect(pids).toHaveLength(2);
    await pool.end();
  });

  it("past LESSOR_WIRE_MAX_FRAMES (counted at the edge) the connection ends at its next boundary, not inside a transaction", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-frames-budget"));
    boundsFor(tenant, { wireMaxFrames: 10 });
    const wire = await RawWire.connect(tenant.id, tenant.key);
    const { pid } = await ready(wire);
    wire.send(q("BEGIN"));
    await wire.untilReady();
    // Past the frame budget inside the transaction: it goes on.
    for (let i = 0; i < 5; i++) {
      wire.send(q(`SELECT ${i}`));
      expect(typesOf(await wire.untilReady())).toBe("TDCZ");
    }
    wire.send(q("COMMIT"));
    const committed = await wire.untilReady();
    expect(typesOf(committed)).toBe("CZ");
    const got = outcome(await wire.untilClosed());
    expect(got.error).toMatchObject({ S: "FATAL", C: "57P01", D: "wire_lifetime" });
    await released(pid);
  });
});

describe("cancel requests", () => {
  /** Sends a CancelRequest from `source`; answers what came back before the socket closed. */
  async function cancelFrom(source: string, pid: number, secret: number): Promise<Message[]> {
    const wire = await RawWire.open({ "CF-Connecting-IP": source });
    wire.send(cancelRequest(pid, secret));
    return wire.untilClosed();
  }

  it("a key Lessor did not mint costs nothing: forged cancels are not even counted against their source", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-cancel-forged"));
    const sleeper = await RawWire.connect(tenant.id, tenant.key);
    const key = await ready(sleeper);
    sleeper.send(q("SELECT pg_sleep(20)"));
    expect(
      await pollUntil(
        () => sleeping(tenant),
        (busy) => busy,
      ),
    ).toBe(true);
    const source = "198.51.100.7";
    // More forged cancels than the source may send in a window; none of them reaches the registry.
    for (let i = 0; i < 30; i++) expect(await cancelFrom(source, key.pid, key.secret ^ (i + 1))).toEqual([]);
    expect(await sleeping(tenant)).toBe(true);
    expect(await cancelFrom(source, key.pid, key.secret)).toEqual([]);
    expect(errorOf(await sleeper.untilReady())).toMatchObject({ S: "ERROR", C: "57014" });
    sleeper.close();
  });

  it("cancels past the limit per source are refused with FATAL 53300 cancel_rate_limited, before any lookup", async () => {
    const ring = loadConfig(env).keyMacRing;
    const source = "198.51.100.8";
    const answers: Record<string, string>[] = [];
    // Keys Lessor could have minted, for connections that do not exist: each one is counted.
    for (let i = 0; i < 21; i++) {
      const key = await mintCancelKey(ring);
      answers.push(errorOf(await cancelFrom(source, key.pid, key.secret)));
    }
    expect(answers.slice(0, 20).every((fields) => Object.keys(fields).length === 0)).toBe(true);
    expect(answers[20]).toMatchObject({ S: "FATAL", C: "53300", D: "cancel_rate_limited" });
    // Another source is not affected.
    const key = await mintCancelKey(ring);
    expect(await cancelFrom("198.51.100.9", key.pid, key.secret)).toEqual([]);
  });

  it("cancels past the limit per target are refused, whatever source they come from", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-cancel-target"));
    const sleeper = await RawWire.connect(tenant.id, tenant.key);
    const key = await ready(sleeper);
    const answers: Record<string, string>[] = [];
    for (let i = 0; i < 5; i++)
      answers.push(errorOf(await cancelFrom(`203.0.113.${i}`, key.pid, key.secret)));
    expect(answers.slice(0, 4).every((fields) => Object.keys(fields).length === 0)).toBe(true);
    expect(answers[4]).toMatchObject({ S: "FATAL", C: "53300", D: "cancel_rate_limited" });
    sleeper.close();
  });
});
