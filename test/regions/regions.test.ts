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
  createTenant,
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
      const { rows } = await client.query(`SELECT count(*)::int AS n FROM ${table} WHERE ${column} = $1`, [id]);
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
