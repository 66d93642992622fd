/**
 * Typed configuration from the Worker's vars and secrets. Parsed once per isolate and per env
 * object; a bad value is a `misconfigured` error that names the setting, never its value.
 */
import { type AdaptivePolicy, adaptiveBounds, defaultAdaptivePolicy } from "../core/adaptive.ts";
import { type BudgetLimits, validateLimits } from "../core/budget.ts";
import {
  type ContainmentLevel,
  type HostKind,
  hostKinds,
  impliedHostKind,
  isPoolerHostname,
} from "../core/host-capabilities.ts";
import { hostTenancyLimits, kindTenancyLimits, type TenancyLimits } from "../core/host-room.ts";
import { maxPoolSize } from "../core/pool-size.ts";
import { tunnelBudgetName } from "../core/tunnel.ts";
import { type KeyMacRing, parseKeyMacRing } from "../crypto/tenant-keys.ts";
import { LessorError } from "../errors/index.ts";
import {
  addressKey,
  type HostPath,
  type HostPathKind,
  hostPathOf,
  hostPathProblem,
  hostPaths,
  type SslMode,
  sslModes,
} from "./host-paths.ts";

export interface DatabaseHost {
  name: string;
  /** Admin connection string (a secret): used only to create tenant databases and roles. */
  adminUrl: string;
  hostname: string;
  port: number;
  budget: BudgetLimits;
  /** What the host is (docs/adr/016-host-kinds.md): how passwords travel, which URLs are allowed. */
  kind: HostKind;
  /** How its connections reach it (src/config/host-paths.ts): `tcp` or `websocket`, and the TLS demanded. */
  path: HostPath;
  /** `full` (default): refuse to run without the login guard; `reduced`: run without it, knowingly. */
  containment: ContainmentLevel;
  /** Where Cloudflare should create the host's objects (a location hint), or null: near the first caller. */
  locationHint: LocationHint | null;
  /** The region the host is in (docs/adr/023-regions.md): its tenants' catalog lives in that region's control plane. */
  region: string;
  /**
   * Adaptive admission on this host (docs/adr/022-adaptive-admission.md), or null: every pool holds
   * its tier's size, as before. Off unless the host's budget says `"adaptive": true` (or settings).
   */
  adaptive: AdaptivePolicy | null;
  /**
   * The tenants it may hold, in databases and roles (docs/adr/028-a-fleet-that-sleeps.md): its
   * kind's limits (Neon's per branch), lowered by `maxDatabases` / `maxRoles`; null: no limit.
   */
  tenancy: TenancyLimits;
}

/**
 * A customer's tunnel (docs/adr/018-customer-databases-behind-tunnels.md): the WebSocket proxy at
 * its end, in the customer's network, through which Lessor reaches databases it did not create;
 * and the connections it may carry, budgeted by a BudgetObject of its own (`tunnel:<name>`).
 */
export interface Tunnel {
  name: string;
  /** `tunnel:<name>`: its BudgetObject's name, and the `host` of every tenant behind it. */
  budgetName: string;
  /** The proxy's address without a scheme (`pg.example.com`, `127.0.0.1:9000/path`). */
  proxy: string;
  /** `wss://` (always, but on loopback). */
  secure: boolean;
  /** `connections`: the tunnel's capacity; `reserve`: its maintenance share; no rotation overlap beyond it. */
  budget: BudgetLimits;
  /** A connect through the tunnel that has not finished its handshake by then fails as `slow`. */
  connectTimeoutMs: number;
  locationHint: LocationHint | null;
}

/** What a BudgetObject budgets: a database host, or a customer's tunnel. */
export interface BudgetSubject {
  name: string;
  budget: BudgetLimits;
  locationHint: LocationHint | null;
  /** Set for a tunnel's budget. */
  tunnel: Tunnel | null;
  /** Adaptive admission (docs/adr/022): a host's setting; a tunnel's pools keep their size. */
  adaptive: AdaptivePolicy | null;
}

/** The host or tunnel a budget name names, or null. */
export function budgetSubject(config: LessorConfig, name: string): BudgetSubject | null {
  const host = config.hosts.get(name);
  if (host)
    return {
      name,
      budget: host.budget,
      locationHint: host.locationHint,
      tunnel: null,
      adaptive: host.adaptive,
    };
  const tunnel = config.tunnelsByBudgetName.get(name);
  if (tunnel)
    return { name, budget: tunnel.budget, locationHint: tunnel.locationHint, tunnel, adaptive: null };
  return null;
}

/** Cloudflare's Durable Object jurisdictions: objects created in one never leave it. */
export const jurisdictions = ["eu", "fedramp", "fedramp-high", "us"] as const;
export type Jurisdiction = (typeof jurisdictions)[number];

/**
 * A region (docs/adr/023-regions.md): a control-plane database of its own and the database hosts
 * whose tenants it holds. A tenant's catalog row, keys, sealed credential, ledgers, erase progress
 * and audit rows live only in its region's control plane, and its objects are created in the region.
 */
