/**
 * What Lessor costs to run, from the figures a bench run measured and the providers' published
 * prices: one million `/sql` requests, one warm pool for an hour, one cold start, a month for a
 * fleet, and the idle timeout at which keeping a pool warm costs what restarting it does.
 *
 * Prices read on 2026-12-01 (USD, Workers Paid plan, Standard usage model; Neon Launch plan):
 *
 * - Workers: $0.30 per million requests beyond 10 million a month; $0.02 per million CPU
 *   milliseconds beyond 30 million a month; $5 a month minimum.
 *   https://developers.cloudflare.com/workers/platform/pricing/
 * - Durable Objects: $0.15 per million requests beyond 1 million a month (every RPC method call on
 *   a stub is one request; so is every alarm invocation); duration $12.50 per million GB-s beyond
 *   400,000 GB-s a month, at 128 MB per object, billed while the object is active or idle in memory
 *   but unable to hibernate (an object holding outbound WebSockets, a warm pool's, cannot).
 *   https://developers.cloudflare.com/durable-objects/platform/pricing/
 *   SQLite-backed storage: $1.00 per million rows written beyond 50 million a month.
 * - Neon compute: $0.106 per CU-hour on the Launch plan ($0.222 on Scale); 1 CU is 1 vCPU and
 *   4 GB. A compute scales to zero after 5 minutes without active queries: idle pooled connections
 *   do not keep it awake, so a warm Lessor pool costs the host nothing until it queries.
 *   https://neon.com/docs/introduction/plans, https://neon.com/docs/introduction/compute-lifecycle
 *
 * - Neon egress (public network transfer): 100 GB a month included on Launch and Scale, then
 *   $0.10 per GB. Projects: 100 on Launch, 1,000 on Scale (a host is a project or a branch).
 *   https://neon.com/docs/introduction/plans (read 2026-12-03)
 * - Neon scale to zero: a compute suspends after 5 minutes without activity (Launch default; Scale
 *   configurable from 1 minute); it is billed per second while it runs, at its size (0.25 CU at
 *   least). https://neon.com/docs/introduction/plans, "Scale to zero"
 *
 * The model is deliberately conservative where the bench cannot split a figure: the CPU of the
 * isolate that runs both the Worker and the objects is billed as Worker CPU (in production the
 * objects' share is already paid for by their duration), and a cold start's Postgres CPU is billed
 * at Neon's CU rate as if the host's compute did nothing else.
 */

export const prices = {
  readOn: "2026-12-01",
  workerRequestPerMillion: 0.3,
  workerCpuMsPerMillion: 0.02,
  objectRequestPerMillion: 0.15,
  objectGbSecondPerMillion: 12.5,
  objectMemoryGb: 0.125,
  objectRowsWrittenPerMillion: 1.0,
  neonCuHour: 0.106,
  neonEgressPerGb: 0.1,
  neonEgressIncludedGb: 100,
  neonSuspendAfterSeconds: 300,
  neonMinCu: 0.25,
  sources: {
    workers: "https://developers.cloudflare.com/workers/platform/pricing/",
    durableObjects: "https://developers.cloudflare.com/durable-objects/platform/pricing/",
    neon: "https://neon.com/docs/introduction/plans",
  },
} as const;

/** Seconds in an average month (365.25 / 12 days). */
const monthSeconds = 30.4375 * 86_400;
/** How often a warm pool's object wakes: its heartbeat alarm, which also reports to the host's budget. */
const heartbeatSeconds = 30;

/**
 * Rows the heartbeat's outbox flush writes for one start-and-stop cycle: its four lifecycle events
 * (each marked, then deleted: 8) and its usage, staged once (inserted, marked, deleted: 3).
 */
export const outboxFlushRowsPerCycle = 11;

export interface PriceInputs {
  /** Isolate CPU per warm `/sql` request (Worker and objects together), ms. */
  cpuMsPerRequest: number;
  /** Isolate CPU of one cold start (the first request of a stopped tenant, all of it), ms. */
  coldStartCpuMs: number;
  /** Postgres CPU of one cold start (the control plane's claim and the host's logins), ms. */
  coldStartPostgresCpuMs: number;
  /**
   * Rows a start and the stop after it write to the object's storage (measured), plus the rows the
   * heartbeat's outbox flush writes for their lifecycle events and usage (`outboxFlushRowsPerCycle`).
   */
  coldStartStorageRows: number;
}

