/**
 * The wire endpoint against hostile and careless clients (issue 29): the edge's key check (forged
 * keys cost nothing, refusals look alike, failures are rate-limited), protocol hygiene (SSL requests,
 * malformed, oversized and out-of-order messages, Terminate, vanishing clients, cancels scoped to
 * their sender, COPY within bounds), and the containment tests of `/sql` and session leases run
 * again through the wire: statement and answer bounds, prepared transactions, no state across
 * leases, lease lifetimes, stale generations, revoked keys, forced drains.
 *
 * Most of it speaks raw protocol bytes (`RawWire`), so nothing a driver does politely hides what
 * Lessor does. Bounds are made short per tenant (test-hooks.ts), never by waiting on a clock.
 */
import { env, listDurableObjectIds, runInDurableObject } from "cloudflare:test";
import { afterEach, describe, expect, it } from "vitest";
import type { LessorConfig } from "../../src/config/index.ts";
import {
  concatBytes,
  frontend,
  frontendMessage,
  type Message,
  startupMessage,
  textMessage,
} from "../../src/core/pg-wire.ts";
import { mintTenantKey } from "../../src/crypto/tenant-keys.ts";
import { connectionsOpened } from "../../src/postgres/index.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  mapConcurrent,
  pollUntil,
  runtimeOf,
  uniqueTenantId,
} from "./harness.ts";
import { fieldsOf, RawWire, typesOf, WireClient } from "./wire-client.ts";

afterEach(() => {
  tenantHooksForTests.config = undefined;
});

/** Gives one tenant's object settings of its own (shorter bounds), as other hostile tests do. */
function boundsFor(tenant: CreatedTenant, settings: Partial<LessorConfig>): void {
  tenantHooksForTests.config = (id) => (id === tenant.id ? settings : undefined);
}

const q = (sql: string) => textMessage(frontend.query, sql);

function errorOf(messages: readonly Message[]): Record<string, string> {
  return fieldsOf(messages.find((message) => message.type === 0x45));
}

/** Connects and waits for the greeting's ReadyForQuery; returns the cancel key it was given. */
async function ready(wire: RawWire): Promise<{ pid: number; secret: number; greeting: Message[] }> {
  const greeting = await wire.untilReady();
  const key = greeting.find((message) => message.type === 0x4b);
  if (!key)
    throw new Error(`no BackendKeyData in ${typesOf(greeting)}: ${JSON.stringify(errorOf(greeting))}`);
  const view = new DataView(key.body.buffer, key.body.byteOffset, key.body.byteLength);
  return { pid: view.getInt32(0), secret: view.getInt32(4), greeting };
}

async function leasesOf(tenant: CreatedTenant): Promise<number> {
  return (
    await pollUntil(
      () => runtimeOf(tenant.id),
      (r) => r.leases === 0,
    )
  ).leases;
}

/** The tenant's backends as Postgres sees them. */
async function backendsOf(
  tenant: CreatedTenant,
): Promise<{ pid: number; state: string; query: string; xact: boolean }[]> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      `SELECT pid, state, query, xact_start IS NOT NULL AS xact FROM pg_stat_activity
        WHERE usename = $1 AND application_name LIKE 'lessor:%' ORDER BY pid`,
      [tenant.role],
    );
    return rows as { pid: number; state: string; query: string; xact: boolean }[];
  });
}

async function objectIds(): Promise<Set<string>> {
  return new Set((await listDurableObjectIds(env.TENANTS)).map((id) => id.toString()));
}

async function forgedKey(tenantId: string): Promise<string> {
  const stranger = {
    current: 1,
    keys: new Map([[1, btoa(String.fromCharCode(...new Uint8Array(32).fill(77)))]]),
  };
  return (await mintTenantKey(stranger, tenantId)).key;
}

// ── The edge ────────────────────────────────────────────────────────────────────────────────────

