/**
 * Tenant erase against the real stack: the gate, the stages and the tombstone; what is left
 * afterwards, looked for in Postgres itself (pg_database, pg_roles, every control-plane table
 * through information_schema), in the object's and the budget's storage; kills between every pair
 * of stages; concurrent requests; leases and statements that outlast the wait; a campaign; a
 * control plane that goes away; rows written during the erase that the commit's re-check catches.
 */
import { env, runInDurableObject } from "cloudflare:test";
import { afterEach, describe, expect, it } from "vitest";
import type { EraseStage } from "../../src/core/erase.ts";
import { eraseStages } from "../../src/core/erase.ts";
import { eraseResumeJob } from "../../src/cron/jobs/erase-resume.ts";
import { type EraseStepEvent, eraseHooksForTests, InterruptedForTests } from "../../src/erase/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  pollUntil,
  sqlFor,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

interface EraseView {
  state: "erasing" | "erased";
  stage?: string;
  startedAt?: string;
  attempts?: number;
  lastError?: string | null;
  erasedAt?: string;
}

function requestErase(id: string, query = `?confirm=${id}`): Promise<Response> {
  return admin(`/v1/tenants/${id}${query}`, { method: "DELETE" });
}

async function eraseView(id: string): Promise<EraseView> {
  const response = await admin(`/v1/tenants/${id}/erase`);
  if (response.status !== 200)
    throw new Error(`erase status ${id}: ${response.status} ${await response.text()}`);
  return response.json<EraseView>();
}

/** Polls until the erase committed (bounded), and answers the last view either way. */
function untilErased(id: string, attempts = 120): Promise<EraseView> {
  return pollUntil(
    () => eraseView(id),
    (view) => view.state === "erased",
    { attempts, intervalMs: 250 },
  );
}

/** Runs the cron job that resumes due erases, as a tick would. */
function cronResume() {
  return eraseResumeJob.run(env, { cron: "* * * * *", scheduledTime: Date.now() });
}

function openLease(tenant: CreatedTenant): Promise<Response> {
  return lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs: 60_000 }),
  });
}

function leaseSql(token: string, key: string, query: string): Promise<Response> {
  return lessor(`/v1/leases/${token}/sql`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ query }),
  });
}

function controlPlane<T>(work: Parameters<typeof asSuperuser<T>>[0]): Promise<T> {
  return asSuperuser(work, "lessor");
}

/** A tenant with a pool, usage, events, a campaign row, a second key: something in every table. */
async function busyTenant(prefix: string): Promise<CreatedTenant> {
  const tenant = await createTenant(uniqueTenantId(prefix), { tier: "free" });
  const sql = sqlFor(tenant);
  await sql`INSERT INTO notes (body) VALUES ('to be forgotten')`;
  expect(await sql`SELECT count(*)::int AS n FROM notes`).toEqual([{ n: 1 }]);
  const issued = await admin(`/v1/tenants/${tenant.id}/keys`, { method: "POST", json: {} });
  expect(issued.status).toBe(201);
  return tenant;
}

/**
 * Everything that may still name the tenant, looked for behind Lessor: its database and role on
 * the host; every row of every control-plane table (found through information_schema, so a table
 * added later is covered too) whose text mentions the tenant id or its opaque names, the
 * tombstone and the audit log aside; the object's storage; every table of the budget's ledger.
 */