export interface Region {
  name: string;
  /** The region's control-plane connection string (a secret). */
  controlPlaneUrl: string;
  /** Hosts in the region, in the order declared. */
  hosts: readonly string[];
  /** Where the region's Durable Objects must stay (a guarantee), or null. */
  jurisdiction: Jurisdiction | null;
  /** Where the region's Durable Objects should be created (a preference), or null. */
  locationHint: LocationHint | null;
  /**
   * The default region: its control plane is `LESSOR_CONTROL_PLANE_URL`, keys minted without a
   * region name are its keys, and its objects keep the names they had before regions existed.
   */
  isDefault: boolean;
}

/** A region's name: a short lowercase slug (it rides in every key minted in the region). */
export const regionNamePattern = /^[a-z][a-z0-9-]{0,15}$/;

/** The one region of a deployment that declares none. */
export const implicitRegionName = "default";

/** Cloudflare's Durable Object location hints (developers.cloudflare.com, "Data location"). */
export const locationHints = ["wnam", "enam", "sam", "weur", "eeur", "apac", "oc", "afr", "me"] as const;
export type LocationHint = (typeof locationHints)[number];

export interface LessorConfig {
  idleTimeoutMs: number;
  maxBodyBytes: number;
  /**
   * Each tier's maximum pool size: a hard cap (the tenant role's `CONNECTION LIMIT` is this plus
   * one). A fixed-size pool holds its tier's `poolStartSizes` entry, which is this unless the tier
   * names a smaller `size`.
   */
  poolSizes: ReadonlyMap<string, number>;
  /** Each tier's size: what a pool holds on a fixed host, and what it starts with on an adaptive one. */
  poolStartSizes: ReadonlyMap<string, number>;
  defaultTier: string;
  hosts: ReadonlyMap<string, DatabaseHost>;
  defaultHost: string;
  /** Customers' tunnels by name (`LESSOR_TUNNELS`); none by default. */
  tunnels: ReadonlyMap<string, Tunnel>;
  /** The same tunnels by budget name (`tunnel:<name>`). */
  tunnelsByBudgetName: ReadonlyMap<string, Tunnel>;
  wsProxy: string | null;
  /** Each declared host's path, by `hostname:port` (src/config/host-paths.ts `addressKey`). */
  pathsByAddress: ReadonlyMap<string, HostPath>;
  /** How long a pool start waits for budget before `capacity_saturated`. */
  admissionWaitMs: number;
  /** Longest TTL a session lease may ask for; each use extends it by its TTL, up to this. */
  leaseMaxTtlMs: number;
  /** A drain that has waited this long for leases reports them as overdue. */
  maxDrainMs: number;
  /** Longest any tenant statement (or `/sql` transaction) may run before it is cancelled. */
  statementTimeoutMs: number;
  /** A tenant migration running longer is cancelled (its step rolls back) and reported failed. */
  migrationTimeoutMs: number;
  /** A session lease ends this long after it was opened, however often it is renewed. */
  leaseMaxLifetimeMs: number;
  /** `temp_file_limit` for tenant roles (superuser-only, so the tenant cannot lift it); null: host default. */
  tempFileLimit: string | null;
  /** Largest `/sql` or lease answer; a bigger result stops being read and is answered 507. */
  maxResponseBytes: number;
  /**
   * A wire connection's high-water mark per hop and direction (docs/adr/017-wire-protocol.md,
   * "Bounds"): what the edge holds of a client, what the server may owe, what is in flight back.
   */
  wireBufferBytes: number;
  /** How long a wire client's side may leave what was sent to it untaken before it is refused. */
  wireDrainMs: number;
  /** A wire connection is told to reconnect, between transactions, after this long … */
  wireMaxLifetimeMs: number;
  /** … or after its edge relayed this many frames, so the edge's CPU stays under `cpu_ms`. */
  wireMaxFrames: number;
  /** The MAC keys tenant keys are minted and checked under. */
  keyMacRing: KeyMacRing;
  /** Usable keys a tenant may hold at once. */
  maxKeysPerTenant: number;
  /** ControlPlaneObject shards, and the connections each holds at most. */
  controlPlaneShards: number;
  controlPlanePoolSize: number;
  /** Rotate a tenant's database credential once it is this many days old; null: no scheduled rotation. */
  credentialRotationDays: number | null;
  /** Tenants the scheduled rotation rotates per cron tick at most. */
  credentialRotationBatch: number;
  /** How long an erase waits for running statements and session leases before it ends them. */
  eraseLeaseWaitMs: number;
  /** Audit rows older than this many days are aged out by the cron trigger. */
  auditRetentionDays: number;
  /** Credentials the cron trigger reseals per tick at most while the seal key ring holds old keys; 0: off. */
  resealBatch: number;
  /**
   * How often fleet work that must visit everything runs (docs/adr/028-a-fleet-that-sleeps.md): a
   * host with nothing to look at is visited once in this many minutes; audit retention runs once
   * in it.
   */
  sweepMinutes: number;
  /**
   * The hosts a new tenant may go to when its create names none (`LESSOR_PLACEMENT_HOSTS`, comma
   * separated; every host by default). A host left out takes new tenants only when named: one
   * being retired, or one kept for a purpose.
   */
  placementHosts: ReadonlySet<string>;
  /** Where the control plane's shards should be created (near its database), or null. */
  controlPlaneLocationHint: LocationHint | null;
  /** The regions, in the order declared (one, named `default`, without `LESSOR_REGIONS`). */
  regions: ReadonlyMap<string, Region>;
  /** The default region's name: where tenants are created unless another region is named. */
  defaultRegion: string;
}

