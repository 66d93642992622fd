/**
 * Tenant erase against the real stack: the gate, the stages and the tombstone; what is left
 * afterwards, looked for in Postgres itself (pg_database, pg_roles, every control-plane table
 * through information_schema), in the object's and the budget's storage; kills between every pair
 * of stages; concurrent requests; leases and statements that outlast the wait; a campaign; a
 * control plane that goes away; rows written during the erase that the commit's re-check catches.
 */
import { env, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { Client } from "@neondatabase/serverless";
import { exportJWK, generateKeyPair, SignJWT } from "jose";
import { afterEach, describe, expect, it } from "vitest";
import { runCampaignTick } from "../../src/campaigns/runner.ts";
import { loadConfig } from "../../src/config/index.ts";
import { controlPlaneOutageForTests } from "../../src/control-plane/index.ts";
import type { EraseStage } from "../../src/core/erase.ts";
import { eraseStages } from "../../src/core/erase.ts";
import { auditRetentionJob } from "../../src/cron/jobs/audit-retention.ts";
import { eraseResumeJob } from "../../src/cron/jobs/staged-resume.ts";
import { type EraseStepEvent, eraseHooksForTests, InterruptedForTests } from "../../src/erase/test-hooks.ts";
import { adminUrlFor } from "../../src/postgres/index.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
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
  return eraseResumeJob.run(env, { cron: "* * * * *", scheduledTime: Date.now(), region: "default" });
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
    // The tenant's login role, and the end-user login role JWT mode gives it.
    const roles = await client.query("SELECT 1 FROM pg_roles WHERE rolname = ANY($1::text[])", [
      [tenant.role, `${tenant.role}_jwt`],
    ]);
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
  // Every host's budget ledger (the tenant's own host, and any other: none may hold it).
  const budget: Record<string, number> = {};
  for (const hostName of Object.keys(JSON.parse(env.LESSOR_HOSTS) as Record<string, string>)) {
    const found = await runInDurableObject(env.BUDGETS.getByName(hostName), async (_instance, state) => {
      const counted: Record<string, number> = {};
      const tables = state.storage.sql
        .exec("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE '\\_cf\\_%' ESCAPE '\\'")
        .toArray()
        .map((row) => String(row.name));
      for (const table of tables) {
        const columns = state.storage.sql.exec(`SELECT name FROM pragma_table_info('${table}')`).toArray();
        if (!columns.some((column) => column.name === "tenant_id")) continue;
        const n = Number(
          state.storage.sql.exec(`SELECT count(*) AS n FROM "${table}" WHERE tenant_id = ?`, tenant.id).one()
            .n,
        );
        if (n > 0) counted[`${hostName}.${table}`] = n;
      }
      return counted;
    });
    Object.assign(budget, found);
  }
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
  tenantHooksForTests.config = undefined;
  controlPlaneOutageForTests.active = false;
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
    // The usage counted so far goes to the control plane now: the erase has deltas to delete.
    expect(await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id))).toBe(true);
    const deltas = await controlPlane(async (client) => {
      const { rows } = await client.query(
        "SELECT count(*)::int AS n FROM usage_deltas WHERE tenant_id = $1",
        [tenant.id],
      );
      return Number(rows[0]?.n ?? 0);
    });
    expect(deltas).toBeGreaterThan(0);
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
    expect(stages.keys).toEqual({ tenantKeys: 2, tenantJwt: 0 });
    expect(stages.database).toEqual({ databases: 1, roles: 1, adoptedDatabases: 0 });
    expect(stages.usage?.usageDeltas).toBe(deltas);
    expect(JSON.stringify(erase)).not.toMatch(/lsk_|password|postgres:\/\//);
    expect(JSON.stringify(erase)).not.toContain(env.LESSOR_ADMIN_KEY);
  });
});

/**
 * A connection string for `database` as the host's admin role: what a managed host's operator holds
 * (no superuser), whose backends Lessor's admin may end like any other non-superuser's.
 */
function hostAdminUrl(database: string): string {
  const host = loadConfig(env).hosts.get("local");
  if (!host) throw new Error("no local host");
  return adminUrlFor(host.adminUrl, database);
}

