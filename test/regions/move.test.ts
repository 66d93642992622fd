/**
 * Moving a tenant between regions (issue 27, docs/adr/023-regions.md): a resumable, audited job in
 * the old region's object, fence → drain → copy → switch → start → cleanup → commit, with one owner
 * throughout. The tenant's database stays on its host; its catalog, keys, sealed credential,
 * ledgers, usage and audit rows go to the new region's control plane and leave the old one's; its
 * keys keep working (the old region's object points the Worker to the new one).
 */
import { env } from "cloudflare:test";
import { afterEach, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import { InterruptedForTests } from "../../src/erase/test-hooks.ts";
import { moveHooksForTests } from "../../src/move/test-hooks.ts";
import { budgetObject, tenantObject } from "../../src/placement/index.ts";
import { reapOrphanBackends } from "../../src/tenant-db/orphans.ts";
import { admin, asSuperuser, lessor, pollUntil, sqlRequest, uniqueTenantId } from "../integration/harness.ts";

type RegionName = "us" | "eu";
const databases: Record<RegionName, string> = { us: "lessor", eu: "lessor_eu" };

interface Tenant {
  id: string;
  key: string;
  connectionString: string;
  role: string;
}

afterEach(() => {
  moveHooksForTests.onStep = undefined;
});

async function createIn(region: RegionName, prefix: string): Promise<Tenant> {
  const id = uniqueTenantId(prefix);
  const response = await admin("/v1/tenants", { method: "POST", json: { id, region } });
  expect(response.status, await response.clone().text()).toBe(201);
  const body = await response.json<{ key: string; connectionString: string }>();
  const role = await asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT role_name FROM tenants WHERE id = $1", [id]);
    return String(rows[0]?.role_name);
  }, databases[region]);
  return { id, key: body.key, connectionString: body.connectionString, role };
}

/** Rows a region's control plane holds about `id`, table by table. */
async function rowsAbout(region: RegionName, id: string): Promise<Record<string, number>> {
  return asSuperuser(async (client) => {
    const counts: Record<string, number> = {};
    for (const table of [
      "tenant_keys",
      "tenant_credentials",
      "generation_ledger",
      "lifecycle_events",
      "usage_deltas",
      "usage_rollups",
      "audit_log",
    ]) {
      const { rows } = await client.query(`SELECT count(*)::int AS n FROM ${table} WHERE tenant_id = $1`, [
        id,
      ]);
      counts[table] = Number(rows[0]?.n ?? 0);
    }
    return counts;
  }, databases[region]);
}

async function statusOf(region: RegionName, id: string): Promise<string | null> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT status FROM tenants WHERE id = $1", [id]);
    return (rows[0]?.status as string | undefined) ?? null;
  }, databases[region]);
}

interface Answer {
  status: number;
  code: string | null;
  generation: number | null;
  app: string | null;
  sentAt: number;
}

/** One `/sql` request: its status, its error code, and the generation its connection was named for. */
async function query(tenant: Tenant): Promise<Answer> {
  const sentAt = Date.now();
  const response = await sqlRequest(tenant.connectionString, {
    query: "SELECT current_setting('application_name') AS app",
    params: [],
  });
  const body = await response.json<{ rows?: string[][]; code?: string }>();
  if (response.status !== 200)
    return { status: response.status, code: body.code ?? null, generation: null, app: null, sentAt };
  const app = body.rows?.[0]?.[0] ?? null;
  const generation = app === null ? null : Number(app.split(":").at(-1));
  return { status: 200, code: null, generation, app, sentAt };
}

function move(tenant: Tenant, from: RegionName, to: RegionName): Promise<Response> {
  return admin(`/v1/tenants/${tenant.id}/move?region=${from}`, { method: "POST", json: { region: to } });
}

async function moveView(
  id: string,
  from: RegionName,
): Promise<{ state: string; stage?: string; lastError?: string | null }> {
  const response = await admin(`/v1/tenants/${id}/move?region=${from}`);
  expect(response.status).toBe(200);
  return response.json();
}