describe("the key is checked at the edge, as on /sql", () => {
  it("forged keys reach no object and open no connection; every refusal is the same FATAL 28P01", async () => {
    const real = await createTenant(uniqueTenantId("wire-forged"));
    const before = await objectIds();
    const opened = connectionsOpened();
    const attempts = await Promise.all(
      Array.from({ length: 60 }, async (_, i) => {
        const id = uniqueTenantId(`wforged${i % 5}`);
        const key = i % 3 === 0 ? await forgedKey(id) : i % 3 === 1 ? `lsk_${"A".repeat(64)}` : "hunter2";
        return { user: id, key };
      }),
    );
    const answers = await mapConcurrent(attempts, 20, async ({ user, key }) => {
      const wire = await RawWire.connect(user, key);
      return wire.untilClosed();
    });
    const after = await objectIds();
    expect([...after].filter((id) => !before.has(id))).toEqual([]);
    expect(connectionsOpened()).toEqual(opened);
    // A real tenant's wrong key (MAC-valid for another tenant), and a key it no longer has: the same bytes.
    const other = await createTenant(uniqueTenantId("wire-other"));
    const wrongTenant = await (await RawWire.connect(real.id, other.key)).untilClosed();
    const forgedForReal = await (await RawWire.connect(real.id, await forgedKey(real.id))).untilClosed();
    const refusals = [...answers, wrongTenant, forgedForReal].map((messages) =>
      messages.filter((m) => m.type === 0x45).map((m) => [...m.bytes].join(",")),
    );
    expect(new Set(refusals.map((r) => r.join("|"))).size).toBe(1);
    expect(errorOf(wrongTenant)).toMatchObject({
      S: "FATAL",
      C: "28P01",
      M: "password authentication failed",
    });
    // Every answer asked for the password in cleartext first, as Neon's proxy does over TLS.
    expect(typesOf(wrongTenant)).toBe("RE");
  });

  it("failed logins count toward the tenant's rate limit; the right key is never locked out", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-breaker"));
    const wrong = await forgedKey(tenant.id);
    let limited: Record<string, string> | null = null;
    for (let i = 0; i < 45 && limited === null; i++) {
      const error = errorOf(await (await RawWire.connect(tenant.id, wrong)).untilClosed());
      if (error.C !== "28P01") limited = error;
    }
    expect(limited).toMatchObject({ S: "FATAL", C: "53300", D: "authentication_rate_limited" });
    const right = await RawWire.connect(tenant.id, tenant.key);
    await ready(right);
    right.close();
  });

  it("a user naming another tenant's database, an end-user key, a startup setting: refused clearly", async () => {
    const a = await createTenant(uniqueTenantId("wire-a"));
    const b = await createTenant(uniqueTenantId("wire-b"));
    const crossing = await RawWire.open();
    crossing.send(
      concatBytes([startupMessage({ user: a.id, database: b.id }), textMessage(frontend.password, a.key)]),
    );
    expect(errorOf(await crossing.untilClosed())).toMatchObject({ C: "28P01" });

    const minted = await admin(`/v1/tenants/${a.id}/keys`, { method: "POST", json: { scope: "jwt" } });
    const { key } = await minted.json<{ key: string }>();
    expect(errorOf(await (await RawWire.connect(a.id, key)).untilClosed())).toMatchObject({
      S: "FATAL",
      C: "28000",
      D: "key_scope_refused",
    });

    const setting = await RawWire.connect(a.id, a.key, { options: "-c search_path=evil" });
    expect(errorOf(await setting.untilClosed())).toMatchObject({ S: "FATAL", C: "0A000" });
  });
});

// ── Protocol hygiene ────────────────────────────────────────────────────────────────────────────