export interface PriceModel {
  inputs: PriceInputs;
  prices: typeof prices;
  /** Marginal cost of one million warm `/sql` requests (past every included allowance). */
  perMillionRequests: { workerRequests: number; objectRequests: number; cpu: number; total: number };
  /** One pool kept warm for an hour: its object's duration, and its heartbeats (an alarm and a budget report each). */
  warmPoolHour: { duration: number; heartbeats: number; total: number };
  /** One cold start beyond the request that caused it (and the stop that ends it): objects' requests, storage rows, CPU, Postgres CPU. */
  coldStart: { objectRequests: number; storage: number; cpu: number; postgres: number; total: number };
  /**
   * How long after its last request a warm pool costs what one cold start costs: the rent-or-buy
   * break-even (docs/adr/021-idle-timeout-from-price.md).
   */
  breakEvenIdleSeconds: number;
  fleets: FleetMonth[];
}

export interface FleetMonth {
  tenants: number;
  /** Share of tenants whose pool is warm at any moment. */
  warmShare: number;
  requestsPerTenant: number;
  coldStartsPerTenant: number;
  workers: number;
  objectRequests: number;
  cpu: number;
  warmPools: number;
  coldStarts: number;
  total: number;
  perTenant: number;
}

/**
 * Durable Object requests a cold start adds to the request that caused it: the control-plane
 * shard's generation claim, the budget's admit and confirm, and the first alarm.
 */
const coldStartObjectRequests = 4;

/** The fleets the model prices: their size, warm share and traffic, stated (not measured). */
export const fleetScenarios: readonly Omit<
  FleetMonth,
  "workers" | "objectRequests" | "cpu" | "warmPools" | "coldStarts" | "total" | "perTenant"
>[] = [
  { tenants: 1_000, warmShare: 0.2, requestsPerTenant: 100_000, coldStartsPerTenant: 300 },
  { tenants: 100_000, warmShare: 0.05, requestsPerTenant: 20_000, coldStartsPerTenant: 60 },
];

export function priceModel(inputs: PriceInputs): PriceModel {
  const perMillionRequests = {
    workerRequests: prices.workerRequestPerMillion,
    objectRequests: prices.objectRequestPerMillion,
    cpu: inputs.cpuMsPerRequest * prices.workerCpuMsPerMillion,
    total: 0,
  };
  perMillionRequests.total =
    perMillionRequests.workerRequests + perMillionRequests.objectRequests + perMillionRequests.cpu;

  const objectSecond = (prices.objectMemoryGb * prices.objectGbSecondPerMillion) / 1e6;
  const heartbeatsPerHour = 3600 / heartbeatSeconds;
  const warmPoolHour = {
    duration: 3600 * objectSecond,
    heartbeats: (heartbeatsPerHour * 2 * prices.objectRequestPerMillion) / 1e6,
    total: 0,
  };
  warmPoolHour.total = warmPoolHour.duration + warmPoolHour.heartbeats;

  const neonCpuMs = prices.neonCuHour / 3_600_000;
  const coldStart = {
    objectRequests: (coldStartObjectRequests * prices.objectRequestPerMillion) / 1e6,
    storage: (inputs.coldStartStorageRows * prices.objectRowsWrittenPerMillion) / 1e6,
    cpu: (inputs.coldStartCpuMs * prices.workerCpuMsPerMillion) / 1e6,
    postgres: inputs.coldStartPostgresCpuMs * neonCpuMs,
    total: 0,
  };
  coldStart.total = coldStart.objectRequests + coldStart.storage + coldStart.cpu + coldStart.postgres;

  const warmPerSecond = warmPoolHour.total / 3600;
  const breakEvenIdleSeconds = coldStart.total / warmPerSecond;

  const fleets = fleetScenarios.map((scenario): FleetMonth => {
    const requests = scenario.tenants * scenario.requestsPerTenant;
    const workers =
      5 +
      (Math.max(0, requests - 10e6) * prices.workerRequestPerMillion) / 1e6 +
      (Math.max(0, requests * inputs.cpuMsPerRequest - 30e6) * prices.workerCpuMsPerMillion) / 1e6;
    const objectRequests = (Math.max(0, requests - 1e6) * prices.objectRequestPerMillion) / 1e6;
    const warmPools = scenario.tenants * scenario.warmShare * (monthSeconds / 3600) * warmPoolHour.total;
    const coldStarts = scenario.tenants * scenario.coldStartsPerTenant * coldStart.total;
    const total = workers + objectRequests + warmPools + coldStarts;
    return {
      ...scenario,
      workers,
      objectRequests,
      cpu: (requests * inputs.cpuMsPerRequest * prices.workerCpuMsPerMillion) / 1e6,
      warmPools,
      coldStarts,
      total,
      perTenant: total / scenario.tenants,
    };
  });

  return { inputs, prices, perMillionRequests, warmPoolHour, coldStart, breakEvenIdleSeconds, fleets };
}