function untilMoved(id: string, from: RegionName) {
  return pollUntil(
    () => moveView(id, from),
    (view) => view.state === "moved",
    { attempts: 160, intervalMs: 250 },
  );
}

describe("moving a tenant to another region", () => {
  it("moves catalog, keys, credential, ledgers, usage and audit; keeps the database; the old key follows; the new owner starts higher", async () => {
    const tenant = await createIn("us", "mover");
    const before = await query(tenant);
    expect(before.status).toBe(200);
    expect(before.app).toMatch(new RegExp(`^lessor:${tenant.role}:[0-9]+$`));
    // Some usage and events in the old region first.
    await pollUntil(
      () => rowsAbout("us", tenant.id),
      (rows) => (rows.usage_deltas ?? 0) > 0 && (rows.lifecycle_events ?? 0) > 0,
      { attempts: 60, intervalMs: 250 },
    );

    const started = await move(tenant, "us", "eu");
    expect(started.status, await started.clone().text()).toBe(202);
    expect(await started.json()).toMatchObject({ state: "moving", from: "us", to: "eu", stage: "drain" });
    const done = await untilMoved(tenant.id, "us");
    expect(done.state).toBe("moved");

    // The catalog: the new region serves it; the old one keeps a stub and nothing else of it.
    expect(await statusOf("eu", tenant.id)).toBe("active");
    expect(await statusOf("us", tenant.id)).toBe("moved");
    expect(await rowsAbout("us", tenant.id)).toEqual({
      tenant_keys: 0,
      tenant_credentials: 0,
      generation_ledger: 0,
      lifecycle_events: 0,
      usage_deltas: 0,
      usage_rollups: 0,
      audit_log: 0,
    });
    const copied = await rowsAbout("eu", tenant.id);
    expect(copied.tenant_keys).toBe(1);
    expect(copied.tenant_credentials).toBe(1);
    expect(copied.generation_ledger).toBeGreaterThan(0);
    expect((copied.usage_deltas ?? 0) + (copied.usage_rollups ?? 0)).toBeGreaterThan(0);
    // The audit: the create's row came along, and the move has its one row, in the new region.
    const audit = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        "SELECT action, detail FROM audit_log WHERE tenant_id = $1 ORDER BY id",
        [tenant.id],
      );
      return rows as { action: string; detail: Record<string, unknown> }[];
    }, "lessor_eu");
    expect(audit.map((row) => row.action)).toEqual(["tenant.create", "tenant.move"]);
    expect(audit[1]?.detail).toMatchObject({ from: "us", to: "eu" });

    // The old key still works: the old region's object points the Worker to the new one, whose
    // first pool starts above every generation the old region used; the database is the same.
    const after = await query(tenant);
    expect(after.status).toBe(200);
    expect(after.app).toMatch(new RegExp(`^lessor:${tenant.role}:[0-9]+$`));
    expect(after.generation ?? 0).toBeGreaterThan(before.generation ?? 0);
    expect((await tenantObject(env, "eu", tenant.id).status()).state).toBe("ready");
    expect((await tenantObject(env, "us", tenant.id).status()).move).toEqual({ state: "moved", to: "eu" });
    // Its REST routes follow too, and a key minted now names the new region.
    const keys = await lessor(`/v1/tenants/${tenant.id}/keys`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
      body: "{}",
    });
    expect(keys.status, await keys.clone().text()).toBe(201);
    const fresh = await keys.json<{ key: string; connectionString: string }>();
    expect(
      new TextDecoder().decode(
        Uint8Array.from(atob(fresh.key.slice(4).replace(/-/g, "+").replace(/_/g, "/")), (ch) =>
          ch.charCodeAt(0),
        ).subarray(48),
      ),
    ).toBe("eu");
    expect(
      (await query({ ...tenant, key: fresh.key, connectionString: fresh.connectionString })).status,
    ).toBe(200);
    // The host's budget and its reaper are the old region's (the database stayed on its host): they
    // ask the old region's object, which forwards to the new owner, so neither takes the new
    // owner's pool for an orphan.
    const config = loadConfig(env);
    const host = config.hosts.get("local");
    if (!host) throw new Error("no host local");
    const reconciled = await budgetObject(env, "local").reconcile("local", 0);
    expect(reconciled.released).toBe(0);
    const reaped = await reapOrphanBackends(env, config, host, 0);
    expect(reaped.checked).toBeGreaterThan(0);
    expect(reaped.terminated).toBe(0);
    const still = await query(tenant);
    expect(still.status).toBe(200);
    expect(still.generation).toBe(after.generation);
    // The operator is told where it went.
    const stale = await admin(`/v1/tenants/${tenant.id}/move?region=us`, {
      method: "POST",
      json: { region: "eu" },
    });
    expect(stale.status).toBe(409);
    expect(await stale.json()).toMatchObject({ code: "tenant_moved", region: "eu" });
    const twice = await admin(`/v1/tenants/${tenant.id}/move?region=eu`, {
      method: "POST",
      json: { region: "eu" },
    });
    expect(twice.status).toBe(409);
    expect(await twice.json()).toMatchObject({ code: "move_same_region" });
  });
});

