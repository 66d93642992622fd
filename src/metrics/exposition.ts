/**
 * `/metrics` series, derived on every scrape from durable state (the BudgetObjects' ledgers and the
 * control plane), and written with prom-client into a registry made for that one scrape
 * (docs/adr/008-metrics-derived-per-scrape.md).
 *
 * Names follow prometheus-community/pgbouncer_exporter with a `lessor_` prefix: `_config_` for
 * settings, `_connections` for connection counts, base units, `_total` counters. Label values come
 * only from closed sets: configured regions and hosts, configured tiers (anything else is `other`), catalog
 * statuses, pool states, campaign states and fold outcomes. No label ever carries a tenant id, so
 * the number of series depends on the configuration, never on the number of tenants.
 */
import { Counter, Gauge, Registry, type RegistryContentType } from "prom-client";
import type { LessorConfig } from "../config/index.ts";
import { campaignStates, tenantStates } from "../core/campaign.ts";
import type { MetricsReadings } from "../fleet/overview.ts";
import type { FoldOutcomeKind } from "../folds/outcome.ts";
import { repairKinds } from "../rpc/budget.ts";

/** The two exposition formats a scraper may ask for. */
export type MetricsFormat = "openmetrics" | "prometheus";

/** Picks the format from `Accept`, as Prometheus' own client libraries do: OpenMetrics if asked. */
export function negotiateFormat(accept: string | undefined): MetricsFormat {
  return accept?.includes("application/openmetrics-text") ? "openmetrics" : "prometheus";
}

const catalogStatuses = ["provisioning", "active", "disabled", "erasing"] as const;
const foldOutcomeKinds = [
  "folded",
  "skipped_pinned",
  "skipped_lock_busy",
  "failed",
] as const satisfies readonly FoldOutcomeKind[];

/**
 * Renders the readings, one entry per region; returns the body and its content type. Every series
 * derived from a region's hosts or control plane carries a `region` label (a configured region,
 * never a tenant: docs/adr/023-regions.md), so one region's series never mix with another's.
 */
