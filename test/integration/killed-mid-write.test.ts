/**
 * The object killed mid-write (issue 18): the TenantObject dies (a deploy, a crash: `ctx.abort()`)
 * while a session lease holds an open transaction with an insert, or while a long write runs on
 * `/sql`. Afterwards the row is gone, no backend of the dead generation is left idle in a
 * transaction, no write of the dead generation commits after the new one has started, and the next
 * request works on a new generation. An alarm killed half way, or run twice, changes nothing.
 *
 * workerd tears a killed object's sockets down, and Postgres ends a backend whose client went away
 * within a second (`client_connection_check_interval`), so a write on the object's own connection
 * dies whether or not Lessor fences. The fence is for a backend that outlives its object (a host
 * that never saw the socket close): the fencing test opens one from outside the object.
 */
import { runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterEach, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import { unseal } from "../../src/crypto/seal.ts";
import { withTenantConnection } from "../../src/postgres/index.ts";
import { tenantCredential } from "../../src/tenant-db/connect.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  eventsOf,
  type LifecycleEvent,
  lessor,
  pollUntil,
  runtimeOf,
  sqlFor,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

/** Resets the object with its pool live, as a deploy or a crash does. */
async function killObject(tenant: CreatedTenant): Promise<void> {
  const outcome = await runInDurableObject(env.TENANTS.getByName(tenant.id), (_instance, state) => {
    state.abort("test: object killed mid-write");
  }).then(
    () => "not killed",
    (error: unknown) => String(error),
  );
  expect(outcome).toMatch(/killed mid-write/);
}

interface Backend {
  app: string;
  state: string;
  query: string;
  waitEventType: string;
}

/** The tenant role's backends on the host, by application name and state. */
function backendsOf(tenant: CreatedTenant): Promise<Backend[]> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      `SELECT application_name AS app, coalesce(state, '') AS state, query,
              coalesce(wait_event_type, '') AS "waitEventType"
         FROM pg_stat_activity WHERE usename = $1`,
      [tenant.role],
    );
    return rows as Backend[];
  });
}

function notesCount(tenant: CreatedTenant, body: string): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT count(*)::int AS n FROM notes WHERE body = $1", [body]);
    return Number(rows[0]?.n ?? 0);
  }, tenant.database);
}

const generation = (tenant: CreatedTenant, n: number) => `lessor:${tenant.role}:${n}`;

/** The tenant's usage as the control plane holds it. */
async function usageOf(tenant: CreatedTenant): Promise<Record<string, number>> {
  const response = await admin(`/v1/tenants/${tenant.id}/usage`);
  expect(response.status).toBe(200);
  return (await response.json<{ usage: Record<string, number> }>()).usage;
}

/** The tenant's lifecycle events as the control plane holds them, in order. */
function controlPlaneEvents(tenant: CreatedTenant): Promise<LifecycleEvent[]> {
  return eventsOf(tenant.id);
}

/**
 * A backend of the tenant's role opened from this test, not from the object, the way Lessor opens
 * its pooled connections (sealed password, login token), under `applicationName`, with no
 * statement timeout. `outcome` is "committed", or the error that ended the statement.
 */
async function orphanBackend(
  tenant: CreatedTenant,
  applicationName: string,
  query: string,
): Promise<{ outcome: Promise<"committed" | { code: unknown; message: string }> }> {
  const config = loadConfig(env);
  const sealed = await asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT sealed_password FROM tenant_credentials WHERE tenant_id = $1",
      [tenant.id],
    );
    return String(rows[0]?.sealed_password);
  }, "lessor");
  const host = (await (await admin(`/v1/tenants/${tenant.id}`)).json<{ tenant: { host: string } }>()).tenant
    .host;
  const credential = await tenantCredential(
    config,
    { host, roleName: tenant.role, databaseName: tenant.database },
    await unseal(env.LESSOR_SEAL_KEY, tenant.id, sealed),
  );
  const outcome = withTenantConnection(
    config,
    credential.target,
    {
      applicationName,
      limits: { statementTimeoutMs: 0, lockTimeoutMs: 0, idleInTransactionMs: 0 },
      loginToken: credential.loginToken,
    },
    (client) => client.query(query),
  ).then(
    () => "committed" as const,
    (error: unknown) => ({
      code: (error as { code?: unknown }).code,
      message: error instanceof Error ? error.message : String(error),
    }),
  );
  return { outcome };
}

/** The advisory lock a test's statement waits on in the tenant's database (no other code takes it). */
const writeLockKey = 7_310_442;