/** Backends of the tenant's role on the host, by generation (application_name `lessor:<role>:<gen>`). */
async function liveGenerations(role: string): Promise<number[]> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT DISTINCT application_name AS app FROM pg_stat_activity WHERE usename = $1 AND application_name LIKE $2",
      [role, `lessor:${role}:%`],
    );
    return rows.map((row: { app: string }) => Number(row.app.split(":").at(-1))).sort((a, b) => a - b);
  });
}

/** Codes a client may see during a move, each documented as retryable (docs/failures.md). */
const retryableDuringMove = new Set(["tenant_moving", "object_unavailable"]);

describe("a move under traffic, killed between every pair of steps", () => {
  it("keeps one owner throughout: no answer from the fenced generation after the fence, no failure but a retryable one, never two pools", {
    timeout: 240_000,
  }, async () => {
    const tenant = await createIn("us", "hammered");
    const warm = await query(tenant);
    expect(warm.status).toBe(200);

    // The client: three loops hammering the tenant with its one (old-region) key, recording every answer.
    const answers: (Answer & { answeredAt: number })[] = [];
    let hammering = true;
    const hammer = async () => {
      while (hammering) {
        const answer = await query(tenant).catch(() => null);
        if (answer) answers.push({ ...answer, answeredAt: Date.now() });
        await new Promise((resolve) => setTimeout(resolve, 15));
      }
    };
    // Never two pools: the backends of the tenant's role are sampled all along.
    const samples: number[][] = [];
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        samples.push(await liveGenerations(tenant.role));
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();
    const loops = [hammer(), hammer(), hammer()];
    let fencedAt = 0;
    let fencedGeneration = 0;
    const killedAt: string[] = [];
    try {
      await new Promise((resolve) => setTimeout(resolve, 300));

      // Killed at every step: after each stage did its work (before it is recorded: the stage runs
      // again) and after each was recorded (before the next starts), and right after the fence.
      const seen = new Set<string>();
      moveHooksForTests.onStep = ({ tenantId, step, abortObject }) => {
        if (tenantId !== tenant.id || step.point === "started" || step.point === "failed") return;
        const at = `${step.point}:${step.stage ?? "-"}`;
        if (seen.has(at)) return;
        seen.add(at);
        killedAt.push(at);
        // At the commit the runner is stopped without resetting the object: a reset there leaves
        // the vitest pool's teardown waiting for ever (workerd itself idles; the move is done and
        // the test has passed), so that one point is killed as an isolate would be, not as a crash.
        if (at !== "worked:commit") abortObject(`test: move killed at ${at}`);
        throw new InterruptedForTests(at);
      };

      const started = await move(tenant, "us", "eu");
      // The fence point's kill ends the request's object before it answers: the move was asked, the
      // fence is stored; the operator asks again and is answered with the move running.
      await started.text();
      for (let attempt = 0; attempt < 20 && fencedAt === 0; attempt++) {
        const again = await move(tenant, "us", "eu");
        const body = await again.json<{ state?: string; code?: string }>();
        if (again.status === 202 && body.state === "moving") fencedAt = Date.now();
        else await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(fencedAt).toBeGreaterThan(0);
      fencedGeneration = await asSuperuser(async (client) => {
        const { rows } = await client.query(
          "SELECT fenced_generation FROM tenant_moves WHERE tenant_id = $1 AND state = 'moving'",
          [tenant.id],
        );
        return Number(rows[0]?.fenced_generation);
      }, "lessor");
      expect(fencedGeneration).toBeGreaterThanOrEqual(warm.generation ?? 0);

      // Resumed after each kill, as the cron trigger (move-resume) would: until it is done.
      let view = await moveView(tenant.id, "us");
      for (let round = 0; round < 60 && view.state !== "moved"; round++) {
        await tenantObject(env, "us", tenant.id)
          .resumeMove(tenant.id)
          .catch(() => undefined);
        view = await moveView(tenant.id, "us");
        if (view.state !== "moved") await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect(view.state).toBe("moved");
      // The client keeps going on the new owner until it has been answered there more than ten
      // times (bounded), however long each answer takes on this machine.
      await pollUntil(
        async () => answers.filter((a) => a.sentAt > fencedAt && a.status === 200).length,
        (n) => n > 10,
        { attempts: 600, intervalMs: 50 },
      );
    } finally {
      moveHooksForTests.onStep = undefined;
      hammering = false;
      await Promise.all(loops);
      sampling = false;
      await sampler;
    }
    // Killed at every step, and resumed from each.
    expect(killedAt).toEqual([
      "fence:-",
      "worked:drain",
      "recorded:drain",
      "worked:copy",
      "recorded:copy",
      "worked:switch",
      "recorded:switch",
      "worked:start",
      "recorded:start",
      "worked:cleanup",
      "recorded:cleanup",
      // The commit's work is its record: killed after it, the job is found done.
      "worked:commit",
    ]);
    // Every failure is a documented, retryable one.
    const failures = answers.filter((a) => a.status !== 200);
    for (const failure of failures) {
      expect(failure.status).toBe(503);
      expect(retryableDuringMove.has(failure.code ?? ""), JSON.stringify(failure)).toBe(true);
    }
    // After the fence: no answer from a fenced generation; every success is the new owner's.
    const afterFence = answers.filter((a) => a.sentAt > fencedAt && a.status === 200);
    expect(afterFence.length).toBeGreaterThan(10);
    expect(afterFence.filter((a) => (a.generation ?? 0) <= fencedGeneration)).toEqual([]);
    for (const answer of afterFence) expect(answer.app).toMatch(new RegExp(`^lessor:${tenant.role}:[0-9]+$`));
    // The new owner served one generation, above the fenced one.
    expect(new Set(afterFence.map((a) => a.generation)).size).toBe(1);
    // Never two pools on the host at once: at most one generation's backends in every sample.
    expect(samples.length).toBeGreaterThan(10);
    expect(samples.filter((generations) => generations.length > 1)).toEqual([]);
    // The rows are where they belong.
    expect(await statusOf("eu", tenant.id)).toBe("active");
    expect(await statusOf("us", tenant.id)).toBe("moved");
    expect((await rowsAbout("us", tenant.id)).tenant_credentials).toBe(0);
    const audits = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        "SELECT count(*)::int AS n FROM audit_log WHERE tenant_id = $1 AND action = 'tenant.move'",
        [tenant.id],
      );
      return Number(rows[0]?.n);
    }, "lessor_eu");
    expect(audits).toBe(1);
  });
});

