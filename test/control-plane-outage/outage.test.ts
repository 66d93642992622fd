/**
 * Lessor with the control plane down (issue 16). This project's control plane is reached as
 * 127.0.0.3, which the test proxy can cut off alone (new tunnels refused, open ones cut), while
 * tenant databases stay reachable as 127.0.0.1. Warm tenants keep serving from what their objects
 * hold; cold starts answer 503 control_plane_unavailable; the cron destroys nothing; when the
 * control plane comes back the outboxes flush exactly once. And the control plane is reached
 * through a pool: warm traffic and flushes open no connection per call.
 */
import { createScheduledController, env, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { afterAll, describe, expect, it, vi } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import type { JobReport } from "../../src/cron/index.ts";
import { hostsThisTick, sweptSubjects } from "../../src/cron/jobs/host-sweep.ts";
import worker from "../../src/index.ts";
import { connectionsOpened } from "../../src/postgres/index.ts";
import { migrationLockKey } from "../../src/tenant-db/migrator.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  mapConcurrent,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "../integration/harness.ts";

const controlPlaneAddress = () => {
  const url = new URL(env.LESSOR_CONTROL_PLANE_URL.replace(/^postgres(ql)?:/, "http:"));
  return `${url.hostname}:${url.port}`;
};

async function proxy(action: "block" | "unblock"): Promise<void> {
  const response = await fetch(
    `${env.TEST_PROXY_CONTROL_URL}/${action}?address=${encodeURIComponent(controlPlaneAddress())}`,
  );
  expect(response.status).toBe(200);
  await response.text();
}

afterAll(async () => {
  await proxy("unblock");
});

async function select(tenant: CreatedTenant, n: number): Promise<number[]> {
  const statuses: number[] = [];
  for (let i = 0; i < n; i++) {
    const response = await sqlRequest(tenant.connectionString, { query: "SELECT $1::int AS i", params: [i] });
    statuses.push(response.status);
    await response.text();
  }
  return statuses;
}

async function leaseRoundTrip(tenant: CreatedTenant): Promise<number[]> {
  const auth = { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" };
  const opened = await lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: auth,
    body: JSON.stringify({ ttlMs: 30_000 }),
  });
  const statuses = [opened.status];
  if (opened.status !== 201) return [...statuses, Number(await opened.text().then(() => 0))];
  const { lease } = await opened.json<{ lease: string }>();
  for (const query of ["BEGIN", "INSERT INTO notes (body) VALUES ('during outage')", "COMMIT"]) {
    const answer = await lessor(`/v1/leases/${lease}/sql`, {
      method: "POST",
      headers: auth,
      body: JSON.stringify({ query, params: [] }),
    });
    statuses.push(answer.status);
    await answer.text();
  }
  const released = await lessor(`/v1/leases/${lease}`, { method: "DELETE", headers: auth });
  statuses.push(released.status);
  await released.text();
  return statuses;
}

/** The usage the control plane holds for a tenant: deltas not yet folded plus rollups. */
function controlPlaneQueries(tenant: CreatedTenant): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      `SELECT coalesce((SELECT sum(queries) FROM usage_deltas WHERE tenant_id = $1), 0)
            + coalesce((SELECT sum(queries) FROM usage_rollups WHERE tenant_id = $1), 0) AS n`,
      [tenant.id],
    );
    return Number(rows[0]?.n ?? 0);
  }, "lessor");
}

/**
 * What a cron run could change, read behind Lessor: every control-plane table's row count (read
 * as 127.0.0.1, which the outage does not cut), the budgets' ledgers, and the warm tenants' objects
 * and backends on the host.
 */
async function everythingCronMayChange(warm: readonly CreatedTenant[]) {
  const tables = await asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    );
    const counts: Record<string, number> = {};
    for (const { name } of rows as { name: string }[]) {
      const counted = await client.query(`SELECT count(*)::int AS n FROM "${name}"`);
      counts[name] = Number(counted.rows[0]?.n ?? 0);
    }
    return counts;
  }, "lessor");
  const config = loadConfig(env);
  const ledgers = await Promise.all(
    [...config.hosts.keys()].map(async (host) => {
      const status = await env.BUDGETS.getByName(host).status(host, 0);
      return {
        host,
        allocated: status.allocated,
        reserved: status.reserved,
        draining: status.draining,
        evictions: status.evictions,
        reconciled: status.reconciled,
        maintenance: status.maintenance.inUse,
      };
    }),
  );
  const objects = await Promise.all(
    warm.map(async (tenant) => {
      const status = await env.TENANTS.getByName(tenant.id).status();
      return { state: status.state, generation: status.generation };
    }),
  );
  const backends = await asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT pid, application_name AS app FROM pg_stat_activity WHERE usename = ANY($1::text[]) ORDER BY pid",
      [warm.map((t) => t.role)],
    );
    return rows as { pid: number; app: string }[];
  });
  return { tables, ledgers, objects, backends };
}