/**
 * Whether the tenant's erase has started `stage` (watched through the test hook). With `hold`, the
 * stage does not go on past its start until `hold` resolves.
 */
function waitForStage(tenantId: string, stage: EraseStage, hold?: Promise<void>): () => boolean {
  let started = false;
  eraseHooksForTests.onStep = async ({ tenantId: id, step }) => {
    if (id !== tenantId || step.point !== "started" || step.stage !== stage) return;
    started = true;
    await hold;
  };
  return () => started;
}

/** Test-only settings: these tenants' erases wait `ms` for their leases (test-hooks.ts). */
function eraseLeaseWait(tenantIds: string[], ms: number): void {
  tenantHooksForTests.config = (id) => (tenantIds.includes(id) ? { eraseLeaseWaitMs: ms } : undefined);
}

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

async function expectRefused(response: Response, status: number, code: string): Promise<void> {
  const text = await response.text();
  expect({ status: response.status, body: text }).toMatchObject({ status });
  expect(JSON.parse(text)).toMatchObject({ code });
  if (status === 503) expect(Number(response.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
}

/** The erase's audit row's stage counts. */
async function stageCounts(id: string): Promise<Record<string, Record<string, number>>> {
  const [row] = await auditRows(id, "tenant.erase");
  return (row?.detail.stages ?? {}) as Record<string, Record<string, number>>;
}

describe("erase: the gate", () => {
  it("is closed when the DELETE answers: /sql, leases, keys, catalog changes and the budget refuse", async () => {
    const tenant = await busyTenant("erase-gate");
    // Hold the job at the gate (as if its runner died there) while the gate is probed.
    eraseHooksForTests.onStep = ({ tenantId, step }) => {
      if (tenantId === tenant.id && step.point === "gate") throw new InterruptedForTests("held at the gate");
    };
    await requestErase(tenant.id);
    eraseHooksForTests.onStep = undefined;
    const [job] = await controlPlane(
      async (client) =>
        (await client.query("SELECT state, stage FROM tenant_erasures WHERE tenant_id = $1", [tenant.id]))
          .rows,
    );
    expect(job).toEqual({ state: "erasing", stage: "keys" });

    await expectRefused(
      await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] }),
      503,
      "tenant_erasing",
    );
    await expectRefused(await openLease(tenant), 503, "tenant_erasing");
    await expectRefused(
      await lessor(`/v1/tenants/${tenant.id}/keys`, { headers: { Authorization: `Bearer ${tenant.key}` } }),
      503,
      "tenant_erasing",
    );
    await expectRefused(
      await admin(`/v1/tenants/${tenant.id}/keys`, { method: "POST", json: {} }),
      503,
      "tenant_erasing",
    );
    await expectRefused(
      await admin(`/v1/tenants/${tenant.id}/enable`, { method: "POST" }),
      503,
      "tenant_erasing",
    );
    await expectRefused(
      await admin(`/v1/tenants/${tenant.id}/pin`, { method: "POST" }),
      503,
      "tenant_erasing",
    );
    await expectRefused(
      await admin("/v1/tenants", { method: "POST", json: { id: tenant.id } }),
      503,
      "tenant_erasing",
    );
    await expectRefused(
      await admin("/v1/campaigns", {
        method: "POST",
        json: { toVersion: 3, force: true, tenants: [tenant.id] },
      }),
      400,
      "invalid_request",
    );
    const admitted = await env.BUDGETS.getByName("local").admit("local", tenant.id, 1_000, 1);
    expect(admitted).toMatchObject({ granted: false, closed: true });
    const migrated = await env.TENANTS.getByName(tenant.id).migrate(tenant.id, 3, 1_000);
    expect(migrated).toEqual({ outcome: "skipped", reason: "tenant_erasing" });
    // Still a forged key's 28P01 at the edge, and the catalog shows the tenant as erasing.
    const forged = tenant.connectionString.replace(/:lsk_[^@]+@/, ":lsk_forged@");
    expect(await (await sqlRequest(forged, { query: "SELECT 1", params: [] })).json()).toMatchObject({
      code: "28P01",
    });
    const shown = await admin(`/v1/tenants/${tenant.id}`);
    expect(await shown.json()).toMatchObject({
      tenant: { status: "erasing" },
      erase: { stage: "keys" },
      runtime: { erasing: true },
    });

    expect((await untilErasedByCron(tenant.id)).state).toBe("erased");
    await expectNothingLeft(tenant);
  });

  it("refuses a pinned tenant unless forced", async () => {
    const tenant = await busyTenant("erase-pin");
    expect((await admin(`/v1/tenants/${tenant.id}/pin`, { method: "POST" })).status).toBe(200);
    await expectRefused(await requestErase(tenant.id), 409, "tenant_pinned");
    expect(await sqlFor(tenant)`SELECT 1 AS one`).toEqual([{ one: 1 }]);
    expect((await requestErase(tenant.id, `?confirm=${tenant.id}&force=true`)).status).toBe(202);
    expect((await untilErased(tenant.id)).state).toBe("erased");
    expect((await auditRows(tenant.id, "tenant.erase"))[0]?.detail).toMatchObject({ forced: true });
    await expectNothingLeft(tenant);
  });
});

