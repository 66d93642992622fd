/**
 * Credential rotation through overlapping generations (issue 14, docs/adr/013): the seed's trace
 * (two session leases hold open transactions while 16 clients keep sending slow `/sql`, and the
 * switch waits until some of it is in flight), a rotation with no room in the rotation reserve, a
 * stopped tenant's rotation, and an object killed at each step of one (test hooks). The ledger is
 * sampled throughout; Postgres is counted exactly, from its own connection log.
 */
import { env } from "cloudflare:workers";
import { afterEach, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import { credentialRotationJob } from "../../src/cron/jobs/credential-rotation.ts";
import { pathOf } from "../../src/postgres/driver.ts";
import { type RotationStep, tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  eventsOf,
  lessor,
  pollUntil,
  runtimeOf,
  sqlRequest,
  tenantBackends,
  uniqueTenantId,
} from "./harness.ts";
import { connectionPeaks, markServerLog } from "./server-log.ts";

interface QueryResult {
  rows: (string | null)[][];
}

function leaseSql(token: string, key: string, query: string): Promise<Response> {
  return lessor(`/v1/leases/${token}/sql`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ query, params: [] }),
  });
}

async function leaseRows(token: string, key: string, query: string): Promise<(string | null)[][]> {
  const response = await leaseSql(token, key, query);
  if (response.status !== 200) throw new Error(`${query}: ${response.status} ${await response.text()}`);
  return (await response.json<QueryResult>()).rows;
}

async function openLease(tenant: CreatedTenant): Promise<{ token: string; generation: number }> {
  const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs: 60_000 }),
  });
  expect(response.status).toBe(201);
  const body = await response.json<{ lease: string; generation: number }>();
  return { token: body.lease, generation: body.generation };
}

async function sqlRows(tenant: CreatedTenant, query: string): Promise<(string | null)[][]> {
  const response = await sqlRequest(tenant.connectionString, { query, params: [] });
  if (response.status !== 200) throw new Error(`${query}: ${response.status} ${await response.text()}`);
  return (await response.json<QueryResult>()).rows;
}

function rotate(id: string): Promise<Response> {
  return admin(`/v1/tenants/${id}/rotate-credentials`, { method: "POST" });
}

/** Connections the ledger of `host` holds for pools (reserved, allocated, draining) and maintenance. */
async function ledgerTotal(host: string): Promise<number> {
  const status = await env.BUDGETS.getByName(host).status(host, 0);
  return status.allocated + status.reserved + status.draining + status.maintenance.inUse;
}

/** The statements running right now on the tenant's backends named `app`. */
async function runningStatements(tenant: CreatedTenant, app: string): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE usename = $1 AND application_name = $2 AND state = 'active'",
      [tenant.role, app],
    );
    return Number(rows[0]?.n ?? 0);
  });
}

async function guardKeys(tenant: CreatedTenant): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT count(*)::int AS n FROM lessor_guard.keys");
    return Number(rows[0]?.n ?? 0);
  }, tenant.database);
}