async function leftovers(tenant: CreatedTenant) {
  const host = await asSuperuser(async (client) => {
    const databases = await client.query("SELECT 1 FROM pg_database WHERE datname = $1", [tenant.database]);
    const roles = await client.query("SELECT 1 FROM pg_roles WHERE rolname = $1", [tenant.role]);
    return { databases: databases.rows.length, roles: roles.rows.length };
  });
  const rows = await controlPlane(async (client) => {
    const { rows: tables } = await client.query(
      "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    );
    const found: Record<string, number> = {};
    for (const { table_name: table } of tables as { table_name: string }[]) {
      const { rows: counted } = await client.query(
        `SELECT count(*)::int AS n FROM "${table}" t WHERE strpos(t::text, $1) > 0 OR strpos(t::text, $2) > 0`,
        [tenant.id, tenant.database],
      );
      const n = Number(counted[0]?.n ?? 0);
      if (n > 0) found[table] = n;
    }
    return found;
  });
  const objectStorage = await runInDurableObject(
    env.TENANTS.getByName(tenant.id),
    async (_instance, state) => ({
      tables: state.storage.sql
        .exec(
          "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\\_cf\\_%' ESCAPE '\\' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'",
        )
        .toArray()
        .map((row) => String(row.name)),
      alarm: await state.storage.getAlarm(),
    }),
  );
  const budget = await runInDurableObject(env.BUDGETS.getByName("local"), async (_instance, state) => {
    const found: Record<string, number> = {};
    const tables = state.storage.sql
      .exec("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\\_cf\\_%' ESCAPE '\\'")
      .toArray()
      .map((row) => String(row.name));
    for (const table of tables) {
      const columns = state.storage.sql.exec(`SELECT name FROM pragma_table_info('${table}')`).toArray();
      if (!columns.some((column) => column.name === "tenant_id")) continue;
      const n = Number(
        state.storage.sql.exec(`SELECT count(*) AS n FROM "${table}" WHERE tenant_id = ?`, tenant.id).one().n,
      );
      if (n > 0) found[table] = n;
    }
    return found;
  });
  return { host, rows, objectStorage, budget };
}

/** What an erased tenant must leave: the tombstone and its audit rows, nothing else. */
async function expectNothingLeft(tenant: CreatedTenant): Promise<void> {
  const left = await leftovers(tenant);
  expect(left.host).toEqual({ databases: 0, roles: 0 });
  const { tenant_erasures: tombstones, audit_log: audit, ...others } = left.rows;
  expect(others).toEqual({});
  expect(tombstones).toBe(1);
  expect(audit).toBeGreaterThanOrEqual(1);
  expect(left.objectStorage).toEqual({ tables: [], alarm: null });
  expect(left.budget).toEqual({});
  // Neither the tombstone nor the audit rows hold the opaque names (nor anything of the database).
  const named = await controlPlane(async (client) => {
    const { rows } = await client.query(
      `SELECT (SELECT count(*) FROM tenant_erasures t WHERE strpos(t::text, $1) > 0)::int
            + (SELECT count(*) FROM audit_log a WHERE strpos(a::text, $1) > 0)::int AS n`,
      [tenant.database],
    );
    return Number(rows[0]?.n ?? 0);
  });
  expect(named).toBe(0);
}

async function auditRows(id: string, action: string) {
  const response = await admin(`/v1/audit?tenant=${id}&action=${action}`);
  expect(response.status).toBe(200);
  return (
    await response.json<{
      entries: { action: string; actor: string; tenant: string; detail: Record<string, unknown> }[];
    }>()
  ).entries;
}

afterEach(() => {
  eraseHooksForTests.onStep = undefined;
});

describe("erase: the request", () => {
  it("needs ?confirm= naming the tenant, the admin key, and a tenant that exists", async () => {
    const tenant = await createTenant(uniqueTenantId("erase-confirm"), { tier: "free" });
    for (const query of ["", "?confirm=", `?confirm=${tenant.id}x`, "?confirm=someone-else"]) {
      const refused = await requestErase(tenant.id, query);
      expect(refused.status).toBe(400);
      expect(await refused.json()).toMatchObject({ code: "confirm_mismatch" });
    }
    const asTenant = await lessor(`/v1/tenants/${tenant.id}?confirm=${tenant.id}`, {
      method: "DELETE",
      headers: { Authorization: `Bearer ${tenant.key}` },
    });
    expect(asTenant.status).toBe(401);
    const unknown = uniqueTenantId("never");
    const missing = await requestErase(unknown);
    expect(missing.status).toBe(404);
    expect(await missing.json()).toMatchObject({ code: "tenant_not_found" });
    expect(await sqlFor(tenant)`SELECT 1 AS one`).toEqual([{ one: 1 }]);
  });

  it("erases everything, leaves a tombstone and one audit row; the old key gets 410, a forged one 401", async () => {
    const tenant = await busyTenant("erase-all");
    const [{ ordinal }] = (await controlPlane(
      async (client) =>
        (
          await client.query("SELECT ordinal FROM tenants WHERE id = $1", [tenant.id])
        ).rows as { ordinal: string }[],
    )) as [{ ordinal: string }];
    const started = await requestErase(tenant.id);
    expect(started.status).toBe(202);
    const body = await started.json<EraseView>();
    expect(body).toMatchObject({
      state: "erasing",
      stage: expect.any(String),
      startedAt: expect.any(String),
    });

    const view = await untilErased(tenant.id);
    expect(view).toEqual({ state: "erased", erasedAt: expect.any(String) });
    await expectNothingLeft(tenant);

    const gone = await admin(`/v1/tenants/${tenant.id}`);
    expect(gone.status).toBe(410);
    expect(await gone.json()).toMatchObject({ code: "tenant_erased", erasedAt: view.erasedAt });

    const oldKey = await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] });
    expect(oldKey.status).toBe(410);
    expect(await oldKey.json()).toMatchObject({ code: "tenant_erased", erasedAt: view.erasedAt });
    const lease = await openLease(tenant);
    expect(lease.status).toBe(410);
    const forged = tenant.connectionString.replace(
      /:lsk_[^@]+@/,
      ":lsk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA@",
    );
    const forgedAnswer = await sqlRequest(forged, { query: "SELECT 1", params: [] });
    expect(forgedAnswer.status).toBe(400);
    expect(await forgedAnswer.json()).toMatchObject({ code: "28P01" });

    const erase = await auditRows(tenant.id, "tenant.erase");
    expect(erase).toHaveLength(1);
    expect(erase[0]).toMatchObject({
      actor: expect.stringMatching(/^admin:[0-9a-f]{12}$/),
      tenant: tenant.id,
    });
    expect(erase[0]?.detail).toMatchObject({ ordinal: Number(ordinal), forced: false });
    const stages = erase[0]?.detail.stages as Record<string, Record<string, number>>;
    expect(Object.keys(stages).sort()).toEqual(eraseStages.filter((s) => s !== "commit").sort());
    expect(stages.keys).toEqual({ keys: 2 });
    expect(stages.database).toEqual({ databases: 1, roles: 1 });
    expect(stages.usage?.usageDeltas ?? 0).toBeGreaterThanOrEqual(0);
    expect(JSON.stringify(erase)).not.toMatch(/lsk_|password|postgres:\/\//);
    expect(JSON.stringify(erase)).not.toContain(env.LESSOR_ADMIN_KEY);
  });
});