/**
 * Runs `work` while this test holds `writeLockKey` in the tenant's database, behind Lessor: a
 * statement that takes the lock after its insert cannot commit until the test lets it, however
 * long the test's own steps take.
 */
function holdingWriteLock<T>(tenant: CreatedTenant, work: () => Promise<T>): Promise<T> {
  return asSuperuser(async (lock) => {
    await lock.query("SELECT pg_catalog.pg_advisory_lock($1)", [writeLockKey]);
    try {
      return await work();
    } finally {
      await lock.query("SELECT pg_catalog.pg_advisory_unlock($1)", [writeLockKey]).catch(() => undefined);
    }
  }, tenant.database);
}

/**
 * The tenant's pool starts with Postgres's own limits and the statement bound far past the test
 * (test-only setting, read at each use): what ends its statement is the kill, never a timeout that
 * a slow step of the test let run out.
 */
function withoutStatementBound(tenant: CreatedTenant): void {
  tenantHooksForTests.config = (id) => (id === tenant.id ? { statementTimeoutMs: 600_000 } : undefined);
}

/** Whether a statement of the tenant's role containing `marker` waits on the test's lock. */
async function waitsOnLock(tenant: CreatedTenant, marker: string): Promise<boolean> {
  return (await backendsOf(tenant)).some(
    (b) => b.state === "active" && b.waitEventType === "Lock" && b.query.includes(marker),
  );
}