describe("protocol hygiene", () => {
  it("an SSLRequest is answered N (the WebSocket is the TLS); startup, password and a query pipelined in one frame work", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-ssl"));
    const wire = await RawWire.open();
    expect(await wire.sslRequest()).toBe("N");
    wire.send(
      concatBytes([
        startupMessage({ user: tenant.id, database: tenant.id, application_name: "raw" }),
        textMessage(frontend.password, tenant.key),
        q("SELECT 40 + 2"),
      ]),
    );
    const greeting = await ready(wire);
    expect(typesOf(greeting.greeting)).toMatch(/^R?RS+KZ$/);
    const result = await wire.untilReady();
    expect(typesOf(result)).toBe("TDCZ");
    wire.close();
  });

  it("a version Lessor does not speak, a malformed length and a text frame each end in FATAL", async () => {
    const old = await RawWire.open();
    old.send(new Uint8Array([0, 0, 0, 8, 0, 2, 0, 0]));
    expect(errorOf(await old.untilClosed())).toMatchObject({ S: "FATAL", C: "0A000" });
    const malformed = await RawWire.open();
    malformed.send(new Uint8Array([0, 0, 0, 2]));
    expect(errorOf(await malformed.untilClosed())).toMatchObject({ S: "FATAL", C: "08P01" });
    const text = await RawWire.open();
    (text as unknown as { socket: WebSocket }).socket.send("SELECT 1");
    expect(errorOf(await text.untilClosed())).toMatchObject({ S: "FATAL", C: "08P01" });
  });

  it("out-of-order and unknown messages after startup: FATAL 08P01, and the lease goes back", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-order"));
    for (const bad of [
      textMessage(frontend.password, tenant.key),
      frontendMessage(0x7a, new Uint8Array(3)),
    ]) {
      const wire = await RawWire.connect(tenant.id, tenant.key);
      await ready(wire);
      wire.send(concatBytes([q("BEGIN"), bad]));
      const messages = await wire.untilClosed();
      expect(errorOf(messages)).toMatchObject({ S: "FATAL", C: "08P01", D: "protocol_violation" });
    }
    expect(await leasesOf(tenant)).toBe(0);
  });

  it("a message past LESSOR_MAX_BODY_BYTES is refused before it is read: FATAL 54000", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-big"));
    boundsFor(tenant, { maxBodyBytes: 4096 });
    const wire = await RawWire.connect(tenant.id, tenant.key);
    await ready(wire);
    // The header alone announces 1 GB: nothing of it is buffered.
    wire.send(new Uint8Array([frontend.query, 0x40, 0, 0, 0]));
    expect(errorOf(await wire.untilClosed())).toMatchObject({
      S: "FATAL",
      C: "54000",
      D: "payload_too_large",
    });
    expect(await leasesOf(tenant)).toBe(0);
  });

  it("Terminate or a vanishing client mid-transaction: rolled back, the connection reset and returned", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-vanish"));
    for (const leave of ["terminate", "vanish"] as const) {
      const wire = await RawWire.connect(tenant.id, tenant.key);
      await ready(wire);
      wire.send(concatBytes([q("BEGIN"), q(`INSERT INTO notes (body) VALUES ('${leave}')`)]));
      await wire.untilReady();
      await wire.untilReady();
      if (leave === "terminate") wire.send(frontendMessage(frontend.terminate, new Uint8Array(0)));
      else wire.close();
      await wire.untilClosed();
    }
    expect(await leasesOf(tenant)).toBe(0);
    const backends = await pollUntil(
      () => backendsOf(tenant),
      (rows) => rows.every((r) => !r.xact),
    );
    expect(backends.every((row) => !row.xact)).toBe(true);
    expect(
      await asSuperuser(
        async (c) => (await c.query("SELECT count(*)::int AS n FROM notes")).rows,
        tenant.database,
      ),
    ).toEqual([{ n: 0 }]);
  });

  it("a client that vanishes mid-statement: the statement is cancelled and its connection never reused", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-vanish-busy"));
    const wire = await RawWire.connect(tenant.id, tenant.key);
    await ready(wire);
    wire.send(q("SELECT pg_sleep(30)"));
    const busy = await pollUntil(
      () => backendsOf(tenant),
      (rows) => rows.some((r) => r.query.includes("pg_sleep")),
    );
    const sleeper = busy.find((row) => row.query.includes("pg_sleep"));
    expect(sleeper).toBeDefined();
    wire.close();
    const after = await pollUntil(
      () => backendsOf(tenant),
      (rows) => !rows.some((r) => r.pid === sleeper?.pid),
    );
    expect(after.map((row) => row.pid)).not.toContain(sleeper?.pid);
    expect(await leasesOf(tenant)).toBe(0);
  });

  it("a CancelRequest cancels only its sender's statement: a wrong secret or another's key does nothing", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-cancel"));
    const other = await createTenant(uniqueTenantId("wire-cancel-other"));
    const sleeper = await RawWire.connect(tenant.id, tenant.key);
    const key = await ready(sleeper);
    const bystander = await RawWire.connect(other.id, other.key);
    const otherKey = await ready(bystander);
    sleeper.send(q("SELECT pg_sleep(20)"));
    bystander.send(q("SELECT pg_sleep(0.5), 'bystander done'"));
    await pollUntil(
      () => backendsOf(tenant),
      (rows) => rows.some((r) => r.query.includes("pg_sleep(20)")),
    );
    // The bystander's own key aimed at the sleeper, and the sleeper's pid with a wrong secret.
    await RawWire.cancel(key.pid, key.secret ^ 1);
    await RawWire.cancel(otherKey.pid, key.secret);
    expect(typesOf(await bystander.untilReady())).toBe("TDCZ");
    expect(
      (await backendsOf(tenant)).some((r) => r.query.includes("pg_sleep(20)") && r.state === "active"),
    ).toBe(true);
    // The sleeper's own key.
    await RawWire.cancel(key.pid, key.secret);
    const cancelled = await sleeper.untilReady();
    expect(errorOf(cancelled)).toMatchObject({ S: "ERROR", C: "57014" });
    // The connection goes on (transaction mode: the next statement gets another connection).
    sleeper.send(q("SELECT 1"));
    expect(typesOf(await sleeper.untilReady())).toBe("TDCZ");
    sleeper.close();
    bystander.close();
    expect(await leasesOf(tenant)).toBe(0);
  });

  it("COPY works both ways within the bounds; COPY FROM STDIN past LESSOR_MAX_BODY_BYTES is refused and commits nothing", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-copy"));
    const wire = await RawWire.connect(tenant.id, tenant.key);
    await ready(wire);
    wire.send(q("COPY (SELECT generate_series(1, 3)) TO STDOUT"));
    expect(typesOf(await wire.untilReady())).toBe("HdddcCZ");
    wire.send(q("COPY notes (body) FROM STDIN"));
    expect(typesOf(await wire.until((m) => m.type === 0x47))).toBe("G");
    wire.send(
      concatBytes([
        frontendMessage(frontend.copyData, new TextEncoder().encode("one\ntwo\n")),
        frontendMessage(frontend.copyDone, new Uint8Array(0)),
      ]),
    );
    expect(typesOf(await wire.untilReady())).toBe("CZ");
    wire.close();

    boundsFor(tenant, { maxBodyBytes: 4096 });
    const big = await RawWire.connect(tenant.id, tenant.key);
    await ready(big);
    big.send(q("COPY notes (body) FROM STDIN"));
    await big.until((m) => m.type === 0x47);
    const line = new TextEncoder().encode(`${"x".repeat(999)}\n`);
    big.send(concatBytes(Array.from({ length: 6 }, () => frontendMessage(frontend.copyData, line))));
    expect(errorOf(await big.untilClosed())).toMatchObject({
      S: "FATAL",
      C: "54000",
      D: "payload_too_large",
    });
    expect(await leasesOf(tenant)).toBe(0);
    const bodies = await asSuperuser(
      async (c) => (await c.query("SELECT body FROM notes ORDER BY id")).rows,
      tenant.database,
    );
    expect(bodies).toEqual([{ body: "one" }, { body: "two" }]);
  });
});