describe("erase: leases and statements", () => {
  it("a session lease with an open transaction runs on through the wait, then is ended and rolled back", async () => {
    const tenant = await busyTenant("erase-lease");
    const opened = await openLease(tenant);
    expect(opened.status).toBe(201);
    const { lease } = await opened.json<{ lease: string }>();
    expect((await leaseSql(lease, tenant.key, "BEGIN")).status).toBe(200);
    expect(
      (await leaseSql(lease, tenant.key, "INSERT INTO notes (body) VALUES ('never committed')")).status,
    ).toBe(200);
    // The erase is held (test hook) as its lease stage starts, until the lease has run a statement:
    // the gate is closed, the wait not yet begun, whatever the machine's speed.
    let letGo: () => void = () => undefined;
    const held = new Promise<void>((resolve) => {
      letGo = resolve;
    });
    const atLeases = waitForStage(tenant.id, "leases", held);
    expect((await requestErase(tenant.id)).status).toBe(202);
    await until(atLeases);
    expect(atLeases()).toBe(true);
    // New work is refused; the open lease still runs statements while the erase waits for it.
    await expectRefused(
      await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] }),
      503,
      "tenant_erasing",
    );
    expect((await leaseSql(lease, tenant.key, "SELECT count(*) FROM notes")).status).toBe(200);
    // Then the wait runs out with the lease still open.
    letGo();
    expect((await untilErased(tenant.id)).state).toBe("erased");
    expect((await stageCounts(tenant.id)).leases).toMatchObject({
      leasesHeld: 1,
      forcedSessions: 1,
      backendsEnded: 0,
    });
    await expectRefused(await leaseSql(lease, tenant.key, "COMMIT"), 410, "tenant_erased");
    await expectNothingLeft(tenant);
  });

  it("a session lease that commits and is released within the wait is not forced", async () => {
    const tenant = await busyTenant("erase-lease-ok");
    const { lease } = await (await openLease(tenant)).json<{ lease: string }>();
    expect((await leaseSql(lease, tenant.key, "BEGIN")).status).toBe(200);
    // A wait longer than the test (test-only setting): it ends because the lease lets go, never
    // because a loaded machine took its time.
    eraseLeaseWait([tenant.id], 600_000);
    const waiting = waitForStage(tenant.id, "leases");
    expect((await requestErase(tenant.id)).status).toBe(202);
    await until(waiting);
    expect(waiting()).toBe(true);
    // While the stage waits for it, the lease finishes its work and lets go.
    expect((await leaseSql(lease, tenant.key, "INSERT INTO notes (body) VALUES ('last words')")).status).toBe(
      200,
    );
    expect((await leaseSql(lease, tenant.key, "COMMIT")).status).toBe(200);
    const released = await lessor(`/v1/leases/${lease}`, {
      method: "DELETE",
      headers: { Authorization: `Bearer ${tenant.key}` },
    });
    expect(released.status).toBe(204);
    expect((await untilErased(tenant.id)).state).toBe("erased");
    expect((await stageCounts(tenant.id)).leases).toMatchObject({
      leasesHeld: 1,
      forcedSessions: 0,
      backendsEnded: 0,
    });
    await expectNothingLeft(tenant);
  });

  it("a statement running when the erase starts may finish within the wait; one that outlasts it is ended", async () => {
    // Both pools start with Postgres's own limits (lock, statement) and the statement bound far past
    // the test (test-only setting): each statement waits on its lock until the test or the erase
    // ends it, never until a 5 s timeout that a slow step of the test let run out.
    let longEraseWait: string | null = null;
    tenantHooksForTests.config = (id) => {
      if (!id.startsWith("erase-stmt-")) return undefined;
      return id === longEraseWait
        ? { statementTimeoutMs: 600_000, eraseLeaseWaitMs: 600_000 }
        : { statementTimeoutMs: 600_000 };
    };
    const quick = await busyTenant("erase-stmt");
    const slow = await busyTenant("erase-stmt-slow");
    // Each statement waits on a lock the host's admin holds in the tenant's database: it runs
    // exactly as long as the test says.
    const blocked = async (tenant: CreatedTenant) => {
      const holder = new Client(hostAdminUrl(tenant.database));
      holder.on("error", () => undefined);
      await holder.connect();
      await holder.query("BEGIN");
      await holder.query("LOCK TABLE notes IN ACCESS EXCLUSIVE MODE");
      const answer = sqlRequest(tenant.connectionString, { query: "SELECT count(*) FROM notes", params: [] });
      const waits = await pollUntil(
        () =>
          asSuperuser(async (client) => {
            const { rows } = await client.query(
              "SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Lock'",
              [tenant.role],
            );
            return Number(rows[0]?.n ?? 0);
          }),
        (n) => n > 0,
        { attempts: 100, intervalMs: 50 },
      );
      expect(waits).toBe(1);
      return { holder, answer };
    };
    const quickRun = await blocked(quick);
    const slowRun = await blocked(slow);
    // The quick one's erase waits longer than the test (test-only setting): its statement ends
    // within the wait because the test lets it, not because the machine was fast. The slow one's
    // waits the configured 2 s and then ends it.
    longEraseWait = quick.id;
    const quickWaiting = waitForStage(quick.id, "leases");
    expect((await requestErase(quick.id)).status).toBe(202);
    expect((await requestErase(slow.id)).status).toBe(202);
    await until(quickWaiting);
    expect(quickWaiting()).toBe(true);
    // The quick one's lock goes while its erase waits: its statement finishes and is answered.
    await quickRun.holder.query("COMMIT");
    await quickRun.holder.end();
    expect((await quickRun.answer).status).toBe(200);
    // The slow one's never goes: the erase ends the statement (its backend) once the wait is over.
    await expectRefused(await slowRun.answer, 503, "connection_lost");
    expect((await untilErased(quick.id)).state).toBe("erased");
    expect((await untilErased(slow.id)).state).toBe("erased");
    // The drop ended the holder's connection under it; a driver client whose socket was cut may never
    // settle its end(), so it is not waited for.
    void slowRun.holder.end().catch(() => undefined);
    expect((await stageCounts(quick.id)).leases).toMatchObject({
      leasesHeld: 1,
      forcedSessions: 0,
      backendsEnded: 0,
    });
    const slowLeases = (await stageCounts(slow.id)).leases;
    expect(slowLeases).toMatchObject({ leasesHeld: 1, forcedSessions: 0 });
    // The statement's backend, and any idle one of the pool: the role's every backend was ended.
    expect(slowLeases?.backendsEnded).toBeGreaterThanOrEqual(1);
    await expectNothingLeft(quick);
    await expectNothingLeft(slow);
  });
});

