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
import { describeMissing, evaluateHost, type HostReport, reportIsFresh } from "../core/host-capabilities.ts";
import { hostApplicationName } from "../core/names.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { budgetObject } from "../placement/index.ts";
import { adminUrlFor, withPrivilegedConnection } from "../postgres/index.ts";
import { probeHostFacts } from "./capabilities.ts";

/** How long an admin connection's work may run before it is cancelled. */
export const adminDeadlineMs = 60_000;
/** A slot is held this much longer than its holder's deadline (connect, cancel grace, close). */
const holdMarginMs = 30_000;
/**
 * How long a maintenance slot is held without a renewal (a dead holder's slot comes back after
 * this), and how often a living holder renews it (three chances within the hold). Tests shorten
 * both; nothing else changes them.
 */
export const maintenanceRenewal = { holdMs: 30_000, everyMs: 10_000 };

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
  work: (hostReport: HostReport | null) => Promise<T>,
): Promise<T> {
  const budget = budgetObject(env, host);
  // A slot is held for a short while and renewed while its holder lives: a holder that dies (a
  // killed cron tick, a request cut by a deploy) gives its slot back within that hold, not at
  // the end of its whole deadline (the chaos soak: a dead create's slot held a reserve of 2 half
  // full for three and a half minutes, and creates got `maintenance_busy` meanwhile; issue 32).
  const holdMs = Math.min(slot.deadlineMs + holdMarginMs, maintenanceRenewal.holdMs);
  const grant = await budget.acquireMaintenance(host, {
    purpose: slot.purpose,
    tenantId: slot.tenantId,
    holdMs,
    waitMs: slot.waitMs ?? config.admissionWaitMs,
  });
  if (!grant.granted) {
    throw new LessorError("maintenance_busy", {
      retryAfterSeconds: Math.max(1, Math.ceil(grant.retryAfterMs / 1_000)),
    });
  }
  slot.held?.add(grant.leaseId);
  const renewal = setInterval(() => {
    budget.renewMaintenance(host, grant.leaseId, holdMs).catch(() => undefined);
  }, maintenanceRenewal.everyMs);
  try {
    return await work(grant.hostReport ?? null);
  } finally {
    clearInterval(renewal);
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
 * The host's report as of now: the one the BudgetObject holds while it is fresh, else a new probe of
 * the admin role on `admin` (src/tenant-db/capabilities.ts), handed to the BudgetObject, whose
 * admissions follow its verdict. A probe that cannot be recorded still answers this caller.
 */
export async function currentHostReport(
  env: Env,
  host: DatabaseHost,
  admin: Client,
  known: HostReport | null,
): Promise<HostReport> {
  const now = Date.now();
  if (reportIsFresh(known, now) && known.kind === host.kind) return known;
  const facts = await probeHostFacts(admin);
  const report: HostReport = {
    kind: host.kind,
    probedAt: now,
    facts,
    verdict: evaluateHost(host.kind, facts, host.containment),
  };
  await budgetObject(env, host.name)
    .recordHostReport(host.name, report)
    .catch((error: unknown) => {
      logEvent("warn", "host_report_not_recorded", { host: host.name, failure: describeFailure(error) });
    });
  return report;
}

/** Refuses work on a host that cannot run Lessor, naming what its admin role lacks. */
export function requireFitHost(host: DatabaseHost, report: HostReport): void {
  if (report.verdict.fit) return;
  throw new LessorError("host_unfit", {
    publicMessage: describeMissing(host.name, report.verdict),
    retryAfterSeconds: 30,
  });
}

/**
 * Runs `work` on a pinned connection as the host's admin role (src/postgres `withPrivilegedConnection`),
 * named `lessor:host:<host>:<purpose>`, under `adminDeadlineMs`, with the host's current report. The
 * caller holds a maintenance slot.
 */
export function withAdminConnection<T>(
  env: Env,
  config: LessorConfig,
  host: DatabaseHost,
  options: { purpose: string; database?: string; knownReport: HostReport | null },
  work: (admin: Client, report: HostReport) => Promise<T>,
): Promise<T> {
  const url = options.database ? adminUrlFor(host.adminUrl, options.database) : host.adminUrl;
  return withPrivilegedConnection(
    config,
    url,
    hostApplicationName(host.name, options.purpose),
    adminDeadlineMs,
    async (admin) => work(admin, await currentHostReport(env, host, admin, options.knownReport)),
  );
}

/**
 * Runs `work` on a pinned connection as the host's admin role within a maintenance slot
 * (`withAdminConnection`).
 */
export function withHostAdmin<T>(
  env: Env,
  config: LessorConfig,
  host: DatabaseHost,
  options: HostAdminOptions,
  work: (admin: Client, report: HostReport) => Promise<T>,
): Promise<T> {
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
    (knownReport) =>
      withAdminConnection(
        env,
        config,
        host,
        {
          purpose: options.purpose,
          knownReport,
          ...(options.database ? { database: options.database } : {}),
        },
        work,
      ),
  );
}
