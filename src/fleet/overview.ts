/**
 * The fleet at a glance, gathered once for the status page (`GET /v1/fleet/overview`) and for
 * `/metrics`: every host's BudgetObject status, and one control-plane connection for the rest
 * (failing tenants, recent events, campaigns, folds, usage, catalog counts).
 *
 * Each source can fail on its own (a BudgetObject restarting, the control plane down); the
 * overview then carries what it could read and says which part is missing, because an operator at
 * 3 a.m. needs the hosts' budgets most when the control plane is the thing that broke.
 */
import { countsOf, listCampaigns, loadTally } from "../campaigns/store.ts";
import type { LessorConfig } from "../config/index.ts";
import { type ControlPlane, withControlPlane } from "../control-plane/index.ts";
import type { CampaignState, TenantState } from "../core/campaign.ts";
import { describeFailure } from "../errors/index.ts";
import { foldOptionsFromVars } from "../folds/options.ts";
import { type MaintenanceStatus, readMaintenanceStatus } from "../folds/status.ts";
import { logEvent } from "../log/index.ts";
import { budgetObject, tenantObject } from "../placement/index.ts";
import { hostsTenancy } from "../placement/room.ts";
import type { CapacityStatus } from "../rpc/budget.ts";
import { type FleetUsage, readFleetUsage } from "../usage/readers.ts";
import {
  countCampaigns,
  countFailingByHost,
  countTenants,
  defaultFailingWindowMs,
  type FailingTenantEvent,
  type FleetEvent,
  readFailingTenants,
  readRecentEvents,
} from "./readers.ts";

/** A host's BudgetObject status, or why it could not be read. */
export type HostReading = { host: string; ok: true; status: CapacityStatus } | { host: string; ok: false };

/** Reads the BudgetObject of every host of `region`, each on its own (one failing host hides no other). */
export async function readHosts(
  env: Env,
  config: LessorConfig,
  region: string,
  candidateLimit: number,
): Promise<HostReading[]> {
  return Promise.all(
    (config.regions.get(region)?.hosts ?? []).map(async (host): Promise<HostReading> => {
      try {
        return { host, ok: true, status: await budgetObject(env, host).status(host, candidateLimit) };
      } catch (error) {
        logEvent("warn", "budget_status_failed", { host, failure: describeFailure(error) });
        return { host, ok: false };
      }
    }),
  );
}

/** A failing tenant as the status page shows it: the event, and what its object says now. */
export interface FailingTenant extends FailingTenantEvent {
  /** The object's own state now (`failed` unless it recovered after its last flushed event). */
  state: string | null;
  retryAt: string | null;
}

/** A campaign with its progress, for a progress bar. */
export interface CampaignProgress {
  id: string;
  state: CampaignState;
  toVersion: number;
  blockedReason: string | null;
  reason: string | null;
  createdAt: string;
  finishedAt: string | null;
  counts: Record<TenantState, number> & { erased: number; total: number };
}

/** `GET /v1/fleet/overview`. */
export interface FleetOverview {
  asOf: string;
  /** The region this overview is of (docs/adr/023-regions.md); each region is read on its own. */
  region: string;
  /** Every region of the deployment, for a picker. */
  regions: string[];
  hosts: CapacityStatus[];
  /** Hosts whose BudgetObject did not answer. */
  hostsUnavailable: string[];
  /** Pools by state: starting/ready/draining from the budgets, failed from lifecycle events. */
  pools: { starting: number; ready: number; draining: number; failed: number | null };
  /** Null while the control plane is unreachable; the sections that need it are null too. */
  controlPlane: "up" | "down";
  failing: { windowSeconds: number; count: number; tenants: FailingTenant[] } | null;
  events: FleetEvent[] | null;
  campaigns: CampaignProgress[] | null;
  folds: Pick<MaintenanceStatus, "horizon" | "backlog" | "counters"> & {
    last: MaintenanceStatus["outcomes"][number] | null;
  };
}

/** What the overview reads from the control plane in one connection. */
interface ControlPlaneReadings {
  failing: { count: number; tenants: FailingTenantEvent[] };
  events: FleetEvent[];
  campaigns: CampaignProgress[];
  folds: MaintenanceStatus;
}

/** The section sizes: the page shows a glance, never a list of the fleet. */
export const overviewLimits = { candidates: 5, failing: 20, events: 20, campaigns: 5 } as const;

async function readControlPlane(env: Env, db: ControlPlane): Promise<ControlPlaneReadings> {
  const failing = await readFailingTenants(db, {
    windowMs: defaultFailingWindowMs,
    limit: overviewLimits.failing,
  });
  const { events } = await readRecentEvents(db, { limit: overviewLimits.events, before: null });
  const rows = await listCampaigns(db, null, overviewLimits.campaigns);
  const campaigns: CampaignProgress[] = [];
  for (const row of rows) {
    campaigns.push({
      id: row.id,
      state: row.state,
      toVersion: row.toVersion,
      blockedReason: row.blockedReason,
      reason: row.reason,
      createdAt: row.createdAt.toISOString(),
      finishedAt: row.finishedAt?.toISOString() ?? null,
      counts: countsOf(await loadTally(db, row.id), row.erasedTenants),
    });
  }
  const folds = await readMaintenanceStatus(db.$client, foldOptionsFromVars(env), { before: null, limit: 1 });
  return { failing, events, campaigns, folds };
}

