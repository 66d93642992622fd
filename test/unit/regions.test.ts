/**
 * Regions (docs/adr/023-regions.md) as pure code: the configuration and its refusals, keys that
 * name their region inside the MAC, and where a region's objects are created.
 */
import { describe, expect, it } from "vitest";
import { type LessorConfig, loadConfig, regionNamed } from "../../src/config/index.ts";
import {
  controlPlaneShardPlacement,
  parseTenantObjectName,
  type RegionPlacement,
  tenantObjectPlacement,
} from "../../src/core/placement.ts";
import { fromBase64Url, toBase64Url } from "../../src/crypto/encoding.ts";
import { type KeyMacRing, mintTenantKey, verifyTenantKey } from "../../src/crypto/tenant-keys.ts";
import { LessorError } from "../../src/errors/index.ts";
import { stubIn } from "../../src/placement/index.ts";

const controlPlaneUrl = "postgres://lessor_admin:pw@127.0.0.1:5432/lessor";

function envWith(vars: Record<string, string>): Env {
  return {
    LESSOR_POOL_SIZES: JSON.stringify({ free: 2, standard: 5 }),
    LESSOR_BUDGETS: JSON.stringify({ "*": { connections: 40 } }),
    LESSOR_HOSTS: JSON.stringify({
      "us-1": "postgres://x:y@10.0.0.1:5432/postgres",
      "us-2": "postgres://x:y@10.0.0.2:5432/postgres",
      "eu-1": "postgres://x:y@10.1.0.1:5432/postgres",
    }),
    LESSOR_CONTROL_PLANE_URL: controlPlaneUrl,
    LESSOR_ADMIN_KEY: "unit-admin",
    LESSOR_SEAL_KEY: "unit-seal",
    LESSOR_KEY_MAC_KEYS: btoa(String.fromCharCode(...new Uint8Array(32).fill(7))),
    ...vars,
  } as unknown as Env;
}

/** The `misconfigured` problem `loadConfig` names (its internal message), or null if it loads. */
function problemOf(vars: Record<string, string>): string | null {
  try {
    loadConfig(envWith(vars));
    return null;
  } catch (error) {
    if (!(error instanceof LessorError) || error.code !== "misconfigured") throw error;
    return error.message;
  }
}

const euUrl = "postgres://lessor_admin:pw@10.1.0.9:5432/lessor_eu";