/** Waits (bounded) until `done()` holds; the caller asserts afterwards. */
async function until(done: () => boolean, attempts = 200): Promise<void> {
  for (let i = 0; i < attempts && !done(); i++) await new Promise((resolve) => setTimeout(resolve, 100));
}

/** Polls the erase, nudging the cron job on every poll, until it committed. */
function untilErasedByCron(id: string): Promise<EraseView> {
  return pollUntil(
    async () => {
      await cronResume();
      return eraseView(id);
    },
    (view) => view.state === "erased",
    { attempts: 120, intervalMs: 250 },
  );
}

/** Counts each stage's starts per tenant, from the test hook. */
function stageStarts(): {
  starts: Map<string, Map<string, number>>;
  record: (event: EraseStepEvent) => void;
} {
  const starts = new Map<string, Map<string, number>>();
  return {
    starts,
    record: ({ tenantId, step }) => {
      if (step.point !== "started") return;
      const counts = starts.get(tenantId) ?? new Map<string, number>();
      counts.set(step.stage, (counts.get(step.stage) ?? 0) + 1);
      starts.set(tenantId, counts);
    },
  };
}

function timesEach(stages: readonly string[], times: number): Record<string, number> {
  return Object.fromEntries(stages.map((stage) => [stage, times]));
}