/**
 * Gathers the overview of one region. Never throws for an unreachable source: it reports it
 * instead (another region's control plane is never read).
 */
export async function readOverview(env: Env, config: LessorConfig, region: string): Promise<FleetOverview> {
  const readings = await readHosts(env, config, region, overviewLimits.candidates);
  const hosts = readings.flatMap((r) => (r.ok ? [r.status] : []));
  let cp: ControlPlaneReadings | null = null;
  try {
    cp = await withControlPlane(config, env, region, (db) => readControlPlane(env, db), "lessor-operator");
  } catch (error) {
    logEvent("warn", "overview_control_plane_failed", { region, failure: describeFailure(error) });
  }
  const failingTenants = cp ? await withRuntime(env, region, cp.failing.tenants) : [];
  // Each host's room in tenants (docs/adr/028), when the control plane answers.
  const tenancy = cp
    ? await withControlPlane(
        config,
        env,
        region,
        (db) =>
          hostsTenancy(
            db,
            config,
            hosts.map((h) => h.host),
          ),
        "lessor-operator",
      ).catch(() => null)
    : null;
  for (const status of hosts) {
    const room = tenancy?.get(status.host);
    if (room) status.tenancy = room;
  }
  const sum = (pick: (s: CapacityStatus) => number) => hosts.reduce((n, s) => n + pick(s), 0);
  return {
    asOf: new Date().toISOString(),
    region,
    regions: [...config.regions.keys()],
    hosts,
    hostsUnavailable: readings.filter((r) => !r.ok).map((r) => r.host),
    pools: {
      starting: sum((s) => s.pools.reserved),
      ready: sum((s) => s.pools.allocated),
      draining: sum((s) => s.pools.draining),
      failed: cp ? cp.failing.count : null,
    },
    controlPlane: cp ? "up" : "down",
    failing: cp
      ? { windowSeconds: defaultFailingWindowMs / 1000, count: cp.failing.count, tenants: failingTenants }
      : null,
    events: cp ? cp.events : null,
    campaigns: cp ? cp.campaigns : null,
    folds: cp
      ? {
          horizon: cp.folds.horizon,
          backlog: cp.folds.backlog,
          counters: cp.folds.counters,
          last: cp.folds.outcomes[0] ?? null,
        }
      : {
          horizon: { pinned: false, unobservableBackends: 0 },
          backlog: { deltas: 0, oldestAt: null, oldestAgeSeconds: null },
          counters: {
            since: null,
            runs: 0,
            foldedRuns: 0,
            foldedRows: 0,
            replayedRows: 0,
            skippedPinned: 0,
            skippedLockBusy: 0,
            failed: 0,
            lastRunAt: null,
            lastFoldedAt: null,
          },
          last: null,
        },
  };
}

/**
 * Adds each listed failing tenant's retry time from its object (at most `overviewLimits.failing`
 * calls). A tenant whose object has recovered since is dropped: its recovery event is on its way.
 */
async function withRuntime(
  env: Env,
  region: string,
  events: readonly FailingTenantEvent[],
): Promise<FailingTenant[]> {
  const tenants = await Promise.all(
    events.map(async (event): Promise<FailingTenant | null> => {
      try {
        const runtime = await tenantObject(env, region, event.tenantId).status();
        if (runtime.state !== "failed") return null;
        return { ...event, state: runtime.state, retryAt: runtime.retryAt };
      } catch {
        return { ...event, state: null, retryAt: null };
      }
    }),
  );
  return tenants.filter((t): t is FailingTenant => t !== null);
}

/** Everything `/metrics` derives its series from: counts and totals only, never a tenant id. */
export interface MetricsReadings {
  /** The region these readings are of: every series carries it as its `region` label. */
  region: string;
  hosts: HostReading[];
  controlPlaneUp: boolean;
  usage: FleetUsage | null;
  tenants: { host: string; tier: string; status: string; count: number }[];
  failingByHost: Map<string, number> | null;
  campaigns: Awaited<ReturnType<typeof countCampaigns>> | null;
  folds: MaintenanceStatus | null;
}

/**
 * Gathers what `/metrics` needs, region by region (each on its own: a region whose control plane is
 * down reports `controlPlaneUp: false` and hides no other); like the overview it reports a missing
 * source instead of failing.
 */
export function readMetricsReadings(env: Env, config: LessorConfig): Promise<MetricsReadings[]> {
  return Promise.all([...config.regions.keys()].map((region) => readRegionReadings(env, config, region)));
}

async function readRegionReadings(env: Env, config: LessorConfig, region: string): Promise<MetricsReadings> {
  const hosts = await readHosts(env, config, region, 0);
  try {
    return await withControlPlane(
      config,
      env,
      region,
      async (db) => ({
        region,
        hosts,
        controlPlaneUp: true,
        usage: await readFleetUsage(db),
        tenants: await countTenants(db),
        failingByHost: await countFailingByHost(db, defaultFailingWindowMs),
        campaigns: await countCampaigns(db),
        folds: await readMaintenanceStatus(db.$client, foldOptionsFromVars(env), { before: null, limit: 1 }),
      }),
      "lessor-metrics",
    );
  } catch (error) {
    logEvent("warn", "metrics_control_plane_failed", { region, failure: describeFailure(error) });
    return {
      region,
      hosts,
      controlPlaneUp: false,
      usage: null,
      tenants: [],
      failingByHost: null,
      campaigns: null,
      folds: null,
    };
  }
}