describe("erase: a campaign", () => {
  /** Puts a tenant back at schema version 2 (its database and the catalog), so a campaign enrolls it. */
  async function rollBackToTwo(tenant: CreatedTenant): Promise<void> {
    await asSuperuser(async (client) => {
      await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
      await client.query("DELETE FROM lessor.schema_migrations WHERE version > 2");
    }, tenant.database);
    await controlPlane((client) =>
      client.query("UPDATE tenants SET schema_version = 2 WHERE id = $1", [tenant.id]),
    );
  }

  async function counts(id: string) {
    const response = await admin(`/v1/campaigns/${id}`);
    return await response.json<{ campaign: { state: string }; counts: Record<string, number> }>();
  }

  it("is refused while a campaign migrates the tenant; an enrolled tenant erased later leaves the counts whole", async () => {
    const held = await busyTenant("erase-cmp-held");
    const gone = await busyTenant("erase-cmp-gone");
    const rest = await busyTenant("erase-cmp-rest");
    for (const tenant of [held, gone, rest]) await rollBackToTwo(tenant);
    const created = await admin("/v1/campaigns", {
      method: "POST",
      json: {
        toVersion: 3,
        force: true,
        drainTimeoutMs: 20_000,
        canary: [held.id],
        tenants: [held.id, gone.id, rest.id],
      },
    });
    expect(created.status).toBe(201);
    const { campaign } = await created.json<{ campaign: { id: string } }>();

    // An enrolled tenant that has not been migrated yet: erased; the campaign counts it as erased.
    expect((await requestErase(gone.id)).status).toBe(202);
    expect((await untilErased(gone.id)).state).toBe("erased");
    expect((await counts(campaign.id)).counts).toMatchObject({ pending: 2, erased: 1, total: 3 });

    // The canary's migration waits for its lease: while it runs, the erase is refused.
    const { lease } = await (await openLease(held)).json<{ lease: string }>();
    const tick = runCampaignTick(env, { campaignId: campaign.id });
    const migrating = await pollUntil(
      () => env.TENANTS.getByName(held.id).status(),
      (status) => status.migrating,
      { attempts: 100, intervalMs: 50 },
    );
    expect(migrating.migrating).toBe(true);
    await expectRefused(await requestErase(held.id), 409, "tenant_in_campaign");
    expect(
      (
        await lessor(`/v1/leases/${lease}`, {
          method: "DELETE",
          headers: { Authorization: `Bearer ${held.key}` },
        })
      ).status,
    ).toBe(204);
    await tick;
    for (let i = 0; i < 10 && (await counts(campaign.id)).campaign.state !== "done"; i++) {
      await runCampaignTick(env, { campaignId: campaign.id });
    }
    expect(await counts(campaign.id)).toMatchObject({
      campaign: { state: "done" },
      counts: { succeeded: 2, pending: 0, running: 0, erased: 1, total: 3 },
    });

    // Once its migration ended, the canary can be erased; the finished campaign still adds up.
    expect((await requestErase(held.id)).status).toBe(202);
    expect((await untilErased(held.id)).state).toBe("erased");
    expect((await counts(campaign.id)).counts).toMatchObject({ succeeded: 1, erased: 2, total: 3 });
    expect((await stageCounts(held.id)).campaigns).toEqual({ campaignTenants: 1 });
    await expectNothingLeft(held);
    await expectNothingLeft(gone);
  });
});

