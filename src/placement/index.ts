/**
 * Stubs of Lessor's Durable Objects, created where configuration says (src/core/placement.ts): a
 * host's BudgetObject near the host, a tenant's object near its host when provisioning creates it,
 * the control plane's shards near the control-plane database.
 */
import { budgetSubject, loadConfig } from "../config/index.ts";
import { placementOptions } from "../core/placement.ts";

/** The BudgetObject of `host` (a host, or a customer's tunnel: `tunnel:<name>`), placed near it. */
export function budgetObject(env: Env, host: string) {
  const hint = budgetSubject(loadConfig(env), host)?.locationHint ?? null;
  return env.BUDGETS.getByName(host, placementOptions(hint));
}

/** A tenant's object, placed near `host` (or its tunnel) if this call creates it (provisioning's first call does). */
export function tenantObjectNear(env: Env, tenantId: string, host: string) {
  const hint = budgetSubject(loadConfig(env), host)?.locationHint ?? null;
  return env.TENANTS.getByName(tenantId, placementOptions(hint));
}

/** A ControlPlaneObject shard, placed near the control-plane database. */
export function controlPlaneShard(env: Env, name: string) {
  return env.CONTROL_PLANE.getByName(name, placementOptions(loadConfig(env).controlPlaneLocationHint));
}