function usd(value: number, digits = 2): string {
  return `$${value.toFixed(digits)}`;
}

/** The model as markdown, for the bench's output, the README and docs/scaling.md. */
export function priceTable(model: PriceModel): string {
  const m = model;
  const lines = [
    `Prices read ${m.prices.readOn}: Workers ${usd(m.prices.workerRequestPerMillion)}/M requests and ${usd(m.prices.workerCpuMsPerMillion)}/M CPU ms; Durable Objects ${usd(m.prices.objectRequestPerMillion)}/M requests and ${usd(m.prices.objectGbSecondPerMillion)}/M GB-s at ${m.prices.objectMemoryGb * 1024} MB; Neon ${usd(m.prices.neonCuHour, 3)}/CU-hour (Launch).`,
    `Measured in this run: ${m.inputs.cpuMsPerRequest.toFixed(2)} ms isolate CPU per warm request; a cold start ${m.inputs.coldStartCpuMs.toFixed(1)} ms isolate CPU, ${m.inputs.coldStartPostgresCpuMs.toFixed(1)} ms Postgres CPU and ${m.inputs.coldStartStorageRows} storage rows written with its stop (outbox flush included).`,
    "",
    "| what | price |",
    "| --- | --- |",
    `| 1,000,000 warm \`/sql\` requests | ${usd(m.perMillionRequests.total)} (Worker requests ${usd(m.perMillionRequests.workerRequests)}, object requests ${usd(m.perMillionRequests.objectRequests)}, CPU ${usd(m.perMillionRequests.cpu, 3)}) |`,
    `| one pool warm for an hour | ${usd(m.warmPoolHour.total, 5)} (duration ${usd(m.warmPoolHour.duration, 5)}, heartbeats ${usd(m.warmPoolHour.heartbeats, 5)}); ${usd(m.warmPoolHour.total * (monthSeconds / 3600))} a month |`,
    `| one cold start and its stop | ${usd(m.coldStart.total, 7)} (object requests ${usd(m.coldStart.objectRequests, 7)}, storage rows ${usd(m.coldStart.storage, 7)}, CPU ${usd(m.coldStart.cpu, 7)}, Postgres ${usd(m.coldStart.postgres, 7)}) |`,
    `| idle time at which a warm pool has cost one cold start | ${m.breakEvenIdleSeconds.toFixed(1)} s |`,
    "",
    "| fleet | warm share | requests / tenant / month | cold starts / tenant / month | Workers | object requests | warm pools | cold starts | month | per tenant |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ...m.fleets.map(
      (f) =>
        `| ${f.tenants.toLocaleString("en-US")} tenants | ${(f.warmShare * 100).toFixed(0)} % | ${f.requestsPerTenant.toLocaleString("en-US")} | ${f.coldStartsPerTenant} | ${usd(f.workers)} | ${usd(f.objectRequests)} | ${usd(f.warmPools)} | ${usd(f.coldStarts)} | ${usd(f.total)} | ${usd(f.perTenant, 3)} |`,
    ),
  ];
  return lines.join("\n");
}

/**
 * The Neon side of a fleet (docs/adr/028-a-fleet-that-sleeps.md): each host's compute and each
 * region's control-plane compute, billed while awake, and egress. Before issue 44, the cron's
 * per-host jobs queried every host every minute and every job read the control plane every
 * minute, so no compute ever reached its 5 minutes without a query: every one was billed all
 * month. Now a host is awake while its pools run (plus the 5 minutes after its last query, plus
 * the look a minute after a pool stops) and for each slow visit (every `LESSOR_SWEEP_MINUTES`: one
 * connection, then 5 minutes until it suspends). The control plane is still read every minute by
 * the fold, campaigns, erase and move resume (test/integration/idle-hour.test.ts counts them), so
 * it is billed all month.
 */