describe("erase: faults and the commit's re-check", () => {
  it("an erase while the control plane is down goes on once it is up (fault injected at the control-plane boundary)", async () => {
    const tenant = await busyTenant("erase-cp");
    const failures: string[] = [];
    eraseHooksForTests.onStep = ({ tenantId, step }) => {
      if (tenantId !== tenant.id) return;
      if (step.point === "recorded" && step.stage === "pool") controlPlaneOutageForTests.active = true;
      if (step.point === "failed" && controlPlaneOutageForTests.active) failures.push(step.message);
    };
    expect((await requestErase(tenant.id)).status).toBe(202);
    await until(() => failures.length >= 2);
    expect(failures.length).toBeGreaterThanOrEqual(2);
    expect(failures[0]).toMatch(/control_plane_unavailable/);
    // The gate holds without the control plane; what needs it answers that it is down.
    await expectRefused(
      await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] }),
      503,
      "tenant_erasing",
    );
    await expectRefused(await admin(`/v1/tenants/${tenant.id}/erase`), 503, "control_plane_unavailable");
    controlPlaneOutageForTests.active = false;
    // Resumed by the object's own alarm (no cron here), with backoff.
    expect((await untilErased(tenant.id)).state).toBe("erased");
    const [row] = await auditRows(tenant.id, "tenant.erase");
    expect(Number(row?.detail.attempts)).toBeGreaterThanOrEqual(failures.length);
    await expectNothingLeft(tenant);
  });

  it("an unreachable host fails the database stage with lastError, retried with backoff until it answers", async () => {
    const tenant = await createTenant(uniqueTenantId("erase-host"), { tier: "free", host: "faulty" });
    const faulty = new URL(
      loadConfig(env)
        .hosts.get("faulty")
        ?.adminUrl.replace(/^postgres:/, "http:") ?? "",
    );
    const proxy = (action: "block" | "unblock") =>
      fetch(
        `${env.TEST_PROXY_CONTROL_URL}/${action}?address=${encodeURIComponent(`${faulty.hostname}:${faulty.port}`)}`,
      );
    expect((await proxy("block")).status).toBe(200);
    try {
      expect((await requestErase(tenant.id)).status).toBe(202);
      const stuck = await pollUntil(
        () => eraseView(tenant.id),
        (view) => view.state === "erasing" && (view.attempts ?? 0) >= 2,
        { attempts: 120, intervalMs: 250 },
      );
      expect(stuck).toMatchObject({
        state: "erasing",
        stage: "database",
        lastError: expect.stringMatching(/^database: /),
      });
      expect(stuck.attempts).toBeGreaterThanOrEqual(2);
    } finally {
      expect((await proxy("unblock")).status).toBe(200);
    }
    expect((await untilErased(tenant.id)).state).toBe("erased");
    expect(Number((await auditRows(tenant.id, "tenant.erase"))[0]?.detail.attempts)).toBeGreaterThanOrEqual(
      2,
    );
    await expectNothingLeft(tenant);
  });

  it("a key and a usage delta written during the erase fail the commit, which retries until none is left", async () => {
    const tenant = await busyTenant("erase-recheck");
    const watch = stageStarts();
    const failures: string[] = [];
    let injected = false;
    eraseHooksForTests.onStep = async (event) => {
      if (event.tenantId !== tenant.id) return;
      watch.record(event);
      const { step } = event;
      if (step.point === "failed") failures.push(step.message);
      if (step.point !== "recorded" || step.stage !== "events" || injected) return;
      injected = true;
      // As a key issue and an outbox flush racing the erase would: after their stages ran.
      await controlPlane(async (client) => {
        await client.query(
          "INSERT INTO tenant_keys (tenant_id, key_id, key_hash) VALUES ($1, 'k_00000000000000ff', repeat('a', 64))",
          [tenant.id],
        );
        await client.query(
          "INSERT INTO usage_deltas (tenant_id, seq, queries, rows_returned, errors, lease_ms, pool_starts, at) VALUES ($1, 999999, 1, 1, 0, 1, 0, now())",
          [tenant.id],
        );
      });
    };
    expect((await requestErase(tenant.id)).status).toBe(202);
    expect((await untilErased(tenant.id)).state).toBe("erased");
    expect(injected).toBe(true);
    // The commit was refused once and the job went back to `keys`, the earliest stage concerned.
    expect(Object.fromEntries(watch.starts.get(tenant.id) ?? [])).toEqual(timesEach(eraseStages, 2));
    const stages = await stageCounts(tenant.id);
    expect(stages.keys?.tenantKeys).toBe(3);
    expect(stages.usage?.usageDeltas).toBeGreaterThanOrEqual(1);
    await expectNothingLeft(tenant);
  });
});

