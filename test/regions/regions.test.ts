/**
 * Two regions (issue 27, docs/adr/023-regions.md): `us`, the default, on one control plane, and
 * `eu` on another, each with hosts of its own. A tenant's catalog lives only in its region's
 * control plane, its key names its region inside the MAC, its object is created in its region; a
 * forged key naming another region is refused at the edge; and with one region's control plane
 * cut off, the other region's tenants do not notice: cold starts, the warm path, campaigns, folds,
 * erase, and the cron's runs.
 */
import { createScheduledController, env, listDurableObjectIds, runInDurableObject } from "cloudflare:test";
import { afterAll, describe, expect, it } from "vitest";
import { runCampaignTick } from "../../src/campaigns/runner.ts";
import { loadConfig } from "../../src/config/index.ts";
import type { JobReport } from "../../src/cron/index.ts";
import { fromBase64Url, toBase64Url } from "../../src/crypto/encoding.ts";
import { foldOnce } from "../../src/folds/index.ts";
import { foldOptionsFromVars } from "../../src/folds/options.ts";
import worker from "../../src/index.ts";
import { tenantObject } from "../../src/placement/index.ts";
import { connectionsOpened } from "../../src/postgres/index.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  lessor,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "../integration/harness.ts";

/** Each region's control-plane database, and the address its connections go to (the proxy cuts it). */
const regions = {
  us: { database: "lessor", address: () => addressOf(env.LESSOR_CONTROL_PLANE_URL) },
  eu: {
    database: "lessor_eu",
    address: () => addressOf(loadConfig(env).regions.get("eu")?.controlPlaneUrl ?? ""),
  },
} as const;
type RegionName = keyof typeof regions;

function addressOf(url: string): string {
  const parsed = new URL(url.replace(/^postgres(ql)?:/, "http:"));
  return `${parsed.hostname}:${parsed.port}`;
}

async function proxy(action: "block" | "unblock", region: RegionName): Promise<void> {
  const response = await fetch(
    `${env.TEST_PROXY_CONTROL_URL}/${action}?address=${encodeURIComponent(regions[region].address())}`,
  );
  expect(response.status).toBe(200);
  await response.text();
}

afterAll(async () => {
  await proxy("unblock", "us");
  await proxy("unblock", "eu");
});

interface RegionalTenant extends CreatedTenant {
  region: RegionName;
}

async function createIn(
  region: RegionName,
  prefix: string,
  extra: Record<string, unknown> = {},
): Promise<RegionalTenant> {
  const id = uniqueTenantId(prefix);
  const response = await admin("/v1/tenants", { method: "POST", json: { id, region, ...extra } });
  expect(response.status, await response.clone().text()).toBe(201);
  const body = await response.json<{
    key: string;
    connectionString: string;
    tenant: { region: string; host: string };
  }>();
  expect(body.tenant.region).toBe(region);
  const placed = await catalogRow(region, id);
  if (!placed) throw new Error(`no catalog row for ${id} in ${region}`);
  return {
    id,
    key: body.key,
    connectionString: body.connectionString,
    database: placed.database_name,
    role: placed.role_name,
    region,
  };
}

/** The tenant's catalog row in `region`'s control plane, read behind Lessor's back. */
async function catalogRow(region: RegionName, id: string) {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT host, database_name, role_name FROM tenants WHERE id = $1", [
      id,
    ]);
    return rows[0] as { host: string; database_name: string; role_name: string } | undefined;
  }, regions[region].database);
}

/** Every row a region's control plane holds about `id`, table by table (0 everywhere: it holds nothing). */
async function rowsAbout(region: RegionName, id: string): Promise<Record<string, number>> {
  return asSuperuser(async (client) => {
    const counts: Record<string, number> = {};
    for (const table of [
      "tenants",
      "tenant_keys",
      "tenant_credentials",
      "generation_ledger",
      "lifecycle_events",
      "usage_deltas",
      "audit_log",
    ]) {
      const column = table === "tenants" ? "id" : "tenant_id";
      const { rows } = await client.query(`SELECT count(*)::int AS n FROM ${table} WHERE ${column} = $1`, [
        id,
      ]);
      counts[table] = Number(rows[0]?.n ?? 0);
    }
    return counts;
  }, regions[region].database);
}

async function select(tenant: CreatedTenant, value = 1): Promise<{ status: number; appName: string | null }> {
  const response = await sqlRequest(tenant.connectionString, {
    query: "SELECT $1::int AS v, current_setting('application_name') AS app",
    params: [value],
  });
  if (response.status !== 200) {
    await response.text();
    return { status: response.status, appName: null };
  }
  // sqlRequest asks for array mode and raw text, as the driver does.
  const body = await response.json<{ rows: string[][] }>();
  expect(Number(body.rows[0]?.[0])).toBe(value);
  return { status: 200, appName: body.rows[0]?.[1] ?? null };
}