export interface HostingScenario {
  name: string;
  hosts: number;
  regions: number;
  /** Share of the month a host has a live pool (the fleet's busy hours), stated. */
  busyShare: number;
  /** Pool stops a host sees a month (each adds the look a minute later). */
  poolStopsPerHost: number;
  /** Egress from all hosts, GB a month (answers to clients). */
  egressGb: number;
  /** Compute size of a busy host, CU (an idle one autoscales down to 0.25). */
  hostCu: number;
}

export const hostingScenarios: readonly HostingScenario[] = [
  {
    name: "idle fleet",
    hosts: 200,
    regions: 1,
    busyShare: 0,
    poolStopsPerHost: 0,
    egressGb: 0,
    hostCu: 0.25,
  },
  {
    name: "busy fleet",
    hosts: 200,
    regions: 1,
    busyShare: 0.3,
    poolStopsPerHost: 3_000,
    egressGb: 2_000,
    hostCu: 1,
  },
];

export interface HostingMonth {
  scenario: HostingScenario;
  monthHours: number;
  /** Hours a month one host is awake: busy hours, pool stops' tails, slow visits. */
  hostAwakeHours: number;
  hosts: number;
  controlPlanes: number;
  egress: number;
  total: number;
  /** The same fleet before issue 44: every compute awake all month. */
  before: { hosts: number; controlPlanes: number; egress: number; total: number };
}

export function hostingMonth(scenario: HostingScenario, sweepMinutes = 360): HostingMonth {
  const monthHours = monthSeconds / 3600;
  const tailHours = prices.neonSuspendAfterSeconds / 3600;
  const idleHours = monthHours * (1 - scenario.busyShare);
  // A slow visit in idle hours wakes the compute for its suspend timeout (the visit itself takes
  // seconds); one in busy hours costs nothing more.
  const visits = (idleHours * 60) / sweepMinutes;
  // A pool stop: the compute would have suspended 5 minutes after the last query; the look a
  // minute later moves that by a minute.
  const stopTails = scenario.poolStopsPerHost * (60 / 3600);
  const busyHours = scenario.busyShare * monthHours;
  const quietAwakeHours = Math.min(idleHours, visits * tailHours + stopTails);
  const hostAwakeHours = busyHours + quietAwakeHours;
  const cuHour = prices.neonCuHour;
  // Busy hours at the host's size; the quiet ones (a visit, a stop's tail) at the minimum the
  // compute autoscales down to.
  const hosts = scenario.hosts * (busyHours * scenario.hostCu + quietAwakeHours * prices.neonMinCu) * cuHour;
  const controlPlanes = scenario.regions * monthHours * prices.neonMinCu * cuHour;
  const egress = Math.max(0, scenario.egressGb - prices.neonEgressIncludedGb) * prices.neonEgressPerGb;
  const beforeHosts =
    scenario.hosts *
    monthHours *
    (scenario.busyShare * scenario.hostCu + (1 - scenario.busyShare) * prices.neonMinCu) *
    cuHour;
  return {
    scenario,
    monthHours,
    hostAwakeHours,
    hosts,
    controlPlanes,
    egress,
    total: hosts + controlPlanes + egress,
    before: {
      hosts: beforeHosts,
      controlPlanes,
      egress,
      total: beforeHosts + controlPlanes + egress,
    },
  };
}

/** The hosting months as markdown, with the arithmetic. */
export function hostingTable(sweepMinutes = 360): string {
  const rows = hostingScenarios.map((s) => hostingMonth(s, sweepMinutes));
  const lines = [
    `Neon ${usd(prices.neonCuHour, 3)}/CU-hour (Launch), suspend after ${prices.neonSuspendAfterSeconds / 60} min, egress ${usd(prices.neonEgressPerGb)}/GB past ${prices.neonEgressIncludedGb} GB; a month of ${(monthSeconds / 3600).toFixed(1)} h; slow visit every ${sweepMinutes} min.`,
    "",
    "| fleet | hosts | busy share | host awake h/month | hosts | control plane | egress | month | before issue 44 (always awake) |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ...rows.map(
      (r) =>
        `| ${r.scenario.name} | ${r.scenario.hosts} × ${r.scenario.hostCu} CU | ${(r.scenario.busyShare * 100).toFixed(0)} % | ${r.hostAwakeHours.toFixed(1)} | ${usd(r.hosts)} | ${usd(r.controlPlanes)} | ${usd(r.egress)} | ${usd(r.total)} | ${usd(r.before.total)} |`,
    ),
  ];
  return lines.join("\n");
}

if (import.meta.url === `file://${process.argv[1]}`) console.log(hostingTable());