/** Maintenance connections a host keeps back when its budget names no reserve. */
export const defaultReserve = 2;

export { maxPoolSize } from "../core/pool-size.ts";

const cache = new WeakMap<object, LessorConfig>();

function fail(setting: string, problem: string): never {
  throw new LessorError("misconfigured", { internal: `${setting}: ${problem}` });
}

/** `LESSOR_PLACEMENT_HOSTS`: configured host names, comma separated; unset or empty: every host. */
function placementHosts(raw: string | undefined, hosts: ReadonlyMap<string, unknown>): ReadonlySet<string> {
  if (raw === undefined || raw.trim() === "") return new Set(hosts.keys());
  const names = raw
    .split(",")
    .map((name) => name.trim())
    .filter((name) => name !== "");
  const unknown = names.filter((name) => !hosts.has(name));
  if (unknown.length > 0)
    fail("LESSOR_PLACEMENT_HOSTS", `names hosts not in LESSOR_HOSTS: ${unknown.join(", ")}`);
  return new Set(names);
}

function positiveInt(setting: string, raw: string | undefined, fallback: number): number {
  if (raw === undefined || raw === "") return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value <= 0) fail(setting, "must be a positive integer");
  return value;
}

function jsonObject(setting: string, raw: string | undefined): Record<string, unknown> {
  if (!raw) fail(setting, "is not set");
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw);
  } catch {
    fail(setting, "is not valid JSON");
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed))
    fail(setting, "must be a JSON object");
  return parsed as Record<string, unknown>;
}

/** A Postgres size such as `1GB` or `512MB`; empty means the host's own default. */
function tempFileLimit(raw: string | undefined): string | null {
  if (raw === undefined) return "1GB";
  if (raw === "") return null;
  if (!/^[1-9][0-9]{0,9}(kB|MB|GB|TB)$/.test(raw))
    fail("LESSOR_TEMP_FILE_LIMIT", "must be a size such as 1GB");
  return raw;
}

interface HostEntry {
  url: string;
  kind?: HostKind;
  path?: HostPathKind;
  sslmode?: SslMode;
  containment?: ContainmentLevel;
  locationHint?: LocationHint;
  maxDatabases?: number;
  maxRoles?: number;
}

/**
 * One `LESSOR_HOSTS` value: an admin connection string (a Postgres host of the kind its name
 * implies), or `{ "url", "kind", "containment", "locationHint" }`.
 */
function hostEntry(name: string, entry: unknown): HostEntry {
  if (typeof entry === "string") return { url: entry };
  if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
    fail("LESSOR_HOSTS", `host ${name} needs an admin connection string, or an object with "url"`);
  }
  const { url, kind, containment, locationHint, path, sslmode, maxDatabases, maxRoles, ...rest } =
    entry as Record<string, unknown>;
  const unknown = Object.keys(rest);
  if (unknown.length > 0) {
    fail(
      "LESSOR_HOSTS",
      `host ${name} has unknown fields (${unknown.join(", ")}); known: url, kind, path, sslmode, containment, locationHint, maxDatabases, maxRoles`,
    );
  }
  if (path !== undefined && !(hostPaths as readonly unknown[]).includes(path)) {
    fail("LESSOR_HOSTS", `host ${name}: path must be one of ${hostPaths.join(", ")}`);
  }
  if (sslmode !== undefined && !(sslModes as readonly unknown[]).includes(sslmode)) {
    fail("LESSOR_HOSTS", `host ${name}: sslmode must be one of ${sslModes.join(", ")}`);
  }
  if (typeof url !== "string") fail("LESSOR_HOSTS", `host ${name} needs "url", its admin connection string`);
  if (kind !== undefined && !(hostKinds as readonly unknown[]).includes(kind)) {
    fail("LESSOR_HOSTS", `host ${name}: kind must be one of ${hostKinds.join(", ")}`);
  }
  if (containment !== undefined && containment !== "full" && containment !== "reduced") {
    fail("LESSOR_HOSTS", `host ${name}: containment must be "full" or "reduced"`);
  }
  if (locationHint !== undefined && !(locationHints as readonly unknown[]).includes(locationHint)) {
    fail("LESSOR_HOSTS", `host ${name}: locationHint must be one of ${locationHints.join(", ")}`);
  }
  const limit = (field: string, value: unknown): number | undefined => {
    if (value === undefined) return undefined;
    if (!Number.isInteger(value) || (value as number) <= 0)
      fail("LESSOR_HOSTS", `host ${name}: ${field} must be a positive integer`);
    return value as number;
  };
  const databases = limit("maxDatabases", maxDatabases);
  const roles = limit("maxRoles", maxRoles);
  return {
    url,
    ...(databases === undefined ? {} : { maxDatabases: databases }),
    ...(roles === undefined ? {} : { maxRoles: roles }),
    ...(kind === undefined ? {} : { kind: kind as HostKind }),
    ...(path === undefined ? {} : { path: path as HostPathKind }),
    ...(sslmode === undefined ? {} : { sslmode: sslmode as SslMode }),
    ...(containment === undefined ? {} : { containment: containment as ContainmentLevel }),
    ...(locationHint === undefined ? {} : { locationHint: locationHint as LocationHint }),
  };
}