describe("erase: a tenant in end-user JWT mode", () => {
  it("goes with its JWT configuration, its end-user keys and its end-user login role; the shared role stays", async () => {
    const tenant = await busyTenant("erase-jwt");
    const { publicKey, privateKey } = await generateKeyPair("ES256", { extractable: true });
    const jwk = { ...(await exportJWK(publicKey)), kid: "k1", alg: "ES256", use: "sig" };
    const configured = await admin(`/v1/tenants/${tenant.id}/jwt`, {
      method: "PUT",
      json: {
        issuer: "https://idp.example.test/",
        audience: "erase-tests",
        jwks: { keys: [jwk] },
        algorithms: ["ES256"],
      },
    });
    expect(configured.status, await configured.clone().text()).toBe(200);
    const endUserKey = await admin(`/v1/tenants/${tenant.id}/keys`, {
      method: "POST",
      json: { scope: "jwt" },
    });
    expect(endUserKey.status).toBe(201);
    const token = await new SignJWT({})
      .setProtectedHeader({ alg: "ES256", kid: "k1", typ: "JWT" })
      .setIssuer("https://idp.example.test/")
      .setAudience("erase-tests")
      .setSubject("user-1")
      .setIssuedAt()
      .setExpirationTime("5m")
      .sign(privateKey);
    const asEndUser = await sqlRequest(
      tenant.connectionString,
      { query: "SELECT auth.user_id() AS who", params: [] },
      { Authorization: `Bearer ${token}` },
    );
    expect(asEndUser.status, await asEndUser.clone().text()).toBe(200);
    const shared = await asSuperuser(
      async (client) =>
        (await client.query("SELECT count(*)::int AS n FROM pg_roles WHERE rolname = 'authenticated'"))
          .rows[0]?.n,
    );
    expect(shared).toBe(1);

    expect((await requestErase(tenant.id)).status).toBe(202);
    expect((await untilErased(tenant.id)).state).toBe("erased");
    const stages = await stageCounts(tenant.id);
    expect(stages.keys).toEqual({ tenantKeys: 3, tenantJwt: 1 });
    expect(stages.database).toEqual({ databases: 1, roles: 2, adoptedDatabases: 0 });
    await expectNothingLeft(tenant);
    // The end-user role is shared by every tenant in JWT mode: it is not the tenant's to drop.
    const after = await asSuperuser(
      async (client) =>
        (await client.query("SELECT count(*)::int AS n FROM pg_roles WHERE rolname = 'authenticated'"))
          .rows[0]?.n,
    );
    expect(after).toBe(1);
  });
});

