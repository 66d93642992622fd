/**
 * Where Cloudflare creates Lessor's Durable Objects (docs/adr/016-host-kinds.md, "Placement";
 * docs/adr/023-regions.md). An object is created near its first caller unless told otherwise; a
 * location hint (per host, per region, or for the control plane) asks for a place instead, so a
 * host's BudgetObject and its tenants' objects live near the database they talk to. A hint is a
 * preference the platform may not honour, and it matters only when an object is first created:
 * later calls reach the object wherever it is. A jurisdiction is a guarantee: an object created in
 * one runs and stores its data only inside it, and it is a different object from the one of the
 * same name outside it.
 */
import type { Jurisdiction, LocationHint } from "../config/index.ts";

/** The options of `getByName` for an object that should live near `hint` (none: near its caller). */
export function placementOptions(hint: LocationHint | null): { locationHint?: LocationHint } {
  return hint === null ? {} : { locationHint: hint };
}

/** What a region says about where its objects go. */
export interface RegionPlacement {
  name: string;
  jurisdiction: Jurisdiction | null;
  locationHint: LocationHint | null;
  isDefault: boolean;
}

/** Where one object goes: its namespace's jurisdiction (or none), its name, and `getByName`'s options. */
export interface ObjectPlacement {
  jurisdiction: Jurisdiction | null;
  name: string;
  options: { locationHint?: LocationHint };
}

/** Separates a tenant id from its region in an object's name (tenant ids never hold it). */
const regionSeparator = "@";

/**
 * A tenant's object in `region`: the default region's keeps the bare tenant id (the name it had
 * before regions existed); another region's is `<tenant>@<region>`, so that two regions never share
 * an object even without jurisdictions. The host's hint wins over the region's (the database is
 * what the object talks to most).
 */
export function tenantObjectPlacement(
  region: RegionPlacement,
  tenantId: string,
  hostHint: LocationHint | null = null,
): ObjectPlacement {
  return {
    jurisdiction: region.jurisdiction,
    name: region.isDefault ? tenantId : `${tenantId}${regionSeparator}${region.name}`,
    options: placementOptions(hostHint ?? region.locationHint),
  };
}

/** The tenant and region an object name of `tenantObjectPlacement` stands for (`null` region: the default). */
export function parseTenantObjectName(name: string): { tenantId: string; region: string | null } {
  const at = name.indexOf(regionSeparator);
  return at < 0
    ? { tenantId: name, region: null }
    : { tenantId: name.slice(0, at), region: name.slice(at + 1) };
}

/** One of a region's ControlPlaneObject shards: `shard-<n>` in the default region, `<region>:shard-<n>` elsewhere. */
export function controlPlaneShardPlacement(region: RegionPlacement, index: number): ObjectPlacement {
  return {
    jurisdiction: region.jurisdiction,
    name: region.isDefault ? `shard-${index}` : `${region.name}:shard-${index}`,
    options: placementOptions(region.locationHint),
  };
}

/** A host's BudgetObject: named by the host, in its region's jurisdiction, near the host. */
export function budgetObjectPlacement(
  region: RegionPlacement,
  host: string,
  hostHint: LocationHint | null,
): ObjectPlacement {
  return {
    jurisdiction: region.jurisdiction,
    name: host,
    options: placementOptions(hostHint ?? region.locationHint),
  };
}

/**
 * How long a restarted object waits before it starts its pool again: a random share of a bound, so
 * a deploy (every object restarts) does not bring every tenant's pool back in the same millisecond.
 * `random` is in [0, 1). The bound is a quarter of the admission wait, at most half a second: the
 * first request after a deploy pays at most that, and the budget's FIFO admission does the rest.
 */
export function restartJitterMs(random: number, admissionWaitMs: number): number {
  const bound = Math.min(500, Math.floor(admissionWaitMs / 4));
  return Math.floor(Math.max(0, Math.min(0.999_999, random)) * bound);
}
