/**
 * The one boundary through which Lessor's own code reaches a tenant database.
 *
 * A scope names the tenant, the generation and the lease the work runs under. Code that touches a
 * tenant connection calls `requireTenantScope(tenantId)` first: with no scope it fails closed, and
 * with another tenant's scope it refuses. Entering a scope for another tenant inside an active one
 * is refused too. `AsyncLocalStorage.run` restores the exact previous scope on exit, on throw as
 * on return.
 *
 * Background work (alarms, `waitUntil`, cron) never inherits a scope: it starts `detached` and
 * re-enters with an explicit tenant id and a lease of its own.
 */
import { AsyncLocalStorage } from "node:async_hooks";

export interface TenantScope {
  tenantId: string;
  generation: number;
  /** Identifies the lease the work holds (a session token hash, `sql:<n>`, `reclaim:<…>`, …). */
  leaseId: string;
}

export type TenantContextProblem = "no_context" | "tenant_switch" | "wrong_tenant";

/** A programming error: tenant work attempted outside its boundary. Never shown to a caller. */
export class TenantContextError extends Error {
  override readonly name = "TenantContextError";
  constructor(
    readonly problem: TenantContextProblem,
    message: string,
  ) {
    super(message);
  }
}

const storage = new AsyncLocalStorage<TenantScope>();

/** Runs `work` inside `scope`. Refuses to switch tenants inside an active scope. */
export function withTenantScope<T>(scope: TenantScope, work: () => Promise<T>): Promise<T> {
  const current = storage.getStore();
  if (current && current.tenantId !== scope.tenantId) {
    return Promise.reject(
      new TenantContextError(
        "tenant_switch",
        `cannot enter tenant ${scope.tenantId} inside ${current.tenantId}`,
      ),
    );
  }
  return storage.run(scope, work);
}

/** The active scope, which must belong to `tenantId`. Fails closed. */
export function requireTenantScope(tenantId: string): TenantScope {
  const current = storage.getStore();
  if (!current) throw new TenantContextError("no_context", `no tenant scope for work on ${tenantId}`);
  if (current.tenantId !== tenantId) {
    throw new TenantContextError(
      "wrong_tenant",
      `work on ${tenantId} inside the scope of ${current.tenantId}`,
    );
  }
  return current;
}

/** Runs `work` with no scope at all: the start of every piece of background work. */
export function detached<T>(work: () => T): T {
  return storage.exit(work);
}