describe("erase: afterwards", () => {
  it("the id can be created again: a new ordinal, database and key; the old key gets 410", async () => {
    const tenant = await busyTenant("erase-again");
    const before = await controlPlane(
      async (client) =>
        (await client.query("SELECT ordinal::int AS ordinal FROM tenants WHERE id = $1", [tenant.id]))
          .rows[0] as {
          ordinal: number;
        },
    );
    expect((await requestErase(tenant.id)).status).toBe(202);
    expect((await untilErased(tenant.id)).state).toBe("erased");
    await expectNothingLeft(tenant);

    const again = await createTenant(tenant.id, { tier: "free" });
    expect(again.database).not.toBe(tenant.database);
    expect(again.key).not.toBe(tenant.key);
    const shown = await (await admin(`/v1/tenants/${tenant.id}`)).json<{
      tenant: { ordinal: number; status: string };
    }>();
    expect(shown.tenant.status).toBe("active");
    expect(shown.tenant.ordinal).toBeGreaterThan(before.ordinal);

    await expectRefused(
      await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] }),
      410,
      "tenant_erased",
    );
    await expectRefused(await openLease(tenant), 410, "tenant_erased");
    // Nothing of the old tenant is visible to the new one.
    expect(await sqlFor(again)`SELECT count(*)::int AS n FROM notes`).toEqual([{ n: 0 }]);
    const { lease } = await (await openLease(again)).json<{ lease: string }>();
    expect((await leaseSql(lease, again.key, "SELECT 1")).status).toBe(200);
    // The old tombstone stays in the record; the audit has both creations and the erase.
    const tombstones = await controlPlane(
      async (client) =>
        (
          await client.query(
            "SELECT state, ordinal::int AS ordinal FROM tenant_erasures WHERE tenant_id = $1",
            [tenant.id],
          )
        ).rows,
    );
    expect(tombstones).toEqual([{ state: "erased", ordinal: before.ordinal }]);
    expect((await auditRows(tenant.id, "tenant.create")).map((row) => row.detail.ordinal)).toEqual([
      shown.tenant.ordinal,
      before.ordinal,
    ]);
  });
});