describe("regions in the configuration", () => {
  it("without LESSOR_REGIONS, is one region named default on LESSOR_CONTROL_PLANE_URL with every host", () => {
    const config = loadConfig(envWith({}));
    expect([...config.regions.keys()]).toEqual(["default"]);
    expect(config.defaultRegion).toBe("default");
    expect(config.regions.get("default")).toMatchObject({
      controlPlaneUrl,
      hosts: ["us-1", "us-2", "eu-1"],
      jurisdiction: null,
      isDefault: true,
    });
    expect(config.defaultHost).toBe("us-1");
    expect([...config.hosts.values()].every((host) => host.region === "default")).toBe(true);
  });

  it("gives each host one region; the region without controlPlaneUrl is the default and takes the unnamed hosts", () => {
    const config = loadConfig(
      envWith({
        LESSOR_REGIONS: JSON.stringify({
          us: { locationHint: "enam" },
          eu: { controlPlaneUrl: euUrl, hosts: ["eu-1"], jurisdiction: "eu", locationHint: "weur" },
        }),
      }),
    );
    expect(config.defaultRegion).toBe("us");
    expect(config.regions.get("us")).toMatchObject({
      controlPlaneUrl,
      hosts: ["us-1", "us-2"],
      isDefault: true,
    });
    expect(config.regions.get("eu")).toMatchObject({
      controlPlaneUrl: euUrl,
      hosts: ["eu-1"],
      jurisdiction: "eu",
      locationHint: "weur",
      isDefault: false,
    });
    expect(config.hosts.get("eu-1")?.region).toBe("eu");
    expect(config.hosts.get("us-2")?.region).toBe("us");
    expect(config.defaultHost).toBe("us-1");
  });

  it("refuses each bad declaration with a message that names the region and the fix", () => {
    const regions = (value: unknown) => ({ LESSOR_REGIONS: JSON.stringify(value) });
    expect(problemOf({ LESSOR_REGIONS: "{" })).toMatch(/LESSOR_REGIONS: is not valid JSON/);
    expect(problemOf(regions(["us"]))).toMatch(/must be a JSON object/);
    expect(problemOf(regions({ US: {} }))).toMatch(/lowercase slugs/);
    expect(problemOf(regions({ us: "x" }))).toMatch(/region us must be an object/);
    expect(problemOf(regions({ us: { hots: [] } }))).toMatch(/unknown fields \(hots\)/);
    expect(problemOf(regions({ us: {}, eu: { controlPlaneUrl: "mysql://x" } }))).toMatch(
      /controlPlaneUrl must be a postgres:\/\/ connection string/,
    );
    expect(problemOf(regions({ us: {}, eu: { controlPlaneUrl: euUrl, hosts: ["nowhere"] } }))).toMatch(
      /names host nowhere, which LESSOR_HOSTS does not declare/,
    );
    expect(
      problemOf(regions({ us: { hosts: ["eu-1"] }, eu: { controlPlaneUrl: euUrl, hosts: ["eu-1"] } })),
    ).toMatch(/host eu-1 is in two regions \(us and eu\)/);
    expect(problemOf(regions({ us: {}, eu: { hosts: ["eu-1"] } }))).toMatch(
      /regions us and eu both leave out controlPlaneUrl/,
    );
    expect(problemOf(regions({ eu: { controlPlaneUrl: euUrl } }))).toMatch(
      /no region leaves out controlPlaneUrl/,
    );
    expect(problemOf(regions({ us: {}, eu: { controlPlaneUrl: controlPlaneUrl, hosts: ["eu-1"] } }))).toMatch(
      /share a control-plane database/,
    );
    expect(problemOf(regions({ us: {}, eu: { controlPlaneUrl: euUrl } }))).toMatch(/region eu has no host/);
    expect(
      problemOf(regions({ us: {}, eu: { controlPlaneUrl: euUrl, hosts: ["eu-1"], jurisdiction: "mars" } })),
    ).toMatch(/jurisdiction must be one of eu, fedramp, fedramp-high, us/);
    expect(problemOf(regions({ us: { locationHint: "moon" } }))).toMatch(/locationHint must be one of/);
    // A connection string is never in the message.
    expect(problemOf(regions({ us: {}, eu: { controlPlaneUrl: "mysql://u:secret@h/db" } }))).not.toMatch(
      /secret/,
    );
  });

  it("answers region_unknown (400) for a region the deployment lacks, naming the ones it has", () => {
    const config: LessorConfig = loadConfig(
      envWith({
        LESSOR_REGIONS: JSON.stringify({ us: {}, eu: { controlPlaneUrl: euUrl, hosts: ["eu-1"] } }),
      }),
    );
    expect(regionNamed(config, null).name).toBe("us");
    expect(regionNamed(config, "eu").name).toBe("eu");
    let refused: unknown;
    try {
      regionNamed(config, "mars");
    } catch (error) {
      refused = error;
    }
    expect(refused).toBeInstanceOf(LessorError);
    expect((refused as LessorError).code).toBe("region_unknown");
    expect((refused as LessorError).status).toBe(400);
    expect((refused as LessorError).publicMessage).toMatch(/has us, eu/);
  });
});

const ring: KeyMacRing = {
  current: 1,
  keys: new Map([[1, btoa(String.fromCharCode(...new Uint8Array(32).fill(9)))]]),
};