function locationHint(setting: string, raw: string | undefined): LocationHint | null {
  if (raw === undefined || raw === "") return null;
  if (!(locationHints as readonly string[]).includes(raw)) {
    fail(setting, `must be one of ${locationHints.join(", ")}`);
  }
  return raw as LocationHint;
}

/** Whether a `host:port` (or a URL) names this machine's loopback. */
function isLoopbackAddress(address: string): boolean {
  const rest = address.replace(/^[a-z]+:\/\//i, "");
  const host = rest.startsWith("[") ? rest.slice(1, rest.indexOf("]")) : rest.replace(/[:/].*$/, "");
  return host === "localhost" || host === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

/**
 * `LESSOR_REGIONS` (optional; a secret, as it holds connection strings): region name →
 * `{ "controlPlaneUrl"?, "hosts"?, "jurisdiction"?, "locationHint"? }`. Exactly one region leaves
 * out `controlPlaneUrl`: it is the default region, on `LESSOR_CONTROL_PLANE_URL`, and it holds every
 * host no region names. Unset: one region named `default` holds every host.
 */
function parseRegions(
  raw: string | undefined,
  controlPlaneUrl: string,
  hostNames: readonly string[],
  controlPlaneHint: LocationHint | null,
): { regions: Map<string, Region>; hostRegion: Map<string, string>; defaultRegion: string } {
  const hostRegion = new Map<string, string>();
  if (raw === undefined || raw === "") {
    for (const host of hostNames) hostRegion.set(host, implicitRegionName);
    const region: Region = {
      name: implicitRegionName,
      controlPlaneUrl,
      hosts: hostNames,
      jurisdiction: null,
      locationHint: controlPlaneHint,
      isDefault: true,
    };
    return {
      regions: new Map([[implicitRegionName, region]]),
      hostRegion,
      defaultRegion: implicitRegionName,
    };
  }
  const declared = jsonObject("LESSOR_REGIONS", raw);
  const regions = new Map<string, Region>();
  let defaultRegion: string | null = null;
  for (const [name, entry] of Object.entries(declared)) {
    if (!regionNamePattern.test(name)) {
      fail(
        "LESSOR_REGIONS",
        `region names are lowercase slugs of at most 16 characters (${JSON.stringify(name.slice(0, 40))} is not)`,
      );
    }
    if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
      fail("LESSOR_REGIONS", `region ${name} must be an object`);
    }
    const {
      controlPlaneUrl: url,
      hosts,
      jurisdiction,
      locationHint: hint,
      ...rest
    } = entry as Record<string, unknown>;
    const unknown = Object.keys(rest);
    if (unknown.length > 0) {
      fail(
        "LESSOR_REGIONS",
        `region ${name} has unknown fields (${unknown.join(", ")}); known: controlPlaneUrl, hosts, jurisdiction, locationHint`,
      );
    }
    if (url !== undefined && (typeof url !== "string" || !/^postgres(ql)?:\/\//.test(url))) {
      fail("LESSOR_REGIONS", `region ${name}: controlPlaneUrl must be a postgres:// connection string`);
    }
    if (hosts !== undefined && (!Array.isArray(hosts) || hosts.some((h) => typeof h !== "string"))) {
      fail("LESSOR_REGIONS", `region ${name}: hosts must be a list of host names`);
    }
    if (jurisdiction !== undefined && !(jurisdictions as readonly unknown[]).includes(jurisdiction)) {
      fail("LESSOR_REGIONS", `region ${name}: jurisdiction must be one of ${jurisdictions.join(", ")}`);
    }
    if (hint !== undefined && !(locationHints as readonly unknown[]).includes(hint)) {
      fail("LESSOR_REGIONS", `region ${name}: locationHint must be one of ${locationHints.join(", ")}`);
    }
    for (const host of (hosts ?? []) as string[]) {
      if (!hostNames.includes(host))
        fail("LESSOR_REGIONS", `region ${name} names host ${host}, which LESSOR_HOSTS does not declare`);
      const other = hostRegion.get(host);
      if (other !== undefined)
        fail("LESSOR_REGIONS", `host ${host} is in two regions (${other} and ${name}); a host is in one`);
      hostRegion.set(host, name);
    }
    if (url === undefined) {
      if (defaultRegion !== null) {
        fail(
          "LESSOR_REGIONS",
          `regions ${defaultRegion} and ${name} both leave out controlPlaneUrl; exactly one region (the default) uses LESSOR_CONTROL_PLANE_URL`,
        );
      }
      defaultRegion = name;
    }
    regions.set(name, {
      name,
      controlPlaneUrl: (url as string | undefined) ?? controlPlaneUrl,
      hosts: (hosts ?? []) as string[],
      jurisdiction: (jurisdiction as Jurisdiction | undefined) ?? null,
      locationHint: (hint as LocationHint | undefined) ?? null,
      isDefault: url === undefined,
    });
  }
  if (defaultRegion === null) {
    fail(
      "LESSOR_REGIONS",
      "no region leaves out controlPlaneUrl; exactly one region (the default) uses LESSOR_CONTROL_PLANE_URL",
    );
  }
  const urls = new Map<string, string>();
  for (const region of regions.values()) {
    const other = urls.get(region.controlPlaneUrl);
    if (other !== undefined) {
      fail(
        "LESSOR_REGIONS",
        `regions ${other} and ${region.name} share a control-plane database; each region has its own`,
      );
    }
    urls.set(region.controlPlaneUrl, region.name);
  }
  // Hosts no region names are the default region's.
  const home = regions.get(defaultRegion);
  if (home) {
    const unnamed = hostNames.filter((host) => !hostRegion.has(host));
    for (const host of unnamed) hostRegion.set(host, defaultRegion);
    regions.set(defaultRegion, {
      ...home,
      hosts: [...home.hosts, ...unnamed],
      locationHint: home.locationHint ?? controlPlaneHint,
    });
  }
  for (const region of regions.values()) {
    if (region.hosts.length === 0)
      fail("LESSOR_REGIONS", `region ${region.name} has no host; name at least one`);
  }
  return { regions, hostRegion, defaultRegion };
}

/** The region named `name`; `region_unknown` (400) if the deployment has none of that name. */
export function regionNamed(config: LessorConfig, name: string | undefined | null): Region {
  const region = config.regions.get(name ?? config.defaultRegion);
  if (!region) {
    throw new LessorError("region_unknown", {
      publicMessage: `No region is named ${JSON.stringify(String(name).slice(0, 40))}; this deployment has ${[...config.regions.keys()].join(", ")}.`,
    });
  }
  return region;
}

/**
 * What a key minted in `region` names as its region: null in the default region (keys keep the
 * format they had before regions existed), the region's name elsewhere.
 */
export function keyRegionOf(config: LessorConfig, region: string): string | null {
  return region === config.defaultRegion ? null : region;
}

/** The region of a database host (its tenants' catalog is there). */
export function regionOfHost(config: LessorConfig, host: string): string {
  return config.hosts.get(host)?.region ?? config.defaultRegion;
}

/**
 * One `LESSOR_POOL_SIZES` tier: a size (the pool holds it, and can grow no further), or
 * `{"size": n, "max": m}`: a fixed host's pools hold `n`; an adaptive host's start at `n` and move
 * between the host's floor and `m` (docs/capacity.md).
 */
function tierEntry(tier: string, entry: unknown): { size: number; max: number } {
  const isSize = (v: unknown): v is number =>
    typeof v === "number" && Number.isInteger(v) && v >= 1 && v <= maxPoolSize;
  if (typeof entry === "number") {
    if (!isSize(entry))
      fail("LESSOR_POOL_SIZES", `tier ${tier} must have a pool size from 1 to ${maxPoolSize}`);
    return { size: entry, max: entry };
  }
  if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
    fail("LESSOR_POOL_SIZES", `tier ${tier} must be a pool size, or {"size": n, "max": m}`);
  }
  const { size, max = size, ...rest } = entry as Record<string, unknown>;
  const unknown = Object.keys(rest);
  if (unknown.length > 0) {
    fail("LESSOR_POOL_SIZES", `tier ${tier} has unknown fields (${unknown.join(", ")}); known: size, max`);
  }
  if (!isSize(size))
    fail("LESSOR_POOL_SIZES", `tier ${tier}: size must be a whole number from 1 to ${maxPoolSize}`);
  if (!isSize(max))
    fail("LESSOR_POOL_SIZES", `tier ${tier}: max must be a whole number from 1 to ${maxPoolSize}`);
  if (max < size) fail("LESSOR_POOL_SIZES", `tier ${tier}: max (${max}) is smaller than size (${size})`);
  return { size, max };
}

/**
 * A host's `adaptive` budget setting: absent or `false` (fixed pools), `true` (the defaults), or
 * `{"floor", "growthStep", "windowMs"}` (each optional; the rest default).
 */
function adaptivePolicy(host: string, raw: unknown): AdaptivePolicy | null {
  if (raw === undefined || raw === false) return null;
  if (raw === true) return { ...defaultAdaptivePolicy };
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    fail(
      "LESSOR_BUDGETS",
      `host ${host}: adaptive must be true, false, or {"floor", "growthStep", "windowMs"}`,
    );
  }
  const policy = { ...defaultAdaptivePolicy };
  for (const [key, value] of Object.entries(raw as Record<string, unknown>)) {
    if (!(key in adaptiveBounds)) {
      fail(
        "LESSOR_BUDGETS",
        `host ${host}: adaptive has an unknown field (${key}); known: ${Object.keys(adaptiveBounds).join(", ")}`,
      );
    }
    const bounds = adaptiveBounds[key as keyof AdaptivePolicy];
    if (typeof value !== "number" || !Number.isInteger(value) || value < bounds.min || value > bounds.max) {
      fail(
        "LESSOR_BUDGETS",
        `host ${host}: adaptive.${key} must be a whole number from ${bounds.min} to ${bounds.max}`,
      );
    }
    policy[key as keyof AdaptivePolicy] = value;
  }
  return policy;
}

