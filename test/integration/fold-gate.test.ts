/**
 * The regression gate for invariant 8: bookkeeping written on the hot path is append-only; folds
 * delete only while no backend genuinely pins the horizon; readers are exact at every moment.
 *
 * It measures the database (pg_stat_user_tables, pgstattuple) instead of trusting the code. Other
 * test files share this Postgres and may tick the cron at any time, so the gate holds the fold's
 * own advisory lock whenever it needs "no fold runs now", identifies its own ticks by their
 * scheduled time, and measures only deltas it controls.
 */
import {
  createExecutionContext,
  createScheduledController,
  runDurableObjectAlarm,
  waitOnExecutionContext,
} from "cloudflare:test";
import { env } from "cloudflare:workers";
import type { Client } from "@neondatabase/serverless";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { foldLockKey } from "../../src/folds/sql.ts";
import type { MaintenanceStatus, OutcomeView } from "../../src/folds/status.ts";
import worker from "../../src/index.ts";
import type { UsageCounters } from "../../src/usage/index.ts";
import type { TenantUsage } from "../../src/usage/readers.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  pollUntil,
  sqlFor,
  uniqueTenantId,
} from "./harness.ts";

const hotTables = ["usage_deltas", "lifecycle_events", "generation_ledger"] as const;
const foldedTables = [...hotTables, "usage_rollups"] as const;

/** A connection to the control-plane database as the superuser. */
function onControlPlane<T>(work: (client: Client) => Promise<T>): Promise<T> {
  return asSuperuser(work, "lessor");
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// ── Cron ticks, identified by a scheduled time no other tick uses ───────────────────────────────

let tickSerial = 0;

/** Runs one cron tick through the real scheduled handler; returns the fold outcome it recorded. */
async function tick(): Promise<OutcomeView> {
  // A past instant nobody else picks: other files tick with Date.now().
  const scheduledTime = Date.UTC(2001, 0, 1) + (Math.floor(Math.random() * 1e6) * 1000 + tickSerial++) * 1000;
  const ctx = createExecutionContext();
  await worker.scheduled(createScheduledController({ cron: "* * * * *", scheduledTime }), env, ctx);
  await waitOnExecutionContext(ctx);
  const status = await maintenance("?limit=200");
  const mine = status.outcomes.find((o) => o.scheduledAt === new Date(scheduledTime).toISOString());
  if (!mine) throw new Error("the tick recorded no fold outcome");
  return mine;
}

/** Ticks until a run is not skipped for a busy lock (another file's fold may hold it briefly). */
async function tickPastBusyLock(): Promise<OutcomeView> {
  for (let attempt = 0; attempt < 20; attempt++) {
    const outcome = await tick();
    if (outcome.outcome !== "skipped_lock_busy") return outcome;
    await sleep(100);
  }
  throw new Error("the fold lock stayed busy");
}

async function maintenance(query = ""): Promise<MaintenanceStatus> {
  const response = await admin(`/v1/maintenance${query}`);
  expect(response.status).toBe(200);
  return response.json<MaintenanceStatus>();
}

// ── Load ────────────────────────────────────────────────────────────────────────────────────────

interface Expected {
  queries: number;
  rowsReturned: number;
  errors: number;
}

/**
 * One round of /sql traffic on every tenant at once (successes and failures), then each tenant's
 * alarm, which flushes its usage and lifecycle outboxes to the control plane.
 */
async function loadRound(tenants: readonly CreatedTenant[], expected: Map<string, Expected>): Promise<void> {
  await Promise.all(
    tenants.map(async (tenant, index) => {
      const sql = sqlFor(tenant);
      const rows = index + 2;
      const e = expected.get(tenant.id) ?? { queries: 0, rowsReturned: 0, errors: 0 };
      await Promise.all([
        ...Array.from({ length: 8 }, () => sql`SELECT g FROM generate_series(1, ${rows}::int) g`),
        sql`SELECT 1 / 0`.catch(() => undefined),
      ]);
      expected.set(tenant.id, {
        queries: e.queries + 9,
        rowsReturned: e.rowsReturned + 8 * rows,
        errors: e.errors + 1,
      });
    }),
  );
  for (const tenant of tenants) {
    expect(await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id))).toBe(true);
  }
}

async function usageOf(tenant: CreatedTenant): Promise<TenantUsage> {
  const response = await admin(`/v1/tenants/${tenant.id}/usage`);
  expect(response.status).toBe(200);
  return response.json<TenantUsage>();
}