describe("a tenant in each region", () => {
  it("keeps each tenant's catalog in its own region's control plane, names the region in its key, and serves both", async () => {
    const us = await createIn("us", "home");
    const eu = await createIn("eu", "resident");
    // The catalog: each row in its region only; the eu tenant is on an eu host.
    expect((await catalogRow("eu", eu.id))?.host).toBe("eu-1");
    expect(await catalogRow("us", eu.id)).toBeUndefined();
    expect(await catalogRow("eu", us.id)).toBeUndefined();
    expect((await rowsAbout("us", eu.id)).tenants).toBe(0);
    // The keys: the default region's in the format keys always had (48 bytes), the eu one naming eu.
    expect(fromBase64Url(us.key.slice(4)).byteLength).toBe(48);
    const euKey = fromBase64Url(eu.key.slice(4));
    expect(new TextDecoder().decode(euKey.subarray(48))).toBe("eu");
    // Both serve.
    expect((await select(us)).status).toBe(200);
    const served = await select(eu);
    expect(served.status).toBe(200);
    expect(served.appName).toMatch(new RegExp(`^lessor:${eu.role}:[0-9]+$`));
    // The eu tenant's object is the eu one (`<id>@eu`, in the eu jurisdiction): it knows its record;
    // the default region's object of that name was never created.
    const euStatus = await tenantObject(env, "eu", eu.id).status();
    expect(euStatus.state).toBe("ready");
    const defaultId = env.TENANTS.idFromName(eu.id).toString();
    expect((await listDurableObjectIds(env.TENANTS)).map((id) => id.toString())).not.toContain(defaultId);
    // The object learned its region from its own name.
    const name = await runInDurableObject(
      tenantObject(env, "eu", eu.id),
      (_instance, state) => state.id.name,
    );
    expect(name).toBe(`${eu.id}@eu`);
    // Its generations, events and usage go to eu's control plane.
    await pollUntil(
      () => rowsAbout("eu", eu.id),
      (rows) => (rows.generation_ledger ?? 0) > 0,
    );
    expect(await rowsAbout("us", eu.id)).toEqual({
      tenants: 0,
      tenant_keys: 0,
      tenant_credentials: 0,
      generation_ledger: 0,
      lifecycle_events: 0,
      usage_deltas: 0,
      audit_log: 0,
    });
  });
});

/** A key of `tenant`'s whose region was rewritten to `region` (its MAC left as it was). */
function renamedKey(key: string, region: string | null): string {
  const bytes = fromBase64Url(key.slice(4));
  const name = new TextEncoder().encode(region ?? "");
  const forged = new Uint8Array(48 + name.byteLength);
  forged.set(bytes.subarray(0, 48));
  forged[0] = region === null ? 1 : 2;
  forged.set(name, 48);
  return `lsk_${toBase64Url(forged)}`;
}

describe("a forged key naming another region", () => {
  it("is refused at the edge like any forged key: no object, no connection, no control plane", async () => {
    const eu = await createIn("eu", "forge-eu");
    const us = await createIn("us", "forge-us");
    const forgeries = [
      // The eu tenant's own key, claiming the default region or an unknown one.
      { tenant: eu, key: renamedKey(eu.key, null) },
      { tenant: eu, key: renamedKey(eu.key, "us") },
      { tenant: eu, key: renamedKey(eu.key, "mars") },
      // The us tenant's key, claiming eu.
      { tenant: us, key: renamedKey(us.key, "eu") },
    ];
    const objectsBefore = new Set((await listDurableObjectIds(env.TENANTS)).map((id) => id.toString()));
    const opened = connectionsOpened();
    for (const { tenant, key } of forgeries) {
      const sql = await sqlRequest(tenant.connectionString.replace(tenant.key, key), { query: "SELECT 1" });
      expect(sql.status).toBe(400);
      expect(await sql.json()).toMatchObject({ code: "28P01" });
      const rest = await lessor(`/v1/tenants/${tenant.id}/usage`, {
        headers: { Authorization: `Bearer ${key}` },
      });
      expect(rest.status).toBe(401);
      expect(await rest.json()).toMatchObject({ code: "invalid_credentials" });
    }
    const objectsAfter = (await listDurableObjectIds(env.TENANTS)).map((id) => id.toString());
    expect(objectsAfter.filter((id) => !objectsBefore.has(id))).toEqual([]);
    expect(connectionsOpened()).toEqual(opened);
    // The real keys still work (and the counters above are ones that move).
    expect((await select(eu)).status).toBe(200);
    expect((await select(us)).status).toBe(200);
    expect(connectionsOpened().tenant).toBeGreaterThan(opened.tenant);
  });
});

