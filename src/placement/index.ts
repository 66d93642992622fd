/**
 * Stubs of Lessor's Durable Objects, created where configuration says (src/core/placement.ts): a
 * host's BudgetObject near the host, a tenant's object in its region and near its host, a region's
 * control-plane shards near that region's control-plane database, each inside the region's
 * jurisdiction when it has one (docs/adr/023-regions.md).
 */
import { budgetSubject, type LessorConfig, loadConfig, type Region, regionOfHost } from "../config/index.ts";
import {
  budgetObjectPlacement,
  controlPlaneShardPlacement,
  type ObjectPlacement,
  tenantObjectPlacement,
} from "../core/placement.ts";
import { LessorError } from "../errors/index.ts";

function regionOf(config: LessorConfig, name: string): Region {
  const region = config.regions.get(name);
  if (!region) throw new LessorError("misconfigured", { internal: `region ${name} is not configured` });
  return region;
}

/**
 * The namespace of `placement` (its jurisdiction's, if it has one) and the stub in it, created with
 * its location hint. workerd implements no jurisdiction (it throws): local and test stacks declare
 * none, and this path is unit-tested against a namespace that records what it was asked.
 */
export function stubIn<T extends Rpc.DurableObjectBranded | undefined>(
  namespace: DurableObjectNamespace<T>,
  placement: ObjectPlacement,
): DurableObjectStub<T> {
  const scoped = placement.jurisdiction === null ? namespace : namespace.jurisdiction(placement.jurisdiction);
  return scoped.getByName(placement.name, placement.options);
}

/**
 * The BudgetObject of `host` (a host, or a customer's tunnel: `tunnel:<name>`, which is the default
 * region's), in its region and near it.
 */
export function budgetObject(env: Env, host: string) {
  const config = loadConfig(env);
  const hint = budgetSubject(config, host)?.locationHint ?? null;
  return stubIn(env.BUDGETS, budgetObjectPlacement(regionOf(config, regionOfHost(config, host)), host, hint));
}

/** The name of a tenant's object in `region` (`<tenant>@<region>` outside the default region). */
export function tenantObjectName(config: LessorConfig, region: string, tenantId: string): string {
  return tenantObjectPlacement(regionOf(config, region), tenantId).name;
}

/** A tenant's object in `region` (created there, near the region's hint, if this call creates it). */
export function tenantObject(env: Env, region: string, tenantId: string) {
  return stubIn(env.TENANTS, tenantObjectPlacement(regionOf(loadConfig(env), region), tenantId));
}

/**
 * The object of a tenant on `host`: a tenant's host is in its region, so this is the one object
 * that may hold the tenant's connections on the host (the budget and the orphan reaper ask it).
 */
export function tenantObjectOnHost(env: Env, host: string, tenantId: string) {
  return tenantObject(env, regionOfHost(loadConfig(env), host), tenantId);
}

/**
 * A tenant's object, placed in its region and near `host` (or its tunnel) if this call creates it
 * (provisioning's first call does).
 */
export function tenantObjectNear(env: Env, tenantId: string, host: string) {
  const config = loadConfig(env);
  const hint = budgetSubject(config, host)?.locationHint ?? null;
  return stubIn(
    env.TENANTS,
    tenantObjectPlacement(regionOf(config, regionOfHost(config, host)), tenantId, hint),
  );
}

/** A ControlPlaneObject shard of `region`, placed near the region's control-plane database. */
export function controlPlaneShard(env: Env, region: string, index: number) {
  return stubIn(env.CONTROL_PLANE, controlPlaneShardPlacement(regionOf(loadConfig(env), region), index));
}