describe("the audit log", () => {
  it("records operator actions with a key fingerprint as actor; paged and filtered", async () => {
    const tenant = await createTenant(uniqueTenantId("audit"), { tier: "free" });
    for (const action of ["disable", "enable", "pin", "unpin"]) {
      expect((await admin(`/v1/tenants/${tenant.id}/${action}`, { method: "POST" })).status).toBe(200);
    }
    expect((await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} })).status).toBe(202);
    const created = await admin("/v1/campaigns", {
      method: "POST",
      json: { toVersion: 3, force: true, tenants: [tenant.id] },
    });
    expect(created.status).toBe(201);
    const { campaign } = await created.json<{ campaign: { id: string } }>();
    for (const action of ["pause", "resume", "cancel"]) {
      expect((await admin(`/v1/campaigns/${campaign.id}/${action}`, { method: "POST" })).status).toBe(200);
    }

    const digest = new Uint8Array(
      await crypto.subtle.digest("SHA-256", new TextEncoder().encode(env.LESSOR_ADMIN_KEY)),
    );
    const actor = `admin:${[...digest]
      .map((b) => b.toString(16).padStart(2, "0"))
      .join("")
      .slice(0, 12)}`;
    const all = await auditRows(
      tenant.id,
      "tenant.create,tenant.disable,tenant.enable,tenant.drain,tenant.pin,tenant.unpin",
    );
    expect(all.map((row) => row.action)).toEqual([
      "tenant.drain",
      "tenant.unpin",
      "tenant.pin",
      "tenant.enable",
      "tenant.disable",
      "tenant.create",
    ]);
    expect(new Set(all.map((row) => row.actor))).toEqual(new Set([actor]));

    // Paged: two at a time, newest first, every row once.
    const walked: string[] = [];
    let cursor: string | null = null;
    for (let page = 0; page < 10; page++) {
      const query: string = `/v1/audit?tenant=${tenant.id}&limit=2${cursor === null ? "" : `&cursor=${cursor}`}`;
      const body = await (await admin(query)).json<{
        entries: { action: string }[];
        nextCursor: string | null;
      }>();
      expect(body.entries.length).toBeLessThanOrEqual(2);
      walked.push(...body.entries.map((entry) => entry.action));
      cursor = body.nextCursor;
      if (cursor === null) break;
    }
    expect(walked).toEqual(all.map((row) => row.action));

    const campaignRows = await (
      await admin("/v1/audit?action=campaign.create,campaign.pause,campaign.resume,campaign.cancel&limit=200")
    ).json<{
      entries: { action: string; actor: string; tenant: string | null; detail: Record<string, unknown> }[];
    }>();
    const mine = campaignRows.entries.filter((entry) => entry.detail.campaign === campaign.id);
    expect(mine.map((entry) => entry.action)).toEqual([
      "campaign.cancel",
      "campaign.resume",
      "campaign.pause",
      "campaign.create",
    ]);
    expect(mine[3]?.detail).toMatchObject({ enrolled: 0, toVersion: 3, scope: "listed" });

    const everything = await (await admin(`/v1/audit?tenant=${tenant.id}&limit=200`)).text();
    expect(everything).not.toContain(env.LESSOR_ADMIN_KEY);
    expect(everything).not.toContain(tenant.key);

    await expectRefused(await admin("/v1/audit?action=tenant.explode"), 400, "invalid_request");
    await expectRefused(await admin("/v1/audit?tenant=NOT_AN_ID"), 400, "invalid_tenant_id");
    await expectRefused(await admin("/v1/audit?cursor=abc"), 400, "invalid_request");
    await expectRefused(
      await lessor("/v1/audit", { headers: { Authorization: `Bearer ${tenant.key}` } }),
      401,
      "invalid_credentials",
    );
  });

  it("ages rows out after the configured retention", async () => {
    const id = uniqueTenantId("audit-old");
    await controlPlane(async (client) => {
      await client.query(
        "INSERT INTO audit_log (at, actor, action, tenant_id) VALUES (now() - interval '500 days', 'admin:000000000000', 'tenant.pin', $1), (now() - interval '10 days', 'admin:000000000000', 'tenant.unpin', $1)",
        [id],
      );
    });
    const result = await auditRetentionJob.run(env, {
      cron: "* * * * *",
      scheduledTime: Date.now(),
      region: "default",
    });
    expect(result.fields?.trimmed).toBeGreaterThanOrEqual(1);
    expect((await auditRows(id, "tenant.pin,tenant.unpin")).map((row) => row.action)).toEqual([
      "tenant.unpin",
    ]);
  });
});
