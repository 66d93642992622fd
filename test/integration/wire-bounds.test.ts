/**
 * Every byte the wire relay holds for a connection is bounded, and every cost is linear in what the
 * client sends (issue 40). Each test makes the condition happen (a statement that sleeps while the
 * client floods, answers pipelined past the answer bound, a message in 1-byte frames), asserts it
 * happened, then asserts the outcome: the documented FATAL, or the client served.
 */
import { afterEach, describe, expect, it } from "vitest";
import type { LessorConfig } from "../../src/config/index.ts";
import { concatBytes, frontend, type Message, textMessage } from "../../src/core/pg-wire.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import { asSuperuser, type CreatedTenant, createTenant, pollUntil, uniqueTenantId } from "./harness.ts";
import { fieldsOf, RawWire, typesOf } from "./wire-client.ts";

afterEach(() => {
  tenantHooksForTests.config = undefined;
});

function boundsFor(tenant: CreatedTenant, settings: Partial<LessorConfig>): void {
  tenantHooksForTests.config = (id) => (id === tenant.id ? settings : undefined);
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

async function ready(wire: RawWire): Promise<void> {
  const greeting = await wire.untilReady();
  if (!greeting.some((message) => message.type === 0x4b)) {
    throw new Error(`no BackendKeyData in ${typesOf(greeting)}: ${JSON.stringify(errorOf(greeting))}`);
  }
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

describe("client to server: a flood behind a sleeping statement", () => {
  it("is ended with FATAL 54000 pipeline_limit; none of the flood reaches the server", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-flood"));
    const wire = await RawWire.connect(tenant.id, tenant.key);
    await ready(wire);
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
  });
});

describe("server to client: answers pipelined past the answer bound", () => {
  it("are cut with FATAL 54000 response_too_large once they pass it together, not per cycle", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-pipeline"));
    boundsFor(tenant, { maxResponseBytes: 1_000_000 });
    const wire = await RawWire.connect(tenant.id, tenant.key);
    await ready(wire);
    // Each answer (400 kB) is within the bound; thirty of them pipelined are twelve times it.
    wire.send(concatBytes(Array.from({ length: 30 }, () => q("SELECT repeat('x', 400000)"))));
    const got = outcome(await wire.untilClosed());
    expect(got).toMatchObject({ error: { S: "FATAL", C: "54000", D: "response_too_large" } });
    expect(got.rowBytes).toBeLessThanOrEqual(1_000_000);
  });
});

describe("reassembly: a message in 1-byte frames", () => {
  it("a short statement in 1-byte frames is served; an 8 KiB one is refused: FATAL 54000 frame_limit", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-frames"));
    const wire = await RawWire.connect(tenant.id, tenant.key);
    await ready(wire);
    for (const byte of q("SELECT 1")) wire.send(new Uint8Array([byte]));
    expect(typesOf(await wire.untilReady())).toBe("TDCZ");
    for (const byte of q(`SELECT 1 /* ${"x".repeat(8 * 1024)} */`)) wire.send(new Uint8Array([byte]));
    const got = outcome(await wire.untilClosed());
    expect(got).toMatchObject({ error: { S: "FATAL", C: "54000", D: "frame_limit" }, answered: 0 });
  });
});