describe("credential rotation through overlapping generations", () => {
  it("seed trace: two leased transactions commit on the old generation, /sql never fails, the old generation goes when they end", async () => {
    const host = "rot";
    // The host is reached as a deployed `postgres` host is: over TCP, TLS verified (issue 43).
    const hostConfig = loadConfig(env).hosts.get(host);
    if (!hostConfig) throw new Error(`no host ${host}`);
    expect(pathOf(loadConfig(env), { host: hostConfig.hostname, port: hostConfig.port })).toMatchObject({
      path: "tcp",
      sslmode: "verify-full",
    });
    const tenant = await createTenant(uniqueTenantId("rot"), { host, tier: "standard" });
    const filler = await createTenant(uniqueTenantId("rotfill"), { host, tier: "standard" });
    // The host's pool share is full: the overlap can only come from the rotation reserve.
    await sqlRows(filler, "SELECT 1");
    await sqlRows(tenant, "CREATE TABLE trace (who text NOT NULL)");
    const before = await runtimeOf(tenant.id);
    expect(before.state).toBe("ready");
    const oldGeneration = before.generation;

    const first = await openLease(tenant);
    const second = await openLease(tenant);
    for (const [name, lease] of [
      ["first", first],
      ["second", second],
    ] as const) {
      expect(lease.generation).toBe(oldGeneration);
      await leaseRows(lease.token, tenant.key, "BEGIN");
      await leaseRows(lease.token, tenant.key, `INSERT INTO trace VALUES ('${name}')`);
    }

    const status = await env.BUDGETS.getByName(host).status(host, 0);
    const ceiling = status.budget + status.rotationReserve;
    const from = await markServerLog();
    // The load: 16 clients at once, each statement holding its connection for 200 ms, so the
    // pool (5) always has statements running and requests waiting when the switch comes. Each
    // request notes the logical time it was sent and answered (one counter for the whole test).
    let clock = 0;
    let switchedAt: number | null = null;
    let stop = false;
    const answers: {
      sent: number;
      answered: number;
      status: number;
      app: string | null;
      failure: string | null;
    }[] = [];
    const served = new Set<string>();
    const client = async () => {
      for (let i = 0; i < 500 && !stop; i++) {
        const sent = clock++;
        const response = await sqlRequest(tenant.connectionString, {
          query: "SELECT current_setting('application_name'), pg_sleep(0.2)",
          params: [],
        });
        const answered = clock++;
        const ok = response.status === 200;
        const app = ok ? String((await response.json<QueryResult>()).rows[0]?.[0]) : null;
        if (app) served.add(app);
        answers.push({
          sent,
          answered,
          status: response.status,
          app,
          failure: ok ? null : await response.text(),
        });
      }
    };
    const load = Promise.all(Array.from({ length: 16 }, client));
    const samples: number[] = [];
    const sampler = (async () => {
      for (let i = 0; i < 2_000 && !stop; i++) {
        samples.push(await ledgerTotal(host));
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();
    // The switch waits (test hook) until the old generation has statements running: some
    // requests are then in flight across it, answered by the old generation after the new one
    // took over.
    tenantHooksForTests.onRotationStep = async ({ tenantId, step }) => {
      if (tenantId !== tenant.id || step !== "prepared") return;
      await pollUntil(
        () => runningStatements(tenant, `lessor:${tenant.role}:${oldGeneration}`),
        (n) => n > 0,
        { attempts: 100, intervalMs: 20 },
      );
      switchedAt = clock++;
    };

    await pollUntil(
      async () => answers.length,
      (n) => n >= 16,
    );
    let response: Response;
    try {
      response = await rotate(tenant.id);
    } finally {
      tenantHooksForTests.onRotationStep = undefined;
    }
    expect(response.status).toBe(202);
    const { generation } = await response.json<{ generation: number }>();
    expect(generation).toBeGreaterThan(oldGeneration);
    const during = await runtimeOf(tenant.id);
    expect(during).toMatchObject({ state: "ready", generation });

    // New work goes to the new generation while the old one still holds both transactions.
    const seen = await pollUntil(
      async () => served,
      (s) => [...s].some((app) => app.endsWith(`:${generation}`)),
    );
    expect([...seen].some((app) => app.endsWith(`:${generation}`))).toBe(true);
    expect((await sqlRows(tenant, "SELECT current_setting('application_name')"))[0]?.[0]).toBe(
      `lessor:${tenant.role}:${generation}`,
    );
    expect((await tenantBackends(tenant)).some((app) => app.endsWith(`:${oldGeneration}`))).toBe(true);
    // Both generations' backends came in over TLS, as Postgres itself reports.
    const overTls = await asSuperuser(async (client) => {
      const { rows } = await client.query<{ tls: number; plain: number; generations: number }>(
        `SELECT count(*) FILTER (WHERE s.ssl)::int AS tls, count(*) FILTER (WHERE NOT s.ssl)::int AS plain,
                count(DISTINCT a.application_name)::int AS generations
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name LIKE $1`,
        [`lessor:${tenant.role}:%`],
      );
      return rows[0];
    });
    expect(overTls?.plain).toBe(0);
    expect(overTls?.generations).toBe(2);
    expect(overTls?.tls).toBeGreaterThan(2);

    // Both transactions finish on the old generation: Postgres keeps a session that logged in with
    // the old password.
    for (const [name, lease] of [
      ["first", first],
      ["second", second],
    ] as const) {
      expect(
        (await leaseRows(lease.token, tenant.key, "SELECT current_setting('application_name')"))[0]?.[0],
      ).toBe(`lessor:${tenant.role}:${oldGeneration}`);
      await leaseRows(lease.token, tenant.key, `INSERT INTO trace VALUES ('${name}-2')`);
      await leaseRows(lease.token, tenant.key, "COMMIT");
      const closed = await lessor(`/v1/leases/${lease.token}`, {
        method: "DELETE",
        headers: { Authorization: `Bearer ${tenant.key}` },
      });
      expect(closed.status).toBe(204);
    }

    // The old generation's backends go once both leases have ended; its guard key with it.
    const left = await pollUntil(
      () => tenantBackends(tenant),
      (apps) => !apps.some((app) => app.endsWith(`:${oldGeneration}`)),
    );
    expect(left.filter((app) => app.endsWith(`:${oldGeneration}`))).toEqual([]);
    expect(
      await pollUntil(
        () => guardKeys(tenant),
        (n) => n === 1,
      ),
    ).toBe(1);
    expect(
      await pollUntil(
        () => runtimeOf(tenant.id),
        (r) => (r as unknown as { retiring: unknown }).retiring === null,
      ),
    ).toMatchObject({
      retiring: null,
    });

    stop = true;
    await Promise.all([load, sampler]);
    expect(answers.filter((a) => a.status !== 200)).toEqual([]);
    // The switch came while the load ran, and requests spanned it: sent before, answered after,
    // by the old generation.
    if (switchedAt === null) throw new Error("the rotation never reached its switch");
    const at = switchedAt;
    const spanned = answers.filter(
      (a) => a.sent < at && a.answered > at && a.app === `lessor:${tenant.role}:${oldGeneration}`,
    );
    expect(spanned.length).toBeGreaterThan(0);
    expect(answers.some((a) => a.sent > at && a.app === `lessor:${tenant.role}:${generation}`)).toBe(true);
    expect((await sqlRows(tenant, "SELECT who FROM trace ORDER BY who")).map((r) => r[0])).toEqual([
      "first",
      "first-2",
      "second",
      "second-2",
    ]);

    // Within budget + rotation reserve: the ledger, sampled throughout, and Postgres at every
    // moment (its own connection log): both tenants' backends and the host's admin connections.
    const to = await markServerLog();
    const peaks = await connectionPeaks(
      from,
      to,
      { users: [tenant.role, filler.role], appPatterns: [`lessor:host:${host}:%`] },
      ({ app }) =>
        app.startsWith(`lessor:host:${host}:`) || app.endsWith(":migrate") ? "maintenance" : "pool",
    );
    expect(samples.length).toBeGreaterThan(3);
    expect(Math.max(...samples)).toBeLessThanOrEqual(ceiling);
    expect(peaks.total, JSON.stringify(peaks)).toBeLessThanOrEqual(ceiling);
    // The overlap really used the reserve: the ledger went past the pools' share at some point,
    // and both generations had backends at once (the old one's 5 and the filler's 1 are only 6).
    expect(Math.max(...samples)).toBeGreaterThan(status.poolCapacity);
    expect(peaks.pool).toBeGreaterThan(6);
    const after = await env.BUDGETS.getByName(host).status(host, 0);
    expect(after.allocated + after.reserved + after.draining).toBeLessThanOrEqual(status.poolCapacity);

    const events = await pollUntil(
      () => eventsOf(tenant.id),
      (list) => list.some((e) => e.reason.startsWith("rotation_retired")),
    );
    expect(events.map((e) => e.reason)).toEqual(
      expect.arrayContaining(["credential_rotated", `rotation_retired: generation ${oldGeneration} stopped`]),
    );
    const shown = await (await admin(`/v1/tenants/${tenant.id}`)).json<{
      tenant: { credentialRotatedAt: string };
    }>();
    expect(Date.parse(shown.tenant.credentialRotatedAt)).toBeGreaterThan(0);
  });

  it("no room in the rotation reserve: waits, then refuses 503 capacity_saturated and leaves the pool serving", async () => {
    const host = "rotfull";
    const big = await createTenant(uniqueTenantId("rotbig"), { host, tier: "standard" });
    const small = await createTenant(uniqueTenantId("rotsmall"), { host, tier: "free" });
    await sqlRows(big, "SELECT 1");
    await sqlRows(small, "SELECT 1");
    const generation = (await runtimeOf(big.id)).generation;

    const refused = await rotate(big.id);
    expect(refused.status).toBe(503);
    expect(refused.headers.get("Retry-After")).not.toBeNull();
    expect((await refused.json<{ code: string }>()).code).toBe("capacity_saturated");
    // Nothing changed: the same generation serves, with the same credential.
    expect(await runtimeOf(big.id)).toMatchObject({ state: "ready", generation });
    expect((await sqlRows(big, "SELECT current_setting('application_name')"))[0]?.[0]).toBe(
      `lessor:${big.role}:${generation}`,
    );
    const status = await env.BUDGETS.getByName(host).status(host, 0);
    expect(status.rotations.refused).toBeGreaterThanOrEqual(1);
    expect(status.allocated + status.reserved + status.draining).toBe(7);

    // The small tenant's rotation waits for room; a release (the big pool drained) lets it through.
    // Its wait outlasts the test (test-only setting): it ends because the drain made room, never
    // because a loaded machine took longer than the 2 s wait to drain the big pool.
    tenantHooksForTests.config = (id) => (id === small.id ? { admissionWaitMs: 600_000 } : undefined);
    let granted: Response;
    try {
      const pending = rotate(small.id);
      const waiting = await pollUntil(
        async () => (await env.BUDGETS.getByName(host).status(host, 0)).rotations.waiting,
        (n) => n === 1,
        { attempts: 200, intervalMs: 25 },
      );
      expect(waiting).toBe(1);
      const drained = await admin(`/v1/tenants/${big.id}/drain`, { method: "POST", json: {} });
      expect(drained.status).toBe(202);
      granted = await pending;
    } finally {
      tenantHooksForTests.config = undefined;
    }
    expect(granted.status).toBe(202);
    expect((await sqlRows(small, "SELECT current_setting('application_name')"))[0]?.[0]).toBe(
      `lessor:${small.role}:${(await granted.json<{ generation: number }>()).generation}`,
    );
  });

  it("a stopped tenant's rotation only updates the credential; the next start uses it", async () => {
    const tenant = await createTenant(uniqueTenantId("rotstop"), { host: "local", tier: "free" });
    await sqlRows(tenant, "SELECT 1");
    await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    const stopped = await pollUntil(
      () => runtimeOf(tenant.id),
      (r) => r.state === "stopped",
    );
    expect(stopped.state).toBe("stopped");
    const sealedBefore = await sealedOf(tenant.id);

    const response = await rotate(tenant.id);
    expect(response.status).toBe(202);
    expect(await response.json()).toEqual({ generation: stopped.generation, overlapped: false });
    expect(await runtimeOf(tenant.id)).toMatchObject({ state: "stopped", generation: stopped.generation });
    expect(await sealedOf(tenant.id)).not.toBe(sealedBefore);
    expect(await guardKeys(tenant)).toBe(1);
    // The next start logs in with the new credential, with no repair needed.
    expect((await sqlRows(tenant, "SELECT 1"))[0]?.[0]).toBe("1");
    const events = await eventsOf(tenant.id);
    expect(events.map((e) => e.reason)).not.toContain("credential_repaired");
  });
});

describe("an object killed mid-rotation", () => {
  const steps: readonly RotationStep[] = ["admitted", "password_changed", "resealed", "prepared", "switched"];

  afterEach(() => {
    tenantHooksForTests.onRotationStep = undefined;
  });

  for (const at of steps) {
    it(`killed right after "${at}": the caller is told, no live generation is left behind, and the tenant serves again`, async () => {
      const tenant = await createTenant(uniqueTenantId("rotkill"), { host: "local", tier: "free" });
      await sqlRows(tenant, "SELECT 1");
      const from = (await runtimeOf(tenant.id)).generation;
      const seen: RotationStep[] = [];
      tenantHooksForTests.onRotationStep = (event) => {
        if (event.tenantId !== tenant.id) return;
        seen.push(event.step);
        if (event.step !== at) return;
        event.abortObject(`test: killed mid-rotation after ${at}`);
        // Nothing of the dead instance runs past this step, as after a real crash.
        return new Promise<void>(() => undefined);
      };
      const answer = await rotate(tenant.id);
      tenantHooksForTests.onRotationStep = undefined;
      // It died exactly there, after every step before it, and its caller got a retryable answer.
      expect(seen).toEqual(steps.slice(0, steps.indexOf(at) + 1));
      expect(answer.status).toBe(503);
      expect(Number(answer.headers.get("Retry-After"))).toBeGreaterThanOrEqual(1);
      expect(await answer.json()).toMatchObject({ code: "object_unavailable" });

      const restarted = await runtimeOf(tenant.id);
      expect(restarted.state).toBe("stopped");
      expect((restarted as unknown as { retiring: unknown }).retiring).toBeNull();
      expect((restarted as unknown as { rotatingTo: unknown }).rotatingTo).toBeNull();
      // The next request starts one generation (fencing whatever the dead ones left) and serves.
      const app = (await sqlRows(tenant, "SELECT current_setting('application_name')"))[0]?.[0];
      const serving = (await runtimeOf(tenant.id)).generation;
      expect(serving).toBeGreaterThan(from);
      expect(app).toBe(`lessor:${tenant.role}:${serving}`);
      const backends = await pollUntil(
        () => tenantBackends(tenant),
        (apps) => apps.every((a) => a.endsWith(`:${serving}`)),
      );
      expect(backends.every((a) => a.endsWith(`:${serving}`))).toBe(true);
      // The ledger holds only the serving generation for this tenant.
      const ledger = await env.BUDGETS.getByName("local").evictionReport("local", 1);
      expect(ledger.pools.filter((p) => p.tenantId === tenant.id).map((p) => p.generation)).toEqual([
        serving,
      ]);
      // Where it died decides how the start logged in: killed between the password change and
      // the reseal, the role had a password the control plane never held, and the start set it back.
      const reasons = (
        await pollUntil(
          () => eventsOf(tenant.id),
          (list) => list.some((e) => e.generation === serving && e.to === "ready"),
        )
      ).map((e) => e.reason);
      expect(reasons.includes("credential_repaired")).toBe(at === "password_changed");
    });
  }
});

describe("scheduled rotation", () => {
  it("rotates credentials older than the policy in bounded batches and shows the progress", async () => {
    const old = await createTenant(uniqueTenantId("rotold"), { host: "local", tier: "free" });
    const fresh = await createTenant(uniqueTenantId("rotnew"), { host: "local", tier: "free" });
    await sqlRows(old, "SELECT 1");
    // The old tenant's credential is 400 days old, older than anything other test files create.
    await asSuperuser(
      (client) =>
        client.query(
          "UPDATE tenant_credentials SET sealed_at = now() - interval '400 days' WHERE tenant_id = $1",
          [old.id],
        ),
      "lessor",
    );
    const policyEnv = {
      ...env,
      LESSOR_CREDENTIAL_ROTATION_DAYS: "365",
      LESSOR_CREDENTIAL_ROTATION_BATCH: "1",
    } as Env;
    const before = await sealedOf(fresh.id);
    const report = await credentialRotationJob.run(policyEnv, {
      cron: "* * * * *",
      scheduledTime: Date.now(),
      region: "default",
    });
    expect(report.fields).toMatchObject({ due: 1, rotated: 1, deferred: 0 });
    const shown = await (await admin(`/v1/tenants/${old.id}`)).json<{
      tenant: { credentialRotatedAt: string };
    }>();
    // The catalog's new seal time, shown as is (no longer the one from 400 days ago).
    const sealedAt = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        "SELECT (extract(epoch FROM sealed_at) * 1000)::float8 AS ms, sealed_at > now() - interval '400 days' AS renewed FROM tenant_credentials WHERE tenant_id = $1",
        [old.id],
      );
      return rows[0] as { ms: number; renewed: boolean };
    }, "lessor");
    expect(sealedAt.renewed).toBe(true);
    expect(Date.parse(shown.tenant.credentialRotatedAt)).toBe(Math.floor(Number(sealedAt.ms)));
    // Nothing else was due: the fresh tenant kept its credential; a second run finds nothing.
    expect(await sealedOf(fresh.id)).toBe(before);
    const again = await credentialRotationJob.run(policyEnv, {
      cron: "* * * * *",
      scheduledTime: Date.now(),
      region: "default",
    });
    expect(again.fields).toMatchObject({ due: 0, rotated: 0 });
    // The rotated tenant serves on its new generation.
    expect((await sqlRows(old, "SELECT 1"))[0]?.[0]).toBe("1");
    const maintenance = await (await admin("/v1/maintenance")).json<{ credentials: unknown }>();
    expect(maintenance.credentials).toEqual({ policyDays: null, due: 0 });
  });
});

async function sealedOf(id: string): Promise<string> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT sealed_password FROM tenant_credentials WHERE tenant_id = $1",
      [id],
    );
    return String(rows[0]?.sealed_password);
  }, "lessor");
}