describe("erase: kills and resumption", () => {
  const killPoints = ["gate", ...eraseStages.filter((stage) => stage !== "commit")] as const;

  it("a kill between every pair of stages (object reset or runner killed) is resumed exactly once", async () => {
    const watch = stageStarts();
    const plan = new Map<string, { after: string; kind: "object" | "runner" }>();
    const killed = new Set<string>();
    eraseHooksForTests.onStep = (event) => {
      const target = plan.get(event.tenantId);
      if (!target) return;
      watch.record(event);
      const { step } = event;
      const at = step.point === "gate" ? "gate" : step.point === "recorded" ? step.stage : null;
      if (at !== target.after || killed.has(event.tenantId)) return;
      killed.add(event.tenantId);
      if (target.kind === "object") event.abortObject(`test: object reset after ${at}`);
      throw new InterruptedForTests(`killed after ${at}`);
    };
    await mapConcurrentInOrder(killPoints, 3, async (after, index) => {
      const tenant = await busyTenant("erase-kill");
      plan.set(tenant.id, { after, kind: index % 2 === 0 ? "object" : "runner" });
      const first = await requestErase(tenant.id);
      await until(() => killed.has(tenant.id));
      expect(killed.has(tenant.id), `${tenant.id} killed after ${after}`).toBe(true);
      if (after === "gate") {
        // Killed before it answered; the gate is closed all the same, and asking again is the same job.
        const again = await requestErase(tenant.id);
        expect(again.status).toBe(202);
        expect(await again.json()).toMatchObject({ state: "erasing" });
      } else {
        expect(first.status).toBe(202);
      }
      const stalled = await eraseView(tenant.id);
      const next = after === "gate" ? "keys" : eraseStages[eraseStages.indexOf(after as EraseStage) + 1];
      if (stalled.state === "erasing")
        expect(eraseStages.indexOf(stalled.stage as EraseStage)).toBeGreaterThanOrEqual(
          eraseStages.indexOf(next as EraseStage),
        );
      expect((await untilErasedByCron(tenant.id)).state, `${tenant.id} after ${after}`).toBe("erased");
      expect(Object.fromEntries(watch.starts.get(tenant.id) ?? []), `killed after ${after}`).toEqual(
        timesEach(eraseStages, 1),
      );
      await expectNothingLeft(tenant);
      expect(await auditRows(tenant.id, "tenant.erase")).toHaveLength(1);
    });
  }, 300_000);

  it("a stage killed after its work but before its progress row runs again and changes nothing", async () => {
    const tenant = await busyTenant("erase-twice");
    const watch = stageStarts();
    const interrupted = new Set<string>();
    eraseHooksForTests.onStep = (event) => {
      if (event.tenantId !== tenant.id) return;
      watch.record(event);
      const { step } = event;
      if (step.point !== "worked" || step.stage === "commit" || interrupted.has(step.stage)) return;
      interrupted.add(step.stage);
      throw new InterruptedForTests(`killed inside ${step.stage}`);
    };
    expect((await requestErase(tenant.id)).status).toBe(202);
    expect((await untilErasedByCron(tenant.id)).state).toBe("erased");
    expect(Object.fromEntries(watch.starts.get(tenant.id) ?? [])).toEqual({
      ...timesEach(eraseStages, 2),
      commit: 1,
    });
    await expectNothingLeft(tenant);
    expect(await auditRows(tenant.id, "tenant.erase")).toHaveLength(1);
  });

  it("concurrent DELETEs are one job: one gate, one tombstone, one audit row", async () => {
    const tenant = await busyTenant("erase-conc");
    const answers = await Promise.all(Array.from({ length: 8 }, () => requestErase(tenant.id)));
    const bodies = await Promise.all(answers.map((answer) => answer.json<EraseView>()));
    expect(answers.map((answer) => answer.status)).toEqual(Array(8).fill(202));
    expect(new Set(bodies.map((body) => body.startedAt)).size).toBe(1);
    expect((await untilErased(tenant.id)).state).toBe("erased");
    const after = await requestErase(tenant.id);
    expect(after.status).toBe(410);
    expect(await after.json()).toMatchObject({ code: "tenant_erased" });
    expect(await auditRows(tenant.id, "tenant.erase")).toHaveLength(1);
    await expectNothingLeft(tenant);
  });
});

/** Like the harness's mapConcurrent, for a readonly tuple. */
async function mapConcurrentInOrder<T, R>(
  items: readonly T[],
  concurrency: number,
  work: (item: T, index: number) => Promise<R>,
): Promise<R[]> {
  const results = new Array<R>(items.length);
  let next = 0;
  async function worker(): Promise<void> {
    while (next < items.length) {
      const index = next++;
      results[index] = await work(items[index] as T, index);
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, items.length) }, worker));
  return results;
}