async function usageOfAll(tenants: readonly CreatedTenant[]): Promise<Map<string, UsageCounters>> {
  const usage = new Map<string, UsageCounters>();
  for (const tenant of tenants) usage.set(tenant.id, (await usageOf(tenant)).usage);
  return usage;
}

// ── Looking at the database ─────────────────────────────────────────────────────────────────────

interface TableStats {
  ins: number;
  upd: number;
  hotUpd: number;
  del: number;
}

async function tableStats(): Promise<Map<string, TableStats>> {
  return onControlPlane(async (client) => {
    await client.query("SELECT pg_stat_force_next_flush()");
    const { rows } = await client.query<{
      relname: string;
      ins: string;
      upd: string;
      hot: string;
      del: string;
    }>(
      `SELECT relname, n_tup_ins AS ins, n_tup_upd AS upd, n_tup_hot_upd AS hot, n_tup_del AS del
         FROM pg_stat_user_tables WHERE schemaname = 'public' AND relname = ANY($1)`,
      [[...hotTables]],
    );
    return new Map(
      rows.map((r) => [
        r.relname,
        { ins: Number(r.ins), upd: Number(r.upd), hotUpd: Number(r.hot), del: Number(r.del) },
      ]),
    );
  });
}

function statsDelta(
  before: Map<string, TableStats>,
  after: Map<string, TableStats>,
  table: string,
): TableStats {
  const b = before.get(table) ?? { ins: 0, upd: 0, hotUpd: 0, del: 0 };
  const a = after.get(table) ?? { ins: 0, upd: 0, hotUpd: 0, del: 0 };
  return { ins: a.ins - b.ins, upd: a.upd - b.upd, hotUpd: a.hotUpd - b.hotUpd, del: a.del - b.del };
}

/** Statistics are flushed by each backend on its own schedule; wait until two reads agree. */
async function settledStats(): Promise<Map<string, TableStats>> {
  let previous = await tableStats();
  for (let i = 0; i < 20; i++) {
    await sleep(300);
    const current = await tableStats();
    if (JSON.stringify([...current]) === JSON.stringify([...previous])) return current;
    previous = current;
  }
  return previous;
}

/** Dead tuples in each table, counted by reading the heap (pgstattuple), not from statistics. */
async function deadTuples(tables: readonly string[]): Promise<Record<string, number>> {
  return onControlPlane(async (client) => {
    const dead: Record<string, number> = {};
    for (const table of tables) {
      const { rows } = await client.query<{ dead: string }>(
        "SELECT dead_tuple_count AS dead FROM pgstattuple($1::regclass)",
        [table],
      );
      dead[table] = Number(rows[0]?.dead ?? -1);
    }
    return dead;
  });
}

/** VACUUMs until the heap holds no dead tuple (a concurrent short transaction can delay it). */
async function vacuumUntilClean(tables: readonly string[]): Promise<Record<string, number>> {
  let dead: Record<string, number> = {};
  for (let attempt = 0; attempt < 20; attempt++) {
    await onControlPlane(async (client) => {
      for (const table of tables) await client.query(`VACUUM ${table}`);
    });
    dead = await deadTuples(tables);
    if (Object.values(dead).every((n) => n === 0)) return dead;
    await sleep(250);
  }
  return dead;
}

/** Runs `work` while this file holds the fold lock, so no fold (from any file) deletes meanwhile. */
function holdingFoldLock<T>(work: () => Promise<T>): Promise<T> {
  return onControlPlane(async (holder) => {
    await holder.query("SELECT pg_advisory_lock($1::bigint)", [foldLockKey]);
    try {
      return await work();
    } finally {
      await holder.query("SELECT pg_advisory_unlock($1::bigint)", [foldLockKey]);
    }
  });
}

async function countDeltas(tenants: readonly CreatedTenant[]): Promise<number> {
  return onControlPlane(async (client) => {
    const { rows } = await client.query<{ n: number }>(
      "SELECT count(*)::int AS n FROM usage_deltas WHERE tenant_id = ANY($1)",
      [tenants.map((t) => t.id)],
    );
    return rows[0]?.n ?? -1;
  });
}