// ── Containment, through the wire ───────────────────────────────────────────────────────────────

describe("containment through the wire", () => {
  it("a statement past LESSOR_STATEMENT_TIMEOUT_MS is stopped: FATAL 57014, its backend ended", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-timeout"));
    boundsFor(tenant, { statementTimeoutMs: 1_000 });
    const client = new WireClient(tenant.connectionString);
    client.on("error", () => undefined);
    await client.connect();
    await client.query("CREATE TABLE t (x int)");
    // A handler that catches the cancel: only the cut and the admin's terminate stop it.
    await client.query(`CREATE FUNCTION stubborn() RETURNS void LANGUAGE plpgsql AS $$
      BEGIN LOOP BEGIN PERFORM pg_sleep(0.2); EXCEPTION WHEN query_canceled THEN NULL; END; END LOOP; END $$`);
    const refused = await client.query("SELECT stubborn()").catch((error: unknown) => error);
    expect(refused).toMatchObject({ code: "57014", detail: "statement_timeout", severity: "FATAL" });
    const gone = await pollUntil(
      () => backendsOf(tenant),
      (rows) => !rows.some((r) => r.query.includes("stubborn")),
    );
    expect(gone.some((r) => r.query.includes("stubborn"))).toBe(false);
    expect(await leasesOf(tenant)).toBe(0);
  });

  it("an answer past LESSOR_MAX_RESPONSE_BYTES is cut with FATAL 54000; the next client is served", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-large"));
    boundsFor(tenant, { maxResponseBytes: 100_000 });
    const client = new WireClient(tenant.connectionString);
    client.on("error", () => undefined);
    await client.connect();
    const refused = await client
      .query("SELECT repeat('x', 1000) FROM generate_series(1, 1000)")
      .catch((error: unknown) => error);
    expect(refused).toMatchObject({ code: "54000", detail: "response_too_large" });
    expect(await leasesOf(tenant)).toBe(0);
    const next = new WireClient(tenant.connectionString);
    await next.connect();
    expect((await next.query("SELECT repeat('x', 1000) FROM generate_series(1, 10)")).rowCount).toBe(10);
    await next.end();
  });

  it("PREPARE TRANSACTION is rolled back and refused: FATAL 0A000, nothing prepared, nothing committed", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-2pc"));
    const wire = await RawWire.connect(tenant.id, tenant.key);
    await ready(wire);
    wire.send(
      concatBytes([
        q("BEGIN"),
        q("INSERT INTO notes (body) VALUES ('prepared')"),
        q("PREPARE TRANSACTION 'wire-gid'"),
      ]),
    );
    const messages = await wire.untilClosed();
    expect(errorOf(messages)).toMatchObject({ S: "FATAL", C: "0A000", D: "prepared_transaction_refused" });
    // What the client saw never includes the server's PREPARE TRANSACTION tag.
    expect(
      messages.filter((m) => m.type === 0x43).map((m) => new TextDecoder().decode(m.body)),
    ).not.toContain("PREPARE TRANSACTION\0");
    const prepared = await pollUntil(
      () => asSuperuser(async (c) => (await c.query("SELECT gid FROM pg_prepared_xacts")).rows),
      (rows) => rows.length === 0,
    );
    expect(prepared).toEqual([]);
    expect(
      await asSuperuser(
        async (c) => (await c.query("SELECT count(*)::int AS n FROM notes")).rows,
        tenant.database,
      ),
    ).toEqual([{ n: 0 }]);
    expect(await leasesOf(tenant)).toBe(0);
  });

  it("no state passes between transactions, however it was set (set_config inside a function)", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-state"));
    const pool = new WireClient(tenant.connectionString);
    await pool.connect();
    await pool.query(`CREATE FUNCTION plant() RETURNS text LANGUAGE sql AS
      $$ SELECT set_config('search_path', 'planted', false) || set_config('app.user_id', 'mallory', false) $$`);
    await pool.query("SELECT plant()");
    const { rows } = await pool.query(
      "SELECT current_setting('search_path') AS path, current_setting('app.user_id', true) AS user_id",
    );
    // A placeholder's name outlives RESET ALL on the backend that saw it ('' there), not its value.
    expect(rows).toEqual([{ path: '"$user", public', user_id: expect.toBeOneOf(["", null]) }]);
    await pool.end();
  });

  it("a session past LESSOR_LEASE_MAX_LIFETIME_MS, and a transaction idle past LESSOR_LEASE_MAX_TTL_MS, end: 57P05, rolled back", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-lifetime"));
    boundsFor(tenant, { leaseMaxLifetimeMs: 1_500 });
    const session = await RawWire.connect(tenant.id, tenant.key, { options: "-c lessor.pool_mode=session" });
    await ready(session);
    // Kept busy with statements: renewing does not extend a lifetime.
    let lifetime: Message[] = [];
    for (let i = 0; i < 40 && !session.closed; i++) {
      session.send(q("SELECT pg_sleep(0.1)"));
      lifetime = await session.untilReady();
    }
    lifetime.push(...(await session.untilClosed()));
    expect(errorOf(lifetime)).toMatchObject({ S: "FATAL", C: "57P05", D: "lease_expired" });

    boundsFor(tenant, { leaseMaxTtlMs: 1_000 });
    const idle = await RawWire.connect(tenant.id, tenant.key);
    await ready(idle);
    idle.send(concatBytes([q("BEGIN"), q("INSERT INTO notes (body) VALUES ('idle')")]));
    await idle.untilReady();
    await idle.untilReady();
    expect(errorOf(await idle.untilClosed())).toMatchObject({ S: "FATAL", C: "57P05", D: "lease_expired" });
    expect(await leasesOf(tenant)).toBe(0);
    expect(
      await asSuperuser(
        async (c) => (await c.query("SELECT count(*)::int AS n FROM notes")).rows,
        tenant.database,
      ),
    ).toEqual([{ n: 0 }]);
  });

  it("an object restart ends a session with a clean FATAL 57P01 (stale generation); a new connection gets the new generation", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-stale"));
    const session = await RawWire.connect(tenant.id, tenant.key, { options: "-c lessor.pool_mode=session" });
    await ready(session);
    session.send(q("SELECT 1"));
    await session.untilReady();
    const before = (await runtimeOf(tenant.id)).generation;
    const outcome = await runInDurableObject(env.TENANTS.getByName(tenant.id), (_instance, state) => {
      state.abort("test: object reset");
    }).then(
      () => "not reset",
      (error: unknown) => String(error),
    );
    expect(outcome).toMatch(/object reset/);
    expect(errorOf(await session.untilClosed())).toMatchObject({
      S: "FATAL",
      C: "57P01",
      D: "stale_generation",
    });
    const next = new WireClient(tenant.connectionString);
    await next.connect();
    expect((await next.query("SELECT 1 AS n")).rows).toEqual([{ n: 1 }]);
    await next.end();
    expect((await runtimeOf(tenant.id)).generation).toBeGreaterThan(before);
  });

  it("revoking the key ends its wire connections at once; a forced drain ends session-mode ones", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-revoke"));
    const minted = await (await admin(`/v1/tenants/${tenant.id}/keys`, { method: "POST", json: {} })).json<{
      key: string;
      keyId: string;
    }>();
    const held = await RawWire.connect(tenant.id, minted.key);
    await ready(held);
    const revoked = await admin(`/v1/tenants/${tenant.id}/keys/${minted.keyId}`, { method: "DELETE" });
    expect(revoked.status).toBe(204);
    expect(errorOf(await held.untilClosed())).toMatchObject({ S: "FATAL", C: "28000", D: "key_revoked" });

    const session = await RawWire.connect(tenant.id, tenant.key, { options: "-c lessor.pool_mode=session" });
    await ready(session);
    session.send(concatBytes([q("BEGIN"), q("INSERT INTO notes (body) VALUES ('drained')")]));
    await session.untilReady();
    await session.untilReady();
    const drained = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: { force: true } });
    expect(drained.status).toBe(202);
    expect(errorOf(await session.untilClosed())).toMatchObject({
      S: "FATAL",
      C: "57P01",
      D: "stale_generation",
    });
    expect(
      (
        await pollUntil(
          () => runtimeOf(tenant.id),
          (r) => r.state === "stopped",
        )
      ).state,
    ).toBe("stopped");
    expect(
      await asSuperuser(
        async (c) => (await c.query("SELECT count(*)::int AS n FROM notes")).rows,
        tenant.database,
      ),
    ).toEqual([{ n: 0 }]);
  });
});