describe("the control plane is down", () => {
  it("warm tenants serve with zero errors, cold ones get 503 control_plane_unavailable, and the outboxes flush once after", async () => {
    const warm = await mapConcurrent([0, 1, 2], 3, () => createTenant(uniqueTenantId("warm")));
    const cold = await createTenant(uniqueTenantId("cold"));
    for (const tenant of warm) {
      expect(await select(tenant, 1)).toEqual([200]);
      // Flush what the warm-up counted, so the outage's counts start from the catalog's.
      expect(await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id))).toBe(true);
    }
    const before = await Promise.all(warm.map(controlPlaneQueries));

    await proxy("block");
    try {
      // Warm: /sql and session leases, all answered.
      for (const tenant of warm) {
        expect(await select(tenant, 20)).toEqual(Array.from({ length: 20 }, () => 200));
        expect(await leaseRoundTrip(tenant)).toEqual([201, 200, 200, 200, 204]);
      }
      // Their flushes fail and keep everything (the alarm runs, the rows stay).
      for (const tenant of warm) await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id));

      // Cold: the start needs the sealed credential from the catalog.
      const refused = await sqlRequest(cold.connectionString, { query: "SELECT 1" });
      expect(refused.status).toBe(503);
      expect(Number(refused.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
      expect(await refused.json()).toMatchObject({ code: "control_plane_unavailable" });

      // The cron runs, says the control plane is down, and changes nothing. Its jobs run under
      // waitUntil: the test waits for each of them and reads what it reported.
      const unchanged = () => everythingCronMayChange(warm);
      const beforeCron = await unchanged();
      const runs: Promise<unknown>[] = [];
      const ctx = {
        waitUntil: (promise: Promise<unknown>) => {
          runs.push(promise);
        },
        passThroughOnException: () => undefined,
        props: {},
      };
      // A minute later by the clock the objects read, so the reconcile looks at the warm pools'
      // allocations (it leaves those younger than 30 s alone) and must find each one confirmed.
      vi.useFakeTimers({ toFake: ["Date"] });
      let reports: JobReport[];
      let scheduledTime = 0;
      try {
        vi.setSystemTime(Date.now() + 60_000);
        scheduledTime = Date.now();
        const controller = createScheduledController({ cron: "* * * * *", scheduledTime });
        await worker.scheduled?.(controller, env, ctx as unknown as ExecutionContext);
        reports = (await Promise.all(runs)) as JobReport[];
      } finally {
        vi.useRealTimers();
      }
      const unreachable =
        "failed: LessorError control_plane_unavailable: Lessor's control plane is not reachable right now.";
      // The per-host work runs in each host's BudgetObject alarm (docs/adr/028), which needs no
      // control plane to reconcile its ledger; the cron's part is a visit to a few hosts' objects.
      // Audit retention runs once per sweep, not on this tick.
      const config = loadConfig(env);
      const visited = hostsThisTick(config, config.defaultRegion, scheduledTime).length;
      expect(Object.fromEntries(reports.map((r) => [r.job, `${r.status}: ${r.summary}`]))).toEqual({
        "host-sweep": `ok: ${visited} host(s) of ${sweptSubjects(config, config.defaultRegion).length} visited (their alarms set), 0 failed`,
        "erase-resume": unreachable,
        "move-resume": unreachable,
        "migration-campaigns": unreachable,
        "usage-fold": unreachable,
        "credential-rotation": "ok: no rotation policy (LESSOR_CREDENTIAL_ROTATION_DAYS unset)",
        reseal: "ok: LESSOR_SEAL_KEY holds one key (k0); nothing to reseal",
      });
      // A host's ledger reconcile, from its alarm, during the outage: every warm pool confirmed.
      const host = config.defaultHost;
      const reconciled = await env.BUDGETS.getByName(host).reconcile(host, 0);
      expect(reconciled).toMatchObject({ released: 0, maintenanceExpired: 0 });
      expect(await unchanged()).toEqual(beforeCron);
      for (const tenant of warm) expect(await select(tenant, 1)).toEqual([200]);
    } finally {
      await proxy("unblock");
    }

    // Back: each warm tenant's next flush writes the outage's usage exactly once.
    for (const tenant of warm) await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id));
    const after = await Promise.all(warm.map(controlPlaneQueries));
    // 20 selects + 3 lease statements, and the one select after the cron tick.
    expect(after.map((n, i) => n - (before[i] ?? 0))).toEqual(warm.map(() => 24));
    // A second flush adds nothing.
    for (const tenant of warm) await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id));
    expect(await Promise.all(warm.map(controlPlaneQueries))).toEqual(after);
    // The cold tenant starts now.
    const served = await sqlRequest(cold.connectionString, { query: "SELECT 1" });
    expect(served.status).toBe(200);
  });

  it("opens no control-plane connection per call: 1,000 warm requests and 10 flushes stay within the pools", async () => {
    const tenant = await createTenant(uniqueTenantId("pooled"));
    // The positive control: with every shard's pool gone (the shards reset), the tenant's cold
    // start opens a control-plane connection, and the counter shows it.
    const config = loadConfig(env);
    for (let shard = 0; shard < config.controlPlaneShards; shard++) {
      await runInDurableObject(env.CONTROL_PLANE.getByName(`shard-${shard}`), (_instance, state) => {
        state.abort("test: control-plane shard reset");
      }).catch(() => undefined);
    }
    const cold = connectionsOpened().control_plane;
    expect(await select(tenant, 1)).toEqual([200]);
    expect(connectionsOpened().control_plane).toBeGreaterThan(cold);
    const before = connectionsOpened().control_plane;
    const statuses = await mapConcurrent(
      Array.from({ length: 1_000 }, (_, i) => i),
      20,
      async (i) => {
        const response = await sqlRequest(tenant.connectionString, { query: "SELECT $1::int", params: [i] });
        await response.text();
        return response.status;
      },
    );
    expect(new Set(statuses)).toEqual(new Set([200]));
    for (let i = 0; i < 10; i++) {
      await select(tenant, 1);
      expect(await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id))).toBe(true);
    }
    const status = await admin(`/v1/tenants/${tenant.id}`);
    expect(status.status).toBe(200);
    await status.text();
    const opened = connectionsOpened().control_plane - before;
    // Bounded by the pools (shards × connections each), not by the 1,000 requests and 10 flushes.
    expect(opened).toBeLessThanOrEqual(config.controlPlaneShards * config.controlPlanePoolSize);
    // …and far below one per request or flush.
    expect(opened).toBeLessThan(1_000 / 10);
  });

  it("a migration that succeeded in the tenant's database is reported migrated when the catalog write fails, and the catalog is repaired after", async () => {
    const tenant = await createTenant(uniqueTenantId("blip"));
    expect(await select(tenant, 1)).toEqual([200]);
    // Back to version 1: the database, the catalog, and the object's record (enable reloads it).
    await asSuperuser(async (client) => {
      await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
      await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
      await client.query("DELETE FROM lessor.schema_migrations WHERE version > 1");
    }, tenant.database);
    await asSuperuser(
      (client) => client.query("UPDATE tenants SET schema_version = 1 WHERE id = $1", [tenant.id]),
      "lessor",
    );
    expect((await admin(`/v1/tenants/${tenant.id}/enable`, { method: "POST" })).status).toBe(200);

    await asSuperuser(async (lock) => {
      // Hold the migrator's lock: the migration gets its credential and connection, then waits.
      await lock.query("SELECT pg_advisory_lock($1)", [migrationLockKey]);
      const migration = env.TENANTS.getByName(tenant.id).migrate(tenant.id, 3, 1_000);
      try {
        await pollUntil(
          async () => {
            const { rows } = await lock.query(
              "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
              [`lessor:${tenant.role}:migrate`],
            );
            return Number(rows[0]?.n ?? 0);
          },
          (n) => n === 1,
          { attempts: 100, intervalMs: 100 },
        );
        // The blip: the control plane goes away while the migration runs.
        await proxy("block");
      } finally {
        await lock.query("SELECT pg_advisory_unlock($1)", [migrationLockKey]);
      }
      try {
        const outcome = await migration;
        expect(outcome).toMatchObject({ outcome: "migrated", toVersion: 3 });
      } finally {
        await proxy("unblock");
      }
    }, tenant.database);

    const catalogVersion = () =>
      asSuperuser(async (client) => {
        const { rows } = await client.query("SELECT schema_version FROM tenants WHERE id = $1", [tenant.id]);
        return Number(rows[0]?.schema_version);
      }, "lessor");
    expect(await catalogVersion()).toBe(1);
    // An operator action reloads the record from the stale catalog: the object keeps version 3.
    expect((await admin(`/v1/tenants/${tenant.id}/enable`, { method: "POST" })).status).toBe(200);
    // The next flush repairs the catalog.
    expect(await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id))).toBe(true);
    expect(await catalogVersion()).toBe(3);
    const served = await sqlRequest(
      tenant.connectionString,
      { query: "SELECT 1" },
      { "Lessor-Schema-Version": "3" },
    );
    expect(served.status).toBe(200);
  });
});