async function countRows(table: "lifecycle_events" | "generation_ledger", tenants: readonly CreatedTenant[]) {
  return onControlPlane(async (client) => {
    const { rows } = await client.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM ${table} WHERE tenant_id = ANY($1)`,
      [tenants.map((t) => t.id)],
    );
    return rows[0]?.n ?? -1;
  });
}

/** Opens a session that stays open (and in whatever state `setup` leaves it) until `close` is called. */
async function openSession(setup: (client: Client) => Promise<void>): Promise<{
  pid: number;
  client: Client;
  close: () => Promise<void>;
}> {
  let close: () => void = () => undefined;
  const closed = new Promise<void>((resolve) => {
    close = resolve;
  });
  let ready: (value: { pid: number; client: Client }) => void = () => undefined;
  let failed: (error: unknown) => void = () => undefined;
  const opened = new Promise<{ pid: number; client: Client }>((resolve, reject) => {
    ready = resolve;
    failed = reject;
  });
  const done = onControlPlane(async (client) => {
    try {
      const { rows } = await client.query<{ pid: number }>("SELECT pg_backend_pid() AS pid");
      await setup(client);
      ready({ pid: Number(rows[0]?.pid), client });
    } catch (error) {
      failed(error);
      return;
    }
    await closed;
    await client.query("ROLLBACK").catch(() => undefined);
  });
  const session = await opened;
  return {
    ...session,
    close: async () => {
      close();
      await done;
    },
  };
}

// ── The gate ────────────────────────────────────────────────────────────────────────────────────

describe("fold gate", () => {
  const tenants: CreatedTenant[] = [];
  const expected = new Map<string, Expected>();
  /** Usage read through the API once the load was flushed: every later read must equal it. */
  let truth = new Map<string, UsageCounters>();

  beforeAll(async () => {
    await onControlPlane((client) => client.query("CREATE EXTENSION IF NOT EXISTS pgstattuple"));
    for (const prefix of ["gate-a", "gate-b", "gate-c"])
      tenants.push(await createTenant(uniqueTenantId(prefix)));
  });

  afterAll(async () => {
    // Never leave a prepared transaction behind: it would pin the horizon for every other file.
    await onControlPlane((client) =>
      client
        .query("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'lessor-gate-%'")
        .then(async ({ rows }) => {
          for (const row of rows as { gid: string }[]) await client.query(`ROLLBACK PREPARED '${row.gid}'`);
        }),
    );
  });

  it("under sustained load the hot tables take zero UPDATEs, zero DELETEs and no dead tuples", async () => {
    await holdingFoldLock(async () => {
      const clean = await vacuumUntilClean(hotTables);
      expect(clean).toEqual({ usage_deltas: 0, lifecycle_events: 0, generation_ledger: 0 });
      const before = await settledStats();

      for (let round = 0; round < 5; round++) await loadRound(tenants, expected);

      // Wait until the backends that appended our rows have flushed their statistics.
      const ours = {
        usage_deltas: await countDeltas(tenants),
        lifecycle_events: await countRows("lifecycle_events", tenants),
        generation_ledger: await countRows("generation_ledger", tenants),
      };
      expect(ours.usage_deltas).toBeGreaterThanOrEqual(5 * tenants.length);
      let after = await tableStats();
      for (let i = 0; i < 50; i++) {
        if (hotTables.every((t) => statsDelta(before, after, t).ins >= ours[t])) break;
        await sleep(200);
        after = await tableStats();
      }
      for (const table of hotTables) {
        const delta = statsDelta(before, after, table);
        expect(delta.ins, `${table} inserts`).toBeGreaterThanOrEqual(ours[table]);
        expect({ table, upd: delta.upd, hotUpd: delta.hotUpd, del: delta.del }).toEqual({
          table,
          upd: 0,
          hotUpd: 0,
          del: 0,
        });
      }
      expect(await deadTuples(hotTables)).toEqual({
        usage_deltas: 0,
        lifecycle_events: 0,
        generation_ledger: 0,
      });

      // While the lock is held, a tick skips instead of waiting.
      const busy = await tick();
      expect(busy.outcome).toBe("skipped_lock_busy");
      expect(busy.summary).toBe("skipped: lock busy");
    });

    truth = await usageOfAll(tenants);
    for (const tenant of tenants) {
      const e = expected.get(tenant.id);
      expect(truth.get(tenant.id)).toMatchObject({ ...e, poolStarts: 1 });
    }
  });

  it("with a session idle in transaction holding an xid, folds stand down, delete nothing, and readers stay exact", async () => {
    const pinner = await openSession(async (client) => {
      await client.query("BEGIN");
      await client.query("SELECT txid_current()");
    });
    try {
      const deltasBefore = await countDeltas(tenants);
      const deadBefore = await deadTuples(hotTables);
      expect(deltasBefore).toBeGreaterThan(0);

      const outcome = await tickPastBusyLock();
      expect(outcome.outcome).toBe("skipped_pinned");
      expect(outcome.pin).toMatchObject({ kind: "idle_in_transaction", pid: pinner.pid });
      expect(outcome.summary).toMatch(
        new RegExp(`^skipped: pinned by pid ${pinner.pid} for [0-9.]+ seconds$`),
      );

      // Nothing was deleted: our deltas are all still there, and no new dead tuple appeared.
      expect(await countDeltas(tenants)).toBe(deltasBefore);
      const deadAfter = await deadTuples(hotTables);
      for (const table of hotTables) expect(deadAfter[table]).toBeLessThanOrEqual(deadBefore[table] ?? 0);

      // Readers are exact while the deltas wait.
      expect(await usageOfAll(tenants)).toEqual(truth);

      // The operator sees the pin and the backlog.
      const status = await maintenance();
      expect(status.horizon).toMatchObject({ pinned: true });
      expect(status.backlog.deltas).toBeGreaterThanOrEqual(deltasBefore);
      expect(status.backlog.oldestAgeSeconds).not.toBeNull();
    } finally {
      await pinner.close();
    }
  });

  it("a prepared transaction pins the horizon too", async () => {
    const gid = `lessor-gate-${crypto.randomUUID().slice(0, 8)}`;
    await onControlPlane(async (client) => {
      await client.query("BEGIN");
      await client.query("SELECT txid_current()");
      await client.query(`PREPARE TRANSACTION '${gid}'`);
    });
    try {
      const outcome = await tickPastBusyLock();
      expect(outcome.outcome).toBe("skipped_pinned");
      expect(outcome.pin).toMatchObject({ kind: "prepared_transaction", gid });
      expect(await usageOfAll(tenants)).toEqual(truth);
    } finally {
      await onControlPlane((client) => client.query(`ROLLBACK PREPARED '${gid}'`));
    }
  });

  it("once the pin is released the next fold runs, readers stay exact, and VACUUM leaves no dead tuples", async () => {
    const outcome = await tickPastBusyLock();
    expect(outcome.outcome).toBe("folded");
    expect(outcome.summary).toMatch(/^folded [0-9]+ rows?/);
    expect(outcome.backlogRemains).toBe(false);
    expect(await countDeltas(tenants)).toBe(0);
    expect(await usageOfAll(tenants)).toEqual(truth);
    const rollups = await onControlPlane(async (client) => {
      const { rows } = await client.query<{ tenant_id: string; queries: string }>(
        "SELECT tenant_id, queries FROM usage_rollups WHERE tenant_id = ANY($1)",
        [tenants.map((t) => t.id)],
      );
      return rows;
    });
    expect(rollups).toHaveLength(tenants.length);

    const dead = await holdingFoldLock(() => vacuumUntilClean(foldedTables));
    expect(dead).toEqual({ usage_deltas: 0, lifecycle_events: 0, generation_ledger: 0, usage_rollups: 0 });
  });

  it("a young REPEATABLE READ reader does not make the fold stand down", async () => {
    await loadRound(tenants, expected);
    const flushed = await usageOfAll(tenants);
    for (const tenant of tenants) {
      expect(flushed.get(tenant.id)).toMatchObject({ ...expected.get(tenant.id), poolStarts: 1 });
    }
    expect(await countDeltas(tenants)).toBeGreaterThan(0);

    let seen = -1;
    const reader = await openSession(async (client) => {
      await client.query("BEGIN ISOLATION LEVEL REPEATABLE READ");
      const { rows } = await client.query<{ n: number }>("SELECT count(*)::int AS n FROM usage_deltas");
      seen = rows[0]?.n ?? -1;
    });
    try {
      const outcome = await tickPastBusyLock();
      expect(outcome.outcome).toBe("folded");
      expect(await countDeltas(tenants)).toBe(0);
      expect(await usageOfAll(tenants)).toEqual(flushed);
      // The reader keeps its snapshot, deltas and all.
      const { rows } = await reader.client.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM usage_deltas",
      );
      expect(rows[0]?.n).toBe(seen);
    } finally {
      await reader.close();
    }
    truth = flushed;
    const dead = await holdingFoldLock(() => vacuumUntilClean(foldedTables));
    expect(dead).toEqual({ usage_deltas: 0, lifecycle_events: 0, generation_ledger: 0, usage_rollups: 0 });
  });

  it("a flush replayed after its rows were folded is not counted twice", async () => {
    const [tenant] = tenants;
    if (!tenant) throw new Error("no tenant");
    // Replay the tenant's highest folded delta, as a TenantObject would if it never saw the
    // append's acknowledgement and the fold ran before it retried.
    await onControlPlane((client) =>
      client.query(
        `INSERT INTO usage_deltas (tenant_id, seq, queries, rows_returned, errors, lease_ms, pool_starts, at)
         SELECT tenant_id, folded_seq, 1000, 1000, 1000, 1000, 1000, now()
           FROM usage_rollups WHERE tenant_id = $1
         ON CONFLICT DO NOTHING`,
        [tenant.id],
      ),
    );
    expect(await countDeltas([tenant])).toBe(1);
    expect((await usageOf(tenant)).usage).toEqual(truth.get(tenant.id));
    const outcome = await tickPastBusyLock();
    expect(outcome.outcome).toBe("folded");
    expect(await countDeltas([tenant])).toBe(0);
    expect((await usageOf(tenant)).usage).toEqual(truth.get(tenant.id));
  });

  it("trims the ledgers to their retention but keeps each tenant's highest generation", async () => {
    const ghost = uniqueTenantId("gate-ghost");
    await onControlPlane(async (client) => {
      await client.query(
        `INSERT INTO generation_ledger (tenant_id, generation, pool_size, started_at)
         SELECT $1, g, 1, now() - interval '400 days' FROM generate_series(1, 4) g`,
        [ghost],
      );
      await client.query(
        `INSERT INTO lifecycle_events (tenant_id, seq, generation, from_state, to_state, reason, at)
         SELECT $1, s, 1, 'stopped', 'starting', 'demand', now() - interval '400 days' FROM generate_series(1, 3) s`,
        [ghost],
      );
    });
    const outcome = await tickPastBusyLock();
    expect(outcome.outcome).toBe("folded");
    const left = await onControlPlane(async (client) => {
      const generations = await client.query<{ generation: number }>(
        "SELECT generation FROM generation_ledger WHERE tenant_id = $1 ORDER BY generation",
        [ghost],
      );
      const events = await client.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM lifecycle_events WHERE tenant_id = $1",
        [ghost],
      );
      return { generations: generations.rows.map((r) => r.generation), events: events.rows[0]?.n };
    });
    expect(left).toEqual({ generations: [4], events: 0 });
    // Our live tenants' recent history is untouched.
    expect(await countRows("generation_ledger", tenants)).toBe(tenants.length);
  });

  it("shows outcomes, counters and the backlog at GET /v1/maintenance, paged", async () => {
    // The backlog is the deltas table's row count, read behind Lessor just before and just after
    // the status (a flush landing in between would make them differ: then read again).
    const deltas = () =>
      onControlPlane(async (client) => {
        const { rows } = await client.query("SELECT count(*)::int AS n FROM usage_deltas");
        return Number(rows[0]?.n ?? 0);
      });
    const read = async () => {
      const before = await deltas();
      const shown = await maintenance();
      return { before, shown, after: await deltas() };
    };
    const {
      before,
      shown: status,
      after,
    } = await pollUntil(read, (r) => r.before === r.after, {
      attempts: 10,
      intervalMs: 100,
    });
    expect(after).toBe(before);
    expect(status.backlog.deltas).toBe(before);
    expect(status.counters.runs).toBeGreaterThanOrEqual(7);
    expect(status.counters.skippedPinned).toBeGreaterThanOrEqual(2);
    expect(status.counters.skippedLockBusy).toBeGreaterThanOrEqual(1);
    expect(status.counters.foldedRuns).toBeGreaterThanOrEqual(3);
    expect(status.counters.foldedRows).toBeGreaterThan(0);
    expect(status.counters.lastFoldedAt).not.toBeNull();
    expect(typeof status.horizon.pinned).toBe("boolean");

    const first = await maintenance("?limit=1");
    expect(first.outcomes).toHaveLength(1);
    expect(first.nextCursor).toBe(first.outcomes[0]?.id);
    const second = await maintenance(`?limit=1&cursor=${first.nextCursor}`);
    expect(Number(second.outcomes[0]?.id)).toBeLessThan(Number(first.outcomes[0]?.id));

    expect((await lessor("/v1/maintenance")).status).toBe(401);
    const tenant = tenants[0];
    if (!tenant) throw new Error("no tenant");
    expect(
      (await lessor("/v1/maintenance", { headers: { Authorization: `Bearer ${tenant.key}` } })).status,
    ).toBe(401);
    expect((await admin("/v1/maintenance?cursor=abc")).status).toBe(400);
  });
});