describe("the object killed mid-write", () => {
  afterEach(() => {
    tenantHooksForTests.config = undefined;
  });

  it("a session lease's open transaction with an insert: the row is gone, nothing is left idle in transaction", async () => {
    const tenant = await createTenant(uniqueTenantId("kill-tx"), { tier: "free" });
    const opened = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: JSON.stringify({ ttlMs: 60_000 }),
    });
    expect(opened.status).toBe(201);
    const { lease } = await opened.json<{ lease: string }>();
    const run = (query: string) =>
      lessor(`/v1/leases/${lease}/sql`, {
        method: "POST",
        headers: { Authorization: `Bearer ${tenant.key}` },
        body: JSON.stringify({ query }),
      });
    expect((await run("BEGIN")).status).toBe(200);
    expect((await run("INSERT INTO notes (body) VALUES ('in-flight')")).status).toBe(200);
    const before = await backendsOf(tenant);
    expect(before).toContainEqual(
      expect.objectContaining({ app: generation(tenant, 1), state: "idle in transaction" }),
    );

    await killObject(tenant);

    // Without any further request, the dead generation's transaction does not linger.
    const lingering = await pollUntil(
      async () => (await backendsOf(tenant)).filter((b) => b.app === generation(tenant, 1)),
      (backends) => backends.every((b) => !b.state.startsWith("idle in transaction")),
      { attempts: 40, intervalMs: 250 },
    );
    expect(lingering.filter((b) => b.state.startsWith("idle in transaction"))).toEqual([]);
    expect(await notesCount(tenant, "in-flight")).toBe(0);

    // The next request works on a new generation; the old lease is stale, and never runs there.
    expect(await sqlFor(tenant)`SELECT current_setting('application_name') AS app`).toEqual([
      { app: generation(tenant, 2) },
    ]);
    const stale = await run("COMMIT");
    expect(stale.status).toBe(409);
    expect(await notesCount(tenant, "in-flight")).toBe(0);
    const left = await pollUntil(
      async () => (await backendsOf(tenant)).filter((b) => b.app === generation(tenant, 1)),
      (backends) => backends.length === 0,
    );
    expect(left).toEqual([]);
  });

  it("a long write on /sql: the killed request fails and its write never commits", async () => {
    const tenant = await createTenant(uniqueTenantId("kill-write"), { tier: "free" });
    withoutStatementBound(tenant);
    await sqlFor(tenant)`SELECT 1`;
    await holdingWriteLock(tenant, async () => {
      // One statement that inserts, then waits for the test's lock before it can commit.
      const write = sqlRequest(tenant.connectionString, {
        query: `WITH ins AS (INSERT INTO notes (body) VALUES ('long-write') RETURNING 1) SELECT pg_catalog.pg_advisory_xact_lock(${writeLockKey}) FROM ins`,
        params: [],
      }).then(
        (response) => response.status,
        () => 0,
      );
      const running = await pollUntil(
        () => waitsOnLock(tenant, "long-write"),
        (found) => found,
        { attempts: 200, intervalMs: 50 },
      );
      expect(running).toBe(true);

      await killObject(tenant);
      expect(await sqlFor(tenant)`SELECT current_setting('application_name') AS app`).toEqual([
        { app: generation(tenant, 2) },
      ]);
      // The killed request ends (whatever it answers, it is not a success), and the dead
      // generation's backends go, before the lock does: the write died with them.
      expect(await write).not.toBe(200);
      const old = await pollUntil(
        async () => (await backendsOf(tenant)).filter((b) => b.app === generation(tenant, 1)),
        (backends) => backends.length === 0,
      );
      expect(old).toEqual([]);
    });
    expect(await notesCount(tenant, "long-write")).toBe(0);
  });

  it("a dead generation's backend that outlives its object is fenced by the next start: it ends, its insert never commits, the fence is recorded", async () => {
    const tenant = await createTenant(uniqueTenantId("kill-fence"), { tier: "free" });
    expect(await sqlFor(tenant)`SELECT current_setting('application_name') AS app`).toEqual([
      { app: generation(tenant, 1) },
    ]);
    // Generation 1's backend that workerd cannot end with the object: opened from outside it (this
    // test's own connection, under generation 1's name and the tenant's role), with no statement
    // timeout, running an insert that commits only once the test lets go of a lock. Its client
    // never goes away, so nothing but a fence ends it.
    await holdingWriteLock(tenant, async () => {
      // Its insert then waits for the test's lock: it commits only if nothing ends it first.
      const orphan = await orphanBackend(
        tenant,
        generation(tenant, 1),
        `WITH ins AS (INSERT INTO notes (body) VALUES ('orphan-write') RETURNING 1) SELECT pg_catalog.pg_advisory_xact_lock(${writeLockKey}) FROM ins`,
      );
      const running = await pollUntil(
        () => waitsOnLock(tenant, "orphan-write"),
        (found) => found,
        { attempts: 200, intervalMs: 50 },
      );
      expect(running).toBe(true);

      await killObject(tenant);
      // The next start fences before it serves: by the time generation 2 answers, the orphan is gone.
      expect(await sqlFor(tenant)`SELECT current_setting('application_name') AS app`).toEqual([
        { app: generation(tenant, 2) },
      ]);
      expect(await orphan.outcome).toMatchObject({ code: "57P01" });
      expect((await backendsOf(tenant)).filter((b) => b.app === generation(tenant, 1))).toEqual([]);
    });
    expect(await notesCount(tenant, "orphan-write")).toBe(0);
    const events = await pollUntil(
      () => eventsOf(tenant.id),
      (list) => list.some((e) => e.reason.startsWith("fenced:")),
    );
    expect(events.filter((e) => e.reason.startsWith("fenced:"))).toEqual([
      expect.objectContaining({ generation: 2, reason: "fenced: 1 backend(s) of the dead generation ended" }),
    ]);
  });

  for (const at of ["events_appended", "appended"] as const) {
    it(`an alarm killed mid-flush (after ${at}), then run twice: usage and events land exactly once`, async () => {
      const tenant = await createTenant(uniqueTenantId("kill-alarm"), { tier: "free" });
      const sql = sqlFor(tenant);
      await sql`INSERT INTO notes (body) VALUES ('kept')`;
      await sql`SELECT g FROM generate_series(1, 3) g`;
      // A stub breaks with the object it reached: each call takes a new one.
      const stub = () => env.TENANTS.getByName(tenant.id);
      // The heartbeat's flush dies after its step: the events are in the control plane (and, after
      // "appended", the usage too), and the object has forgotten none of them.
      const reached: string[] = [];
      tenantHooksForTests.onFlushStep = (event) => {
        if (event.tenantId !== tenant.id) return;
        reached.push(event.step);
        if (event.step !== at) return;
        event.abortObject(`test: alarm killed mid-flush after ${at}`);
        return new Promise<void>(() => undefined);
      };
      let killed: string;
      try {
        killed = await runDurableObjectAlarm(stub()).then(
          (ran) => `returned ${ran}`,
          (error: unknown) => String(error),
        );
      } finally {
        tenantHooksForTests.onFlushStep = undefined;
      }
      expect(killed).toMatch(`killed mid-flush after ${at}`);
      expect(reached).toEqual(at === "appended" ? ["events_appended", "appended"] : ["events_appended"]);

      // The restarted object armed its alarm for what it still holds; that run flushes it, and two
      // more add nothing.
      expect(await runDurableObjectAlarm(stub())).toBe(true);
      const landed = { usage: await usageOf(tenant), events: await controlPlaneEvents(tenant) };
      expect(landed.usage).toMatchObject({ queries: 2, rowsReturned: 3, poolStarts: 1, errors: 0 });
      const key = (e: LifecycleEvent) => `${e.generation} ${e.from}→${e.to} ${e.reason}`;
      // Each once: the start the dead instance had already handed over, the ready it was flushing,
      // and its death, which the next instance recorded.
      expect(landed.events.map(key)).toEqual([
        "1 stopped→starting demand",
        "1 starting→ready pool_ready",
        "1 ready→stopped object_restarted",
      ]);
      for (let run = 0; run < 2; run++) expect(typeof (await runDurableObjectAlarm(stub()))).toBe("boolean");
      expect({ usage: await usageOf(tenant), events: await controlPlaneEvents(tenant) }).toEqual(landed);

      expect((await runtimeOf(tenant.id)).leases).toBe(0);
      expect(await sql`SELECT body FROM notes ORDER BY id`).toEqual([{ body: "kept" }]);
      expect(await sql`SELECT current_setting('application_name') AS app`).toEqual([
        { app: generation(tenant, 2) },
      ]);
    });
  }

  it("events the control plane already holds under the object's next numbers (sent, then lost with a killed instance) do not swallow the next ones", async () => {
    const tenant = await createTenant(uniqueTenantId("kill-seq"), { tier: "free" });
    const sql = sqlFor(tenant);
    await sql`SELECT 1 AS one`;
    const stub = () => env.TENANTS.getByName(tenant.id);
    expect(typeof (await runDurableObjectAlarm(stub()))).toBe("boolean");
    const before = await pollUntil(
      () => controlPlaneEvents(tenant),
      (list) => list.some((e) => e.reason === "pool_ready"),
    );
    const top = Math.max(...before.map((e) => e.seq));
    // What a dead instance leaves: its flush sent these, its own record of them was lost, so the
    // next instance numbers its events the same.
    await asSuperuser(async (client) => {
      await client.query(
        `INSERT INTO lifecycle_events (tenant_id, seq, generation, from_state, to_state, reason, at)
         SELECT $1, $2::bigint + g, 1, 'ready', 'ready', 'planted: sent, then lost', now() FROM generate_series(1, 5) g`,
        [tenant.id, top],
      );
    }, "lessor");
    await killObject(tenant);
    await sql`SELECT 2 AS two`;
    expect(typeof (await runDurableObjectAlarm(stub()))).toBe("boolean");
    const key = (e: LifecycleEvent) => `${e.generation} ${e.from}→${e.to} ${e.reason}`;
    const after = await pollUntil(
      () => controlPlaneEvents(tenant),
      (list) => list.filter((e) => e.reason === "pool_ready").length === 2,
    );
    expect(after.filter((e) => e.seq > top && !e.reason.startsWith("planted")).map(key)).toEqual([
      "1 ready→stopped object_restarted",
      "2 stopped→starting demand",
      "2 starting→ready pool_ready",
    ]);
    expect(after.filter((e) => e.reason.startsWith("planted"))).toHaveLength(5);
    // A replay of what landed changes nothing.
    expect(typeof (await runDurableObjectAlarm(stub()))).toBe("boolean");
    expect(await controlPlaneEvents(tenant)).toEqual(after);
  });

  it("usage the object counted and saved before it was killed is not lost (found by the chaos soak)", async () => {
    const tenant = await createTenant(uniqueTenantId("kill-usage"), { tier: "free" });
    const sql = sqlFor(tenant);
    const saves: number[] = [];
    tenantHooksForTests.onUsageSaved = (id, queries) => {
      if (id === tenant.id) saves.push(queries);
    };
    try {
      await sql`SELECT 1 AS n`;
      await sql`SELECT g FROM generate_series(1, 3) g`;
      await expect(sql`SELECT 1 / 0`).rejects.toThrow();
      await Promise.all(Array.from({ length: 12 }, () => sql`SELECT 1 AS n`));
      // All 15 answered requests saved, in batches: far fewer writes than requests.
      expect(
        await pollUntil(
          () => Promise.resolve(saves.at(-1) ?? 0),
          (queries) => queries === 15,
        ),
      ).toBe(15);
      expect(saves.length).toBeLessThan(12);
    } finally {
      tenantHooksForTests.onUsageSaved = undefined;
    }
    // Killed before its heartbeat moved the counts to the durable outbox.
    await killObject(tenant);
    // The next instance's heartbeat flushes what the dead one answered for.
    await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id));
    const response = await admin(`/v1/tenants/${tenant.id}/usage`);
    expect(response.status).toBe(200);
    const { usage } = await response.json<{ usage: Record<string, number> }>();
    expect(usage).toMatchObject({ queries: 15, errors: 1, rowsReturned: 16, poolStarts: 1 });
  });

  it("a migration killed with its object gives its maintenance slot back at the next reconcile (found by the chaos soak)", async () => {
    const tenant = await createTenant(uniqueTenantId("kill-migrate"), { tier: "free" });
    const host = (await (await admin(`/v1/tenants/${tenant.id}`)).json<{ tenant: { host: string } }>()).tenant
      .host;
    const migrateSlots = async () => {
      const { hosts } = await (await admin("/v1/capacity")).json<{
        hosts: { host: string; maintenance: { byPurpose: Record<string, number> } }[];
      }>();
      return hosts.find((h) => h.host === host)?.maintenance.byPurpose.migrate ?? 0;
    };
    // Back to schema version 1 behind Lessor's back, so there is a migration to run.
    await asSuperuser(async (client) => {
      await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
      await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
      await client.query("DELETE FROM lessor.schema_migrations WHERE version > 1");
    }, tenant.database);
    // The migration's DDL waits behind this lock while the object is killed under it.
    await asSuperuser(async (locker) => {
      await locker.query("BEGIN");
      await locker.query("LOCK TABLE notes IN ACCESS EXCLUSIVE MODE");
      const migration = env.TENANTS.getByName(tenant.id)
        .migrate(tenant.id, 2, 1_000)
        .catch((error: unknown) => String(error));
      expect(await pollUntil(migrateSlots, (n) => n === 1, { attempts: 80, intervalMs: 100 })).toBe(1);
      await killObject(tenant);
      await migration;
      await locker.query("ROLLBACK");
    }, tenant.database);
    // Its holder is gone: the reconcile frees the slot now, not when its 10-minute hold runs out.
    await env.BUDGETS.getByName(host).reconcile(host, 0);
    expect(await migrateSlots()).toBe(0);
  });
  it("a migration whose backend is killed mid-step is interrupted, not failed, and runs again (issue 32)", async () => {
    const tenant = await createTenant(uniqueTenantId("kill-mig-be"), { tier: "free" });
    await asSuperuser(async (client) => {
      await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
      await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
      await client.query("DELETE FROM lessor.schema_migrations WHERE version > 1");
    }, tenant.database);
    const outcome = await asSuperuser(async (locker) => {
      await locker.query("BEGIN");
      await locker.query("LOCK TABLE notes IN ACCESS EXCLUSIVE MODE");
      const migration = env.TENANTS.getByName(tenant.id).migrate(tenant.id, 2, 1_000);
      // The step waits behind the lock; its backend is killed there, as the soak's faults do.
      const killed = await pollUntil(
        () =>
          asSuperuser(async (client) => {
            const { rows } = await client.query(
              `SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity
                WHERE application_name = $1 AND wait_event_type = 'Lock'`,
              [`lessor:${tenant.role}:migrate`],
            );
            return rows.length;
          }),
        (n) => n > 0,
        { attempts: 80, intervalMs: 100 },
      );
      expect(killed).toBe(1);
      const answered = await migration;
      await locker.query("ROLLBACK");
      return answered;
    }, tenant.database);
    // Not the migration's fault: skipped as interrupted (the campaign runs it again), never failed.
    expect(outcome).toEqual({ outcome: "skipped", reason: "interrupted" });
    expect(await env.TENANTS.getByName(tenant.id).migrate(tenant.id, 2, 1_000)).toMatchObject({
      outcome: "migrated",
      toVersion: 2,
      applied: [2],
    });
  });

  it("a request in flight when its object is killed answers 503 object_unavailable with Retry-After, not 500 (found by the chaos soak)", async () => {
    const tenant = await createTenant(uniqueTenantId("kill-answer"), { tier: "free" });
    withoutStatementBound(tenant);
    await sqlFor(tenant)`SELECT 1`;
    // The statement runs until the test lets go of its lock: it is still in flight at the kill.
    const answer = await holdingWriteLock(tenant, async () => {
      const inFlight = sqlRequest(tenant.connectionString, {
        query: `SELECT 'in-flight', pg_catalog.pg_advisory_xact_lock(${writeLockKey})`,
        params: [],
      });
      const running = await pollUntil(
        () => waitsOnLock(tenant, "in-flight"),
        (found) => found,
        { attempts: 200, intervalMs: 50 },
      );
      expect(running).toBe(true);
      await killObject(tenant);
      return inFlight;
    });
    expect(answer.status).toBe(503);
    expect(Number(answer.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
    expect(await answer.json()).toMatchObject({ code: "object_unavailable" });
  });
});
