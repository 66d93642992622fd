/**
 * Maintenance connections: every connection Lessor opens on a database host outside a tenant's pool
 * (provisioning, migrations, credential repair, fencing, reconcile, erase) first reserves a slot of
 * the host's maintenance reserve from its BudgetObject, and gives it back when it closes. So pools
 * plus maintenance never exceed the host's connections, whatever runs at once
 * (docs/adr/010-control-plane-pool-and-maintenance-reserve.md).
 *
 * Each holder has a deadline: past it, its statement is cancelled and its connection cut. The slot
 * is held a margin longer than that, so a holder that died is reclaimed by the BudgetObject only
 * once its connection cannot still be open.
 */
import type { Client } from "@neondatabase/serverless";
import type { DatabaseHost, LessorConfig } from "../config/index.ts";
import { hostApplicationName } from "../core/names.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { adminUrlFor, targetOfUrl, underDeadline, withConnection } from "../postgres/index.ts";

/** How long an admin connection's work may run before it is cancelled. */
export const adminDeadlineMs = 60_000;
/** A slot is held this much longer than its holder's deadline (connect, cancel grace, close). */
const holdMarginMs = 30_000;

export interface MaintenanceSlot {
  purpose: string;
  tenantId: string | null;
  /** The holder's own deadline for its work. */
  deadlineMs: number;
  /** How long to wait for a slot; the admission wait by default. */
  waitMs?: number;
  /**
   * The holder's record of the slots it holds right now (a TenantObject's, for its migrations): the
   * budget reconcile asks the holder, and frees a slot its holder no longer knows (it was killed).
   */
  held?: Set<string>;
}

/**
 * Runs `work` while holding one maintenance slot of `host`. No slot within the wait is
 * `503 maintenance_busy` with Retry-After; the slot is released however `work` ends.
 */
export async function withMaintenanceSlot<T>(
  env: Env,
  config: LessorConfig,
  host: string,
  slot: MaintenanceSlot,
  work: () => Promise<T>,
): Promise<T> {
  const budget = env.BUDGETS.getByName(host);
  const grant = await budget.acquireMaintenance(host, {
    purpose: slot.purpose,
    tenantId: slot.tenantId,
    holdMs: slot.deadlineMs + holdMarginMs,
    waitMs: slot.waitMs ?? config.admissionWaitMs,
  });
  if (!grant.granted) {
    throw new LessorError("maintenance_busy", {
      retryAfterSeconds: Math.max(1, Math.ceil(grant.retryAfterMs / 1_000)),
    });
  }
  slot.held?.add(grant.leaseId);
  try {
    return await work();
  } finally {
    slot.held?.delete(grant.leaseId);
    // A release that fails leaves the slot to expire at its deadline: late, never lost.
    await budget.releaseMaintenance(host, grant.leaseId).catch((error: unknown) => {
      logEvent("warn", "maintenance_release_failed", { host, failure: describeFailure(error) });
    });
  }
}

export interface HostAdminOptions {
  purpose: string;
  tenantId: string | null;
  /** Connect to this database of the host instead of the admin URL's own. */
  database?: string;
  waitMs?: number;
}

/**
 * Runs `work` on a connection as the host's admin role, named `lessor:host:<host>:<purpose>`, within
 * a maintenance slot and under `adminDeadlineMs`.
 */
export function withHostAdmin<T>(
  env: Env,
  config: LessorConfig,
  host: DatabaseHost,
  options: HostAdminOptions,
  work: (admin: Client) => Promise<T>,
): Promise<T> {
  const url = options.database ? adminUrlFor(host.adminUrl, options.database) : host.adminUrl;
  return withMaintenanceSlot(
    env,
    config,
    host.name,
    {
      purpose: options.purpose,
      tenantId: options.tenantId,
      deadlineMs: adminDeadlineMs,
      ...(options.waitMs === undefined ? {} : { waitMs: options.waitMs }),
    },
    () =>
      withConnection(config, url, hostApplicationName(host.name, options.purpose), (admin) =>
        underDeadline(config, targetOfUrl(url), admin, adminDeadlineMs, () => work(admin)),
      ),
  );
}