describe("moving back, and what a move refuses", () => {
  it("moves a tenant back to the region it left: the stub is taken over, the pointer dropped, every key works", async () => {
    const tenant = await createIn("us", "roundtrip");
    const first = await query(tenant);
    expect(first.status).toBe(200);
    expect((await move(tenant, "us", "eu")).status).toBe(202);
    expect((await untilMoved(tenant.id, "us")).state).toBe("moved");
    const inEu = await query(tenant);
    expect(inEu.status).toBe(200);
    // A key minted while the tenant lives in eu names eu.
    const minted = await lessor(`/v1/tenants/${tenant.id}/keys`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
      body: "{}",
    });
    expect(minted.status).toBe(201);
    const euKey = await minted.json<{ key: string; connectionString: string }>();

    // Back to us: the job runs in eu's object, and us's stub becomes the tenant again.
    const back = await move(tenant, "eu", "us");
    expect(back.status, await back.clone().text()).toBe(202);
    expect((await untilMoved(tenant.id, "eu")).state).toBe("moved");
    expect(await statusOf("us", tenant.id)).toBe("active");
    expect(await statusOf("eu", tenant.id)).toBe("moved");
    expect((await rowsAbout("eu", tenant.id)).tenant_keys).toBe(0);
    expect((await rowsAbout("us", tenant.id)).tenant_keys).toBe(2);
    // Both keys work: the us key goes straight to us's object (its pointer was dropped), the eu key
    // is sent on by eu's object; each generation is above the last region's.
    const home = await query(tenant);
    expect(home.status).toBe(200);
    expect(home.generation ?? 0).toBeGreaterThan(inEu.generation ?? 0);
    expect((await tenantObject(env, "us", tenant.id).status()).move).toBeNull();
    const viaEu = await query({ ...tenant, key: euKey.key, connectionString: euKey.connectionString });
    expect(viaEu.status).toBe(200);
    expect(viaEu.generation).toBe(home.generation);
    // Two moves, two audit rows, in the region that holds the tenant now.
    const moves = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        "SELECT detail->>'from' AS from, detail->>'to' AS to FROM audit_log WHERE tenant_id = $1 AND action = 'tenant.move' ORDER BY id",
        [tenant.id],
      );
      return rows;
    }, "lessor");
    expect(moves).toEqual([
      { from: "us", to: "eu" },
      { from: "eu", to: "us" },
    ]);
  });

  it("refuses an id the target region already has, a pinned tenant unless forced, and an unknown region", async () => {
    const id = uniqueTenantId("twin");
    for (const region of ["us", "eu"] as const) {
      const created = await admin("/v1/tenants", { method: "POST", json: { id, region } });
      expect(created.status).toBe(201);
      await created.text();
    }
    const taken = await admin(`/v1/tenants/${id}/move?region=us`, { method: "POST", json: { region: "eu" } });
    expect(taken.status).toBe(409);
    expect(await taken.json()).toMatchObject({ code: "tenant_exists" });
    // Nothing was fenced: the us tenant is active and served.
    expect(await statusOf("us", id)).toBe("active");

    const pinned = await createIn("us", "pinned");
    expect((await admin(`/v1/tenants/${pinned.id}/pin`, { method: "POST" })).status).toBe(200);
    const refused = await move(pinned, "us", "eu");
    expect(refused.status).toBe(409);
    expect(await refused.json()).toMatchObject({ code: "tenant_pinned" });
    expect((await query(pinned)).status).toBe(200);
    const forced = await admin(`/v1/tenants/${pinned.id}/move?region=us`, {
      method: "POST",
      json: { region: "eu", force: true },
    });
    expect(forced.status).toBe(202);
    await forced.text();
    expect((await untilMoved(pinned.id, "us")).state).toBe("moved");

    const nowhere = await admin(`/v1/tenants/${pinned.id}/move?region=eu`, {
      method: "POST",
      json: { region: "mars" },
    });
    expect(nowhere.status).toBe(400);
    expect(await nowhere.json()).toMatchObject({ code: "region_unknown" });
    const noRegion = await admin(`/v1/tenants/${pinned.id}/move?region=mars`, {
      method: "POST",
      json: { region: "eu" },
    });
    expect(noRegion.status).toBe(400);
    expect(await noRegion.json()).toMatchObject({ code: "region_unknown" });
  });
});