describe("capacity by region", () => {
  const euHosts = () => loadConfig(env).regions.get("eu")?.hosts ?? [];

  it("lists only the asked region's hosts, and says which region they are, in /v1/capacity and the eviction dry run", async () => {
    expect(euHosts()).toEqual(["eu-1", "eu-2"]);
    const eu = await admin("/v1/capacity?region=eu");
    expect(eu.status).toBe(200);
    const euBody = await eu.json<{ region: string; hosts: { host: string }[]; tunnels: unknown[] }>();
    expect(euBody.hosts.map((h) => h.host)).toEqual(euHosts());
    expect(euBody.region).toBe("eu");

    // The default region without ?region=: its hosts, none of eu's.
    const home = await admin("/v1/capacity");
    const homeBody = await home.json<{ region: string; hosts: { host: string }[] }>();
    expect(homeBody.region).toBe("us");
    const homeHosts = homeBody.hosts.map((h) => h.host);
    expect(homeHosts).toEqual(loadConfig(env).regions.get("us")?.hosts);
    expect(homeHosts).toContain("local");
    expect(homeHosts.filter((h) => euHosts().includes(h))).toEqual([]);

    const dryRun = await admin("/v1/capacity/evictions?region=eu");
    expect(dryRun.status).toBe(200);
    const dryRunBody = await dryRun.json<{ region: string; hosts: { host: string }[] }>();
    expect(dryRunBody.region).toBe("eu");
    expect(dryRunBody.hosts.map((h) => h.host)).toEqual(euHosts());
    // A host of another region, named: refused with the region it is in, not listed as this one's.
    const elsewhere = await admin("/v1/capacity/evictions?region=eu&host=local");
    expect(elsewhere.status).toBe(400);
    expect(await elsewhere.json()).toMatchObject({ code: "host_not_in_region" });
  });
});

/** Rolls a tenant back to schema version 2, behind Lessor's back, so a campaign has work to do. */
async function rollBackToVersion2(tenant: RegionalTenant): Promise<void> {
  await asSuperuser(async (client) => {
    await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
    await client.query("DELETE FROM lessor.schema_migrations WHERE version > 2");
  }, tenant.database);
  await asSuperuser(
    (client) => client.query("UPDATE tenants SET schema_version = 2 WHERE id = $1", [tenant.id]),
    regions[tenant.region].database,
  );
}

async function schemaVersionOf(tenant: RegionalTenant): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT max(version)::int AS v FROM lessor.schema_migrations");
    return Number(rows[0]?.v ?? 0);
  }, tenant.database);
}

/** Runs one cron tick through the Worker's scheduled handler; answers every job's report. */
async function cronTick(): Promise<JobReport[]> {
  const runs: Promise<unknown>[] = [];
  const ctx = {
    waitUntil: (promise: Promise<unknown>) => runs.push(promise),
    passThroughOnException: () => undefined,
    props: {},
  };
  await worker.scheduled?.(
    createScheduledController({ cron: "* * * * *", scheduledTime: Date.now() }),
    env,
    ctx as unknown as ExecutionContext,
  );
  return (await Promise.all(runs)) as JobReport[];
}

/** Kills a tenant's object in `region` (its memory goes; its storage stays), as a deploy would. */
async function resetObject(tenant: RegionalTenant): Promise<void> {
  const outcome = await runInDurableObject(
    tenantObject(env, tenant.region, tenant.id),
    (_instance, state) => {
      state.abort("test: object reset");
    },
  ).then(
    () => "not reset",
    (error: unknown) => String(error),
  );
  expect(outcome).toMatch(/object reset/);
}