export async function renderMetrics(
  regionReadings: readonly MetricsReadings[],
  config: LessorConfig,
  format: MetricsFormat,
): Promise<{ body: string; contentType: string }> {
  // A registry per scrape: prom-client's global registry would keep series across scrapes and
  // isolates, and its default (process) metrics describe an isolate, which means nothing here.
  const registry = new Registry<RegistryContentType>();
  registry.setContentType(
    format === "openmetrics" ? Registry.OPENMETRICS_CONTENT_TYPE : Registry.PROMETHEUS_CONTENT_TYPE,
  );
  const registers = [registry];
  const gauge = (name: string, help: string, labelNames: readonly string[] = []) =>
    new Gauge({ name, help, labelNames, registers });
  const counter = (name: string, help: string, labelNames: readonly string[] = []) =>
    new Counter({ name, help, labelNames, registers });
  const tiers = [...config.poolSizes.keys()];
  const tierLabel = (tier: string) => (config.poolSizes.has(tier) ? tier : "other");
  const any = (pick: (r: MetricsReadings) => boolean) => regionReadings.some(pick);

  gauge("lessor_up", "Whether this Worker answered the scrape (always 1 when there is an answer).").set(1);
  const controlPlaneUp = gauge(
    "lessor_control_plane_up",
    "Whether the region's control-plane database answered this scrape; series derived from it are absent when 0.",
    ["region"],
  );

  // ── Configuration ──────────────────────────────────────────────────────────────────────────────
  const maxConnections = gauge(
    "lessor_config_max_connections",
    "Connection budget of the host: the most connections Lessor opens on it (LESSOR_BUDGETS).",
    ["region", "host"],
  );
  const reserveConnections = gauge(
    "lessor_config_reserve_connections",
    "Part of the host's budget kept for maintenance connections; pools never use it.",
    ["region", "host"],
  );
  for (const host of config.hosts.values()) {
    maxConnections.set({ region: host.region, host: host.name }, host.budget.connections);
    reserveConnections.set({ region: host.region, host: host.name }, host.budget.reserve);
  }
  const poolSize = gauge(
    "lessor_config_pool_size",
    "Connections in one pool of the tier: what a pool holds on a fixed host, and starts with on an adaptive one.",
    ["tier"],
  );
  for (const [tier, size] of config.poolStartSizes) poolSize.set({ tier }, size);
  const poolMax = gauge(
    "lessor_config_pool_max",
    "The most connections a pool of the tier may hold (a hard cap; adaptive pools grow up to it).",
    ["tier"],
  );
  for (const [tier, max] of config.poolSizes) poolMax.set({ tier }, max);
  const adaptiveEnabled = gauge(
    "lessor_config_adaptive",
    "Whether the host runs adaptive admission (pools sized by observed use between a floor and the tier's maximum).",
    ["region", "host"],
  );
  for (const host of config.hosts.values()) {
    adaptiveEnabled.set({ region: host.region, host: host.name }, host.adaptive ? 1 : 0);
  }

  // ── Budgets (each host's BudgetObject) ─────────────────────────────────────────────────────────
  const budgetUp = gauge("lessor_budget_up", "Whether the host's BudgetObject answered this scrape.", [
    "region",
    "host",
  ]);
  const connections = gauge(
    "lessor_budget_connections",
    "Connections held against the host's budget, by phase: reserved (pools starting), allocated (ready), draining.",
    ["region", "host", "phase"],
  );
  const pools = gauge(
    "lessor_pools",
    "Pools by state. starting/ready/draining from the host's budget ledger; failed: tenants whose latest lifecycle event in the last 24 h moved them to failed.",
    ["region", "host", "state"],
  );
  const waiting = gauge(
    "lessor_admission_waiting_starts",
    "Pool starts waiting for budget on the host (bounded FIFO; each waits at most LESSOR_ADMISSION_WAIT_MS).",
    ["region", "host"],
  );
  const leases = gauge(
    "lessor_leases_in_use",
    "Leases held on the host's pools, as each pool last reported (at most one 30 s heartbeat old).",
    ["region", "host"],
  );
  const admissions = counter(
    "lessor_admissions_total",
    "Pool starts the host's budget granted, or refused for want of capacity (capacity_saturated).",
    ["region", "host", "outcome"],
  );
  const evictions = counter(
    "lessor_evictions_total",
    "Idle pools the host's budget drained to admit another start.",
    ["region", "host"],
  );
  const pooled = gauge(
    "lessor_pooled_connections",
    "Connections of allocated pools by use: in_use (leases, as each pool last reported) and idle (the rest of their allowances).",
    ["region", "host", "use"],
  );
  const resized = gauge(
    "lessor_pool_resized_connections",
    "Connections pools hold now past (grown) or below (shrunk) the size they started at (adaptive admission).",
    ["region", "host", "direction"],
  );
  const growths = counter(
    "lessor_pool_growths_total",
    "Growths of adaptive pools: connections the host's budget admitted (granted), and growths it refused (refused).",
    ["region", "host", "outcome"],
  );
  const shrinks = counter(
    "lessor_pool_shrunk_connections_total",
    "Connections adaptive pools gave back: idle for a whole window (idle), or taken back for a waiting start or growth (reclaimed).",
    ["region", "host", "reason"],
  );
  const repairs = counter(
    "lessor_repairs_total",
    "Accounting repairs on the host, each also logged: allocation_released (the reconcile released an allocation no pool holds), lease_count_corrected (a ledger lease count differed from its pool's), phase_corrected (an allocation left draining by an eviction whose answer a reset lost), lease_reclaimed (a pool reclaimed a lease held past its bound), close_forced (a generation's close was cut past its bound), orphan_terminated, maintenance_expired. Any non-zero rate is a defect caught.",
    ["region", "host", "repair"],
  );
  const tenants = any((r) => r.controlPlaneUp)
    ? gauge("lessor_tenants", "Tenants in the catalog, by host, tier and status.", [
        "region",
        "host",
        "tier",
        "status",
      ])
    : null;
  const usageCounters = any((r) => r.usage !== null)
    ? {
        queries: counter(
          "lessor_stats_queries_total",
          "Statements run on the region's tenant databases (exact).",
          ["region"],
        ),
        errors: counter("lessor_stats_errors_total", "Statements that failed, in the region (exact).", [
          "region",
        ]),
        rows: counter("lessor_stats_rows_returned_total", "Rows returned to the region's tenants (exact).", [
          "region",
        ]),
        leaseSeconds: counter(
          "lessor_stats_lease_seconds_total",
          "Time the region's connections were leased, in seconds.",
          ["region"],
        ),
        poolStarts: counter("lessor_pool_starts_total", "Pools started in the region (exact).", ["region"]),
      }
    : null;
  const campaignGauges = any((r) => r.campaigns !== null)
    ? {
        campaigns: gauge("lessor_campaigns", "Migration campaigns of the region by state.", [
          "region",
          "state",
        ]),
        tenants: gauge(
          "lessor_campaign_tenants",
          "Tenants of unfinished campaigns (pending, canary, rollout, paused) by their state in the campaign.",
          ["region", "state"],
        ),
      }
    : null;
  const foldGauges = any((r) => r.folds !== null)
    ? {
        backlog: gauge("lessor_fold_backlog_deltas", "Usage deltas waiting for the region's fold.", [
          "region",
        ]),
        oldest: gauge(
          "lessor_fold_backlog_oldest_age_seconds",
          "Age of the oldest usage delta waiting (0 when none).",
          ["region"],
        ),
        pinned: gauge(
          "lessor_fold_horizon_pinned",
          "Whether a backend genuinely pins the region's control-plane MVCC horizon now (folds stand down).",
          ["region"],
        ),
        runs: gauge(
          "lessor_fold_runs",
          "Fold runs by outcome over the retained outcomes (LESSOR_FOLD_OUTCOMES_RETENTION_DAYS, 7 days): a window, not a counter.",
          ["region", "outcome"],
        ),
        lastOutcome: gauge("lessor_fold_last_outcome", "1 for the outcome of the latest fold run.", [
          "region",
          "outcome",
        ]),
        lastRun: gauge(
          "lessor_fold_last_run_timestamp_seconds",
          "When the latest fold run started (0: never).",
          ["region"],
        ),
        lastFolded: gauge(
          "lessor_fold_last_folded_timestamp_seconds",
          "When a fold last drained deltas (0: never).",
          ["region"],
        ),
      }
    : null;

  for (const readings of regionReadings) {
    const region = readings.region;
    const hosts = [...config.hosts.values()].filter((host) => host.region === region);
    controlPlaneUp.set({ region }, readings.controlPlaneUp ? 1 : 0);
    for (const reading of readings.hosts) {
      const host = reading.host;
      budgetUp.set({ region, host }, reading.ok ? 1 : 0);
      if (!reading.ok) continue;
      const s = reading.status;
      connections.set({ region, host, phase: "allocated" }, s.allocated);
      connections.set({ region, host, phase: "reserved" }, s.reserved);
      connections.set({ region, host, phase: "draining" }, s.draining);
      pools.set({ region, host, state: "starting" }, s.pools.reserved);
      pools.set({ region, host, state: "ready" }, s.pools.allocated);
      pools.set({ region, host, state: "draining" }, s.pools.draining);
      waiting.set({ region, host }, s.waiters);
      leases.set({ region, host }, s.leases);
      admissions.inc({ region, host, outcome: "granted" }, s.admissions);
      admissions.inc({ region, host, outcome: "refused" }, s.saturations);
      evictions.inc({ region, host }, s.evictions);
      // Absent from a BudgetObject older than adaptive admission (mid-deploy): no series then.
      if (s.pooled && s.adaptive) {
        pooled.set({ region, host, use: "in_use" }, s.pooled.inUse);
        pooled.set({ region, host, use: "idle" }, s.pooled.idle);
        resized.set({ region, host, direction: "grown" }, s.pooled.grown);
        resized.set({ region, host, direction: "shrunk" }, s.pooled.shrunk);
        growths.inc({ region, host, outcome: "granted" }, s.adaptive.growths);
        growths.inc({ region, host, outcome: "refused" }, s.adaptive.growthsRefused);
        shrinks.inc({ region, host, reason: "idle" }, s.adaptive.shrinks);
        shrinks.inc({ region, host, reason: "reclaimed" }, s.adaptive.reclaimShrinks);
      }
      const r = s.reconciled;
      repairs.inc({ region, host, repair: "allocation_released" }, r.allocationsReleased);
      repairs.inc({ region, host, repair: "orphan_terminated" }, r.orphansTerminated);
      repairs.inc({ region, host, repair: "maintenance_expired" }, r.maintenanceExpired);
      for (const kind of repairKinds) repairs.inc({ region, host, repair: kind }, r[kind]);
    }
    if (readings.failingByHost) {
      for (const host of hosts)
        pools.set({ region, host: host.name, state: "failed" }, readings.failingByHost.get(host.name) ?? 0);
    }

    // ── Control plane: catalog, usage, campaigns, folds ──────────────────────────────────────────
    if (readings.controlPlaneUp && tenants) {
      // Every combination is written, so a series never appears or vanishes with a tenant.
      for (const host of hosts)
        for (const tier of [...tiers, "other"])
          for (const status of catalogStatuses) tenants.set({ region, host: host.name, tier, status }, 0);
      for (const row of readings.tenants) {
        if (config.hosts.get(row.host)?.region !== region) continue;
        const status = catalogStatuses.find((s) => s === row.status);
        if (!status) continue;
        tenants.inc({ region, host: row.host, tier: tierLabel(row.tier), status }, row.count);
      }
    }
    if (readings.usage && usageCounters) {
      const u = readings.usage.usage;
      usageCounters.queries.inc({ region }, u.queries);
      usageCounters.errors.inc({ region }, u.errors);
      usageCounters.rows.inc({ region }, u.rowsReturned);
      usageCounters.leaseSeconds.inc({ region }, u.leaseMs / 1000);
      usageCounters.poolStarts.inc({ region }, u.poolStarts);
    }
    if (readings.campaigns && campaignGauges) {
      for (const state of campaignStates)
        campaignGauges.campaigns.set({ region, state }, readings.campaigns.campaigns[state]);
      for (const state of tenantStates)
        campaignGauges.tenants.set({ region, state }, readings.campaigns.tenants[state]);
    }
    if (readings.folds && foldGauges) {
      const f = readings.folds;
      foldGauges.backlog.set({ region }, f.backlog.deltas);
      foldGauges.oldest.set({ region }, f.backlog.oldestAgeSeconds ?? 0);
      foldGauges.pinned.set({ region }, f.horizon.pinned ? 1 : 0);
      const c = f.counters;
      const byOutcome = {
        folded: c.foldedRuns,
        skipped_pinned: c.skippedPinned,
        skipped_lock_busy: c.skippedLockBusy,
        failed: c.failed,
      } as const;
      for (const outcome of foldOutcomeKinds) {
        foldGauges.runs.set({ region, outcome }, byOutcome[outcome]);
        foldGauges.lastOutcome.set({ region, outcome }, f.outcomes[0]?.outcome === outcome ? 1 : 0);
      }
      const seconds = (iso: string | null) => (iso === null ? 0 : Date.parse(iso) / 1000);
      foldGauges.lastRun.set({ region }, seconds(c.lastRunAt));
      foldGauges.lastFolded.set({ region }, seconds(c.lastFoldedAt));
    }
  }
  return { body: await registry.metrics(), contentType: registry.contentType };
}