describe("keys that name their region", () => {
  it("carry the region inside the MAC; the default region's keep the format keys had before", async () => {
    const eu = await mintTenantKey(ring, "acme", "eu");
    expect(await verifyTenantKey(ring, "acme", eu.key)).toEqual({ keyId: eu.keyId, region: "eu" });
    const home = await mintTenantKey(ring, "acme");
    expect(await verifyTenantKey(ring, "acme", home.key)).toEqual({ keyId: home.keyId, region: null });
    // Longer by the region's name only.
    expect(fromBase64Url(eu.key.slice(4)).byteLength).toBe(48 + 2);
    expect(fromBase64Url(home.key.slice(4)).byteLength).toBe(48);
  });

  it("refuses a key whose region was changed, removed or added: each is a forged key", async () => {
    const eu = await mintTenantKey(ring, "acme", "eu");
    const bytes = fromBase64Url(eu.key.slice(4));
    const renamed = new Uint8Array(bytes);
    renamed.set(new TextEncoder().encode("us"), 48);
    expect(await verifyTenantKey(ring, "acme", `lsk_${toBase64Url(renamed)}`)).toBeNull();
    // The same MAC as a key of the default region (format 1, no region).
    const stripped = new Uint8Array(bytes.subarray(0, 48));
    stripped[0] = 1;
    expect(await verifyTenantKey(ring, "acme", `lsk_${toBase64Url(stripped)}`)).toBeNull();
    // A default-region key given a region.
    const home = fromBase64Url((await mintTenantKey(ring, "acme")).key.slice(4));
    const claimed = new Uint8Array(50);
    claimed.set(home);
    claimed[0] = 2;
    claimed.set(new TextEncoder().encode("eu"), 48);
    expect(await verifyTenantKey(ring, "acme", `lsk_${toBase64Url(claimed)}`)).toBeNull();
    // Another tenant's key of the same region.
    expect(await verifyTenantKey(ring, "other", eu.key)).toBeNull();
    // A region name that is not a slug, or too long.
    for (const name of ["EU", "e u", "a".repeat(17), ""]) {
      const odd = new Uint8Array(48 + name.length);
      odd.set(bytes.subarray(0, 48));
      odd.set(new TextEncoder().encode(name), 48);
      expect(await verifyTenantKey(ring, "acme", `lsk_${toBase64Url(odd)}`)).toBeNull();
    }
  });
});

describe("placement of a region's objects", () => {
  const us: RegionPlacement = { name: "us", jurisdiction: null, locationHint: "enam", isDefault: true };
  const eu: RegionPlacement = { name: "eu", jurisdiction: "eu", locationHint: "weur", isDefault: false };

  it("keeps the default region's names, and names every other region's objects apart", () => {
    expect(tenantObjectPlacement(us, "acme")).toEqual({
      jurisdiction: null,
      name: "acme",
      options: { locationHint: "enam" },
    });
    expect(tenantObjectPlacement(eu, "acme")).toEqual({
      jurisdiction: "eu",
      name: "acme@eu",
      options: { locationHint: "weur" },
    });
    // The host's hint wins: the database is what the object talks to most.
    expect(tenantObjectPlacement(eu, "acme", "eeur").options).toEqual({ locationHint: "eeur" });
    expect(parseTenantObjectName("acme")).toEqual({ tenantId: "acme", region: null });
    expect(parseTenantObjectName("acme@eu")).toEqual({ tenantId: "acme", region: "eu" });
    expect(controlPlaneShardPlacement(us, 3).name).toBe("shard-3");
    expect(controlPlaneShardPlacement(eu, 3)).toEqual({
      jurisdiction: "eu",
      name: "eu:shard-3",
      options: { locationHint: "weur" },
    });
  });
});

describe("the stub of a placed object", () => {
  /** A namespace that records what it is asked (workerd implements no jurisdiction). */
  function recordingNamespace() {
    const calls: string[] = [];
    const namespace = (scope: string | null): DurableObjectNamespace => {
      const ns = {
        jurisdiction: (jurisdiction: string) => {
          calls.push(`jurisdiction(${jurisdiction})`);
          return namespace(jurisdiction);
        },
        getByName: (name: string, options?: { locationHint?: string }) => {
          calls.push(`getByName(${scope ?? "-"}, ${name}, ${options?.locationHint ?? "-"})`);
          return { name } as unknown as DurableObjectStub;
        },
      };
      return ns as unknown as DurableObjectNamespace;
    };
    return { calls, namespace: namespace(null) };
  }

  it("asks the region's jurisdiction's namespace, with the hint, for a region that has one; the plain namespace otherwise", () => {
    const eu: RegionPlacement = { name: "eu", jurisdiction: "eu", locationHint: "weur", isDefault: false };
    const us: RegionPlacement = { name: "us", jurisdiction: null, locationHint: null, isDefault: true };
    const { calls, namespace } = recordingNamespace();
    stubIn(namespace, tenantObjectPlacement(eu, "acme"));
    stubIn(namespace, tenantObjectPlacement(us, "acme", "enam"));
    stubIn(namespace, controlPlaneShardPlacement(eu, 0));
    expect(calls).toEqual([
      "jurisdiction(eu)",
      "getByName(eu, acme@eu, weur)",
      "getByName(-, acme, enam)",
      "jurisdiction(eu)",
      "getByName(eu, eu:shard-0, weur)",
    ]);
  });
});