describe("one region's control plane down", () => {
  for (const [down, up] of [
    ["us", "eu"],
    ["eu", "us"],
  ] as const) {
    it(`leaves region ${up} unaffected while ${down}'s control plane is cut off: creates, cold starts, the warm path, campaigns, folds, erase, cron`, async () => {
      const downWarm = await createIn(down, `warm-${down}`);
      const downCold = await createIn(down, `cold-${down}`);
      const upWarm = await createIn(up, `warm-${up}`);
      const upCold = await createIn(up, `cold-${up}`);
      const upMigrating = await createIn(up, `mig-${up}`);
      const upDoomed = await createIn(up, `doomed-${up}`);
      for (const tenant of [downWarm, upWarm, upMigrating]) expect((await select(tenant)).status).toBe(200);
      await rollBackToVersion2(upMigrating);
      await resetObject(downCold);
      await resetObject(upCold);

      await proxy("block", down);
      try {
        // The region that is down: warm tenants still serve (ADR 010), a cold start cannot read its
        // sealed credential, and a create there cannot write its catalog. The cut is real.
        expect((await select(downWarm)).status).toBe(200);
        const refused = await sqlRequest(downCold.connectionString, { query: "SELECT 1" });
        expect(refused.status).toBe(503);
        expect(await refused.json()).toMatchObject({ code: "control_plane_unavailable" });
        const noCreate = await admin("/v1/tenants", {
          method: "POST",
          json: { id: uniqueTenantId("nope"), region: down },
        });
        expect(noCreate.status).toBe(503);
        expect(await noCreate.json()).toMatchObject({ code: "control_plane_unavailable" });

        // The region that is up notices nothing.
        const created = await createIn(up, `new-${up}`);
        expect((await select(created)).status).toBe(200);
        expect((await select(upCold)).status).toBe(200);
        for (let i = 0; i < 5; i++) expect((await select(upWarm, i)).status).toBe(200);
        const keys = await lessor(`/v1/tenants/${upWarm.id}/keys`, {
          headers: { Authorization: `Bearer ${upWarm.key}` },
        });
        expect(keys.status).toBe(200);
        await keys.text();

        // A campaign of the up region: created, advanced by its region's ticks, done.
        const campaign = await admin(`/v1/campaigns?region=${up}`, {
          method: "POST",
          json: { toVersion: 3, canary: [upMigrating.id], tenants: [upMigrating.id], force: true },
        });
        expect(campaign.status, await campaign.clone().text()).toBe(201);
        const { campaign: started } = await campaign.json<{ campaign: { id: string } }>();
        let state = "pending";
        for (let tick = 0; tick < 12 && state !== "done"; tick++) {
          const report = await runCampaignTick(env, {
            region: up,
            campaignId: started.id,
            now: Date.now() + tick * 3_600_000,
          });
          state = report.campaigns[0]?.to ?? state;
        }
        expect(state).toBe("done");
        expect(await schemaVersionOf(upMigrating)).toBe(3);

        // A fold of the up region drains its usage deltas.
        await pollUntil(
          () => rowsAbout(up, upWarm.id),
          (rows) => (rows.usage_deltas ?? 0) > 0,
          { attempts: 40, intervalMs: 250 },
        );
        const fold = await foldOnce(loadConfig(env), env, up, foldOptionsFromVars(env), Date.now());
        expect(fold.outcome.kind).toBe("folded");

        // An erase in the up region runs to its tombstone.
        const erase = await admin(`/v1/tenants/${upDoomed.id}?confirm=${upDoomed.id}&region=${up}`, {
          method: "DELETE",
        });
        expect(erase.status).toBe(202);
        await erase.text();
        const erased = await pollUntil(
          async () =>
            (await admin(`/v1/tenants/${upDoomed.id}/erase?region=${up}`)).json<{ state: string }>(),
          (view) => view.state === "erased",
          { attempts: 120, intervalMs: 250 },
        );
        expect(erased.state).toBe("erased");

        // The cron: every job of the up region ran fine; the down region's control-plane jobs failed alone.
        const reports = await cronTick();
        const ofRegion = (region: string) =>
          Object.fromEntries(reports.filter((r) => r.region === region).map((r) => [r.job, r.status]));
        // Seven jobs a minute (audit retention runs once per sweep, docs/adr/028); the host sweep
        // needs no control plane, nor do rotation without a policy and reseal with one key, so they
        // are ok in the down region too.
        expect(Object.values(ofRegion(up))).toHaveLength(7);
        expect(new Set(Object.values(ofRegion(up)))).toEqual(new Set(["ok"]));
        expect(ofRegion(down)).toEqual({
          "usage-fold": "failed",
          "erase-resume": "failed",
          "move-resume": "failed",
          "migration-campaigns": "failed",
          "host-sweep": "ok",
          "credential-rotation": "ok",
          reseal: "ok",
        });

        // Status and metrics: the up region reads whole, the down one says its control plane is down.
        const upView = await (await admin(`/v1/fleet/overview?region=${up}`)).json<{
          region: string;
          controlPlane: string;
        }>();
        expect(upView).toMatchObject({ region: up, controlPlane: "up" });
        const downView = await (await admin(`/v1/fleet/overview?region=${down}`)).json<{
          controlPlane: string;
        }>();
        expect(downView.controlPlane).toBe("down");
        const metrics = await (await admin("/metrics")).text();
        expect(metrics).toContain(`lessor_control_plane_up{region="${up}"} 1`);
        expect(metrics).toContain(`lessor_control_plane_up{region="${down}"} 0`);
      } finally {
        await proxy("unblock", down);
      }
      // Back: the down region's cold tenant starts.
      const back = await pollUntil(
        () => select(downCold),
        (answer) => answer.status === 200,
        { attempts: 40, intervalMs: 250 },
      );
      expect(back.status).toBe(200);
    });
  }
});