/** Tunnel fields `LESSOR_TUNNELS` knows. */
const tunnelFields = ["proxy", "capacity", "reserve", "connectTimeoutMs", "locationHint"];

/**
 * `LESSOR_TUNNELS`: `{"<name>": {"proxy": "wss://…", "capacity": n, "reserve"?: 1,
 * "connectTimeoutMs"?: 5000, "locationHint"?: "weur"}}`. A proxy is reached over TLS (`wss://`)
 * unless it is on this machine's loopback (local runs and tests).
 */
function parseTunnels(raw: string | undefined, hostNames: ReadonlySet<string>): Tunnel[] {
  if (raw === undefined || raw.trim() === "") return [];
  const tunnels: Tunnel[] = [];
  for (const [name, entry] of Object.entries(jsonObject("LESSOR_TUNNELS", raw))) {
    if (!/^[a-z0-9][a-z0-9-]{0,39}$/.test(name)) fail("LESSOR_TUNNELS", "tunnel names are lowercase slugs");
    if (hostNames.has(name)) fail("LESSOR_TUNNELS", `tunnel ${name} has a host's name; give it its own`);
    if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
      fail("LESSOR_TUNNELS", `tunnel ${name} needs an object with "proxy" and "capacity"`);
    }
    const fields = entry as Record<string, unknown>;
    const unknown = Object.keys(fields).filter((key) => !tunnelFields.includes(key));
    if (unknown.length > 0) {
      fail(
        "LESSOR_TUNNELS",
        `tunnel ${name} has unknown fields (${unknown.join(", ")}); known: ${tunnelFields.join(", ")}`,
      );
    }
    const { proxy, capacity, reserve = 1, connectTimeoutMs = 5_000, locationHint: hint } = fields;
    if (typeof proxy !== "string" || proxy === "") {
      fail("LESSOR_TUNNELS", `tunnel ${name} needs "proxy", the address of the WebSocket proxy at its end`);
    }
    const scheme = /^(wss|ws):\/\//.exec(proxy)?.[1] ?? null;
    const address = proxy.replace(/^wss?:\/\//, "").replace(/\/+$/, "");
    const loopback = isLoopbackAddress(address);
    // Credentials and tenant data cross it: TLS, but to this machine's loopback (local runs, tests).
    if (scheme === "ws" && !loopback) {
      fail("LESSOR_TUNNELS", `tunnel ${name}: the proxy must be reached over TLS (wss://…)`);
    }
    const budget = { connections: Number(capacity), reserve: Number(reserve), rotationReserve: 0 };
    if (!Number.isInteger(budget.connections) || budget.connections < 2) {
      fail("LESSOR_TUNNELS", `tunnel ${name}: capacity must be a whole number of connections, at least 2`);
    }
    if (!Number.isInteger(budget.reserve) || budget.reserve < 1 || budget.reserve >= budget.connections) {
      fail("LESSOR_TUNNELS", `tunnel ${name}: reserve must be at least 1 and below capacity`);
    }
    const timeout = Number(connectTimeoutMs);
    if (!Number.isInteger(timeout) || timeout < 100 || timeout > 60_000) {
      fail("LESSOR_TUNNELS", `tunnel ${name}: connectTimeoutMs must be from 100 to 60000`);
    }
    if (hint !== undefined && !(locationHints as readonly unknown[]).includes(hint)) {
      fail("LESSOR_TUNNELS", `tunnel ${name}: locationHint must be one of ${locationHints.join(", ")}`);
    }
    tunnels.push({
      name,
      budgetName: tunnelBudgetName(name),
      proxy: address,
      secure: scheme === "wss" || (scheme === null && !loopback),
      budget,
      connectTimeoutMs: timeout,
      locationHint: (hint as LocationHint | undefined) ?? null,
    });
  }
  return tunnels;
}

/** Reads and validates the configuration. */
export function loadConfig(env: Env): LessorConfig {
  const cached = cache.get(env);
  if (cached) return cached;
  // Optional vars that wrangler.toml need not declare.
  const vars = env as unknown as Record<string, string | undefined>;

  const poolSizes = new Map<string, number>();
  const poolStartSizes = new Map<string, number>();
  for (const [tier, entry] of Object.entries(jsonObject("LESSOR_POOL_SIZES", env.LESSOR_POOL_SIZES))) {
    const { size, max } = tierEntry(tier, entry);
    poolSizes.set(tier, max);
    poolStartSizes.set(tier, size);
  }
  const defaultTier = poolSizes.has("standard") ? "standard" : [...poolSizes.keys()][0];
  if (!defaultTier) fail("LESSOR_POOL_SIZES", "names no tier");

  const largestPool = Math.max(...poolSizes.values());
  const budgets = jsonObject("LESSOR_BUDGETS", env.LESSOR_BUDGETS);
  const hosts = new Map<string, DatabaseHost>();
  const wsProxy = env.LESSOR_WS_PROXY ? env.LESSOR_WS_PROXY : null;
  const pathsByAddress = new Map<string, HostPath & { host: string }>();
  for (const [name, entry] of Object.entries(jsonObject("LESSOR_HOSTS", env.LESSOR_HOSTS))) {
    if (!/^[a-z0-9][a-z0-9-]{0,39}$/.test(name)) fail("LESSOR_HOSTS", "host names are lowercase slugs");
    const declared = hostEntry(name, entry);
    const adminUrl = declared.url;
    let url: URL;
    try {
      url = new URL(adminUrl.replace(/^postgres(ql)?:/, "http:"));
    } catch {
      fail("LESSOR_HOSTS", `host ${name} has a malformed connection string`);
    }
    if (isPoolerHostname(url.hostname)) {
      fail(
        "LESSOR_HOSTS",
        `host ${name} is a -pooler endpoint (PgBouncer), which refuses the startup parameters Lessor's login tokens and pinned settings ride in; use the direct endpoint (drop "-pooler" from the host name)`,
      );
    }
    const kind = declared.kind ?? impliedHostKind(url.hostname);
    const pathProblem = hostPathProblem(name, kind, url.hostname, declared, wsProxy);
    if (pathProblem) fail("LESSOR_HOSTS", pathProblem);
    const path = hostPathOf(kind, declared);
    const address = addressKey(url.hostname, Number(url.port || 5432));
    const sharing = pathsByAddress.get(address);
    if (sharing && (sharing.path !== path.path || sharing.sslmode !== path.sslmode)) {
      fail(
        "LESSOR_HOSTS",
        `hosts ${sharing.host} and ${name} share an address but not a path; connections are routed by address`,
      );
    }
    pathsByAddress.set(address, { ...path, host: name });
    const rawBudget = budgets[name] ?? budgets["*"];
    if (typeof rawBudget !== "object" || rawBudget === null) {
      fail("LESSOR_BUDGETS", `host ${name} has no budget (give it one, or a "*" default)`);
    }
    const {
      connections,
      reserve = defaultReserve,
      rotationReserve = largestPool,
      adaptive,
      ...unknownBudget
    } = rawBudget as Record<string, unknown>;
    const unknownFields = Object.keys(unknownBudget);
    if (unknownFields.length > 0) {
      fail(
        "LESSOR_BUDGETS",
        `host ${name} has unknown fields (${unknownFields.join(", ")}); known: connections, reserve, rotationReserve, adaptive`,
      );
    }
    const budget = {
      connections: Number(connections),
      reserve: Number(reserve),
      rotationReserve: Number(rotationReserve),
    };
    const problem = validateLimits(budget, largestPool);
    if (problem) fail("LESSOR_BUDGETS", `host ${name}: ${problem}`);
    // A limit may lower the kind's, never raise it (a Neon branch refuses the 501st database).
    const kindLimits = kindTenancyLimits(kind);
    for (const [field, value, most] of [
      ["maxDatabases", declared.maxDatabases, kindLimits.databases],
      ["maxRoles", declared.maxRoles, kindLimits.roles],
    ] as const) {
      if (value !== undefined && most !== null && value > most)
        fail("LESSOR_HOSTS", `host ${name}: ${field} must be at most ${most} on a host of kind ${kind}`);
    }
    hosts.set(name, {
      name,
      adminUrl,
      hostname: url.hostname,
      port: Number(url.port || 5432),
      budget,
      kind,
      path,
      containment: declared.containment ?? "full",
      locationHint: declared.locationHint ?? null,
      region: "",
      adaptive: adaptivePolicy(name, adaptive),
      tenancy: hostTenancyLimits(kind, {
        ...(declared.maxDatabases === undefined ? {} : { databases: declared.maxDatabases }),
        ...(declared.maxRoles === undefined ? {} : { roles: declared.maxRoles }),
      }),
    });
  }
  // The proxy is plain ws:// with Postgres's TLS off: it stands in for Neon's endpoint on this
  // machine only (local runs and tests), never as a way across a network (docs/adr/027).
  if (wsProxy !== null && !isLoopbackAddress(wsProxy)) {
    fail(
      "LESSOR_WS_PROXY",
      "must be on this machine's loopback: it is plain ws:// with Postgres's TLS off, the local stand-in for Neon's WebSocket endpoint; deployed, leave it unset (neon hosts use wss://, postgres hosts TCP with TLS)",
    );
  }
  if (hosts.size === 0) fail("LESSOR_HOSTS", "names no host");
  const controlPlaneLocationHint = locationHint(
    "LESSOR_CONTROL_PLANE_LOCATION_HINT",
    vars.LESSOR_CONTROL_PLANE_LOCATION_HINT,
  );
  const { regions, hostRegion, defaultRegion } = parseRegions(
    vars.LESSOR_REGIONS,
    env.LESSOR_CONTROL_PLANE_URL ?? "",
    [...hosts.keys()],
    controlPlaneLocationHint,
  );
  for (const host of hosts.values()) host.region = hostRegion.get(host.name) ?? defaultRegion;
  // New tenants go to the default region's first host unless a host is named.
  const defaultHost = regions.get(defaultRegion)?.hosts[0];
  if (!defaultHost) fail("LESSOR_HOSTS", "names no host");
  const tunnels = parseTunnels(vars.LESSOR_TUNNELS, new Set(hosts.keys()));
  const keyMacRing = parseKeyMacRing(env.LESSOR_KEY_MAC_KEYS);
  if ("problem" in keyMacRing) fail("LESSOR_KEY_MAC_KEYS", keyMacRing.problem);

  const config: LessorConfig = {
    // What a warm pool costs per second against a cold start's price (docs/adr/021).
    idleTimeoutMs: positiveInt("LESSOR_IDLE_TIMEOUT_MS", env.LESSOR_IDLE_TIMEOUT_MS, 20_000),
    maxBodyBytes: positiveInt("LESSOR_MAX_BODY_BYTES", env.LESSOR_MAX_BODY_BYTES, 1024 * 1024),
    poolSizes,
    poolStartSizes,
    defaultTier,
    hosts,
    defaultHost,
    tunnels: new Map(tunnels.map((t) => [t.name, t])),
    tunnelsByBudgetName: new Map(tunnels.map((t) => [t.budgetName, t])),
    wsProxy,
    pathsByAddress,
    admissionWaitMs: positiveInt("LESSOR_ADMISSION_WAIT_MS", env.LESSOR_ADMISSION_WAIT_MS, 2_000),
    leaseMaxTtlMs: positiveInt("LESSOR_LEASE_MAX_TTL_MS", env.LESSOR_LEASE_MAX_TTL_MS, 300_000),
    maxDrainMs: positiveInt("LESSOR_MAX_DRAIN_MS", env.LESSOR_MAX_DRAIN_MS, 30_000),
    statementTimeoutMs: positiveInt("LESSOR_STATEMENT_TIMEOUT_MS", vars.LESSOR_STATEMENT_TIMEOUT_MS, 30_000),
    migrationTimeoutMs: positiveInt("LESSOR_MIGRATION_TIMEOUT_MS", vars.LESSOR_MIGRATION_TIMEOUT_MS, 600_000),
    leaseMaxLifetimeMs: positiveInt(
      "LESSOR_LEASE_MAX_LIFETIME_MS",
      vars.LESSOR_LEASE_MAX_LIFETIME_MS,
      900_000,
    ),
    tempFileLimit: tempFileLimit(vars.LESSOR_TEMP_FILE_LIMIT),
    maxResponseBytes: positiveInt(
      "LESSOR_MAX_RESPONSE_BYTES",
      vars.LESSOR_MAX_RESPONSE_BYTES,
      10 * 1024 * 1024,
    ),
    wireBufferBytes: positiveInt("LESSOR_WIRE_BUFFER_BYTES", vars.LESSOR_WIRE_BUFFER_BYTES, 1024 * 1024),
    wireDrainMs: positiveInt("LESSOR_WIRE_DRAIN_MS", vars.LESSOR_WIRE_DRAIN_MS, 30_000),
    wireMaxLifetimeMs: positiveInt(
      "LESSOR_WIRE_MAX_LIFETIME_MS",
      vars.LESSOR_WIRE_MAX_LIFETIME_MS,
      3_600_000,
    ),
    wireMaxFrames: positiveInt("LESSOR_WIRE_MAX_FRAMES", vars.LESSOR_WIRE_MAX_FRAMES, 100_000),
    keyMacRing,
    maxKeysPerTenant: positiveInt("LESSOR_MAX_KEYS_PER_TENANT", vars.LESSOR_MAX_KEYS_PER_TENANT, 5),
    controlPlaneShards: positiveInt("LESSOR_CONTROL_PLANE_SHARDS", vars.LESSOR_CONTROL_PLANE_SHARDS, 8),
    controlPlanePoolSize: positiveInt(
      "LESSOR_CONTROL_PLANE_POOL_SIZE",
      vars.LESSOR_CONTROL_PLANE_POOL_SIZE,
      8,
    ),
    credentialRotationDays:
      vars.LESSOR_CREDENTIAL_ROTATION_DAYS && vars.LESSOR_CREDENTIAL_ROTATION_DAYS !== "0"
        ? positiveInt("LESSOR_CREDENTIAL_ROTATION_DAYS", vars.LESSOR_CREDENTIAL_ROTATION_DAYS, 90)
        : null,
    credentialRotationBatch: positiveInt(
      "LESSOR_CREDENTIAL_ROTATION_BATCH",
      vars.LESSOR_CREDENTIAL_ROTATION_BATCH,
      10,
    ),
    eraseLeaseWaitMs: positiveInt("LESSOR_ERASE_LEASE_WAIT_MS", vars.LESSOR_ERASE_LEASE_WAIT_MS, 30_000),
    auditRetentionDays: positiveInt("LESSOR_AUDIT_RETENTION_DAYS", vars.LESSOR_AUDIT_RETENTION_DAYS, 400),
    resealBatch:
      vars.LESSOR_RESEAL_BATCH === "0"
        ? 0
        : positiveInt("LESSOR_RESEAL_BATCH", vars.LESSOR_RESEAL_BATCH, 100),
    sweepMinutes: positiveInt("LESSOR_SWEEP_MINUTES", vars.LESSOR_SWEEP_MINUTES, 360),
    placementHosts: placementHosts(vars.LESSOR_PLACEMENT_HOSTS, hosts),
    controlPlaneLocationHint,
    regions,
    defaultRegion,
  };
  cache.set(env, config);
  return config;
}
