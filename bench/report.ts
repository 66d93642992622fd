/**
 * What a bench run reports: the measurements, the ratios of Lessor to each baseline, the targets of
 * issue 7 (reported as met or missed, never asserted), and the markdown that shows them.
 */
import type { CpuSample } from "./processes.ts";
import type { ProfileSummary } from "./profile.ts";

export type PathName = "lessor" | "lessor-ws" | "bare" | "newconn" | "noop" | "pg";
/** direct: to the Worker's own workerd; proxy: through wrangler dev's proxy; node: no Worker. */
export type Route = "direct" | "proxy" | "node";
export type QueryName = "select1" | "indexed";
/** light: node:http (bench/load.ts); undici: Node's global fetch, as a plain client sends it. */
export type Transport = "light" | "undici" | "pg";

export interface Measurement {
  label: string;
  path: PathName;
  route: Route;
  query: QueryName;
  transport: Transport;
  /** The dev server's log level for this measurement (wrangler's default is "info"). */
  logLevel: string;
  concurrency: number;
  requests: number;
  errors: number;
  errorSamples: string[];
  elapsedS: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  meanMs: number;
  /** CPU milliseconds per completed request, by process group. */
  cpuMsPerRequest: CpuSample;
  /** CPU seconds of the bench's own processes per wall second: how many cores they kept busy. */
  coresBusy: number;
  /** The same for every other process on the machine (other work competing for the cores). */
  otherCoresBusy: number;
  /** The machine's 1-minute load average when the measurement ended. */
  loadavg1: number;
  /**
   * Other work kept more than a fifth of a core busy while this ran: its figures are hints, marked
   * with † in every table, and never the headline.
   */
  contended: boolean;
  /** Throughput of each interleaved round, in order (absent from results files before 2026-12-01). */
  roundRps?: number[];
}

/** Other processes' CPU above which a measurement is marked contended (cores). */
export const contendedCores = 0.2;

/** What identifies a measurement. */
export type Spec = Pick<Measurement, "path" | "route" | "query" | "transport" | "logLevel" | "concurrency">;

export interface Ratio {
  query: QueryName;
  route: Route;
  concurrency: number;
  lessorRps: number;
  /** Throughput of Lessor divided by the baseline's (null when the baseline was not measured). */
  vsBare: number | null;
  /**
   * Lessor's throughput in each interleaved round divided by the bare object's in the same round:
   * their median, lowest and highest. The ≥ 0.9 goal is judged on the median.
   */
  vsBareRounds: { median: number; min: number; max: number; rounds: number } | null;
  vsNewconn: number | null;
  vsNoop: number | null;
  vsPg: number | null;
  /**
   * Total CPU per request of the bare path divided by Lessor's: the throughput ratio a machine
   * whose cores are all busy would give. Unlike measured throughput, it hardly depends on what else
   * runs on the machine.
   */
  cpuVsBare: number | null;
  /** The same against a new connection per request. */
  cpuVsNewconn: number | null;
  /** Lessor's isolate CPU per request (the Worker and its objects) divided by the bare path's. */
  isolateCpuVsBare: number | null;
  /** Either side measured while other work ran on the machine. */
  contended: boolean;
  /** p50 of Lessor divided by the baseline's p50. */
  p50VsBare: number | null;
  p50VsNewconn: number | null;
}

export interface StormResult {
  tenant: string;
  /** The storm issue 7 asks for, and the one this machine could take (see `sizing`). */
  requested: number;
  requests: number;
  sizing: { probeRps: number; budgetSeconds: number; note: string };
  errors: number;
  errorSamples: string[];
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  wallMs: number;
  /** From the first send to the first answer: how long the start took with the burst arriving. */
  firstAnswerMs: number;
  /** Three independent counts of pool starts: all must be 1. */
  starts: { runtimeGeneration: number; applicationNames: number; generationLedgerRows: number };
  /** Single cold starts of other fresh tenants, one request each. */
  singleColdMs: number[];
  singleColdMedianMs: number;
  /** CPU ms each single cold start cost, by process group (measured from /proc around the request). */
  singleColdCpuMs?: { workerdWorker: number[]; postgres: number[]; wsProxy: number[] };
  /** Rows the tenant object's storage wrote for each single cold start, and for stopping it again. */
  singleColdStorageRows?: { start: number[]; stop: number[] };
  /** The same burst again, now that the pool is warm: what queueing alone costs. */
  warmBurst: {
    requests: number;
    errors: number;
    p50Ms: number;
    p99Ms: number;
    wallMs: number;
    firstAnswerMs: number;
  };
}

/** Admission on a host whose budget holds exactly two pools (see run.ts, `admission`). */
export interface AdmissionResult {
  host: string;
  budget: { connections: number; reserve: number; poolCapacity: number; poolSize: number };
  admissionWaitMs: number;
  tenants: number;
  /** First requests that found room in the budget (the two pools that fill it). */
  withRoomMs: number[];
  /** (a) First requests admitted by evicting the least recently used idle pool. */
  evicting: {
    requests: number;
    errors: number;
    errorSamples: string[];
    p50Ms: number;
    p99Ms: number;
    maxMs: number;
    /** The budget's eviction counter over the phase: one per request. */
    evictions: number;
  };
  /** (b) First requests refused while session leases hold both pools. */
  saturated: {
    rounds: number;
    concurrency: number;
    requests: number;
    /** Answers that were anything but 503 `capacity_saturated` with `Retry-After`. */
    errors: number;
    errorSamples: string[];
    retryAfter: string[];
    p50Ms: number;
    p99Ms: number;
    minMs: number;
    maxMs: number;
    /** The budget's saturation counter over the phase: one per refusal. */
    saturations: number;
    /** The leased pools afterwards: still ready, same generation (never evicted). */
    leasedPoolsKept: boolean;
    /** Session leases released at the end with 204 (of 2). */
    leasesReleased: number;
  };
  /** GET /v1/capacity sampled through both measurements. */
  capacity: {
    samples: number;
    maxAllocatedPlusReserved: number;
    maxAllocatedPlusReservedPlusDraining: number;
    maxWaiters: number;
    /** Samples where allocated + reserved (+ draining) exceeded the pools' capacity: must be 0. */
    violations: number;
  };
}

export function admissionTable(a: AdmissionResult): string {
  const ms = (values: readonly number[]) => values.map((v) => fixed(v, 0)).join(", ");
  return table(
    ["measure", "value"],
    [
      [
        "host",
        `\`${a.host}\`: ${a.budget.connections} connections, reserve ${a.budget.reserve}, pools of ${a.budget.poolSize} (room for ${Math.floor(a.budget.poolCapacity / a.budget.poolSize)}); ${a.tenants} tenants; admission wait ${a.admissionWaitMs} ms`,
      ],
      ["first requests with room in the budget ms", ms(a.withRoomMs)],
      [
        "(a) first request admitted by evicting an idle LRU pool: p50 / p99 / max ms",
        `${fixed(a.evicting.p50Ms, 0)} / ${fixed(a.evicting.p99Ms, 0)} / ${fixed(a.evicting.maxMs, 0)} (${a.evicting.requests} requests, ${a.evicting.errors} errors, ${a.evicting.evictions} evictions)`,
      ],
      [
        "(b) first request refused, both pools leased: p50 / p99 (min / max) ms",
        `${fixed(a.saturated.p50Ms, 0)} / ${fixed(a.saturated.p99Ms, 0)} (${fixed(a.saturated.minMs, 0)} / ${fixed(a.saturated.maxMs, 0)}); ${a.saturated.requests} requests in ${a.saturated.rounds} rounds of ${a.saturated.concurrency}`,
      ],
      [
        "(b) answers: 503 capacity_saturated with Retry-After",
        `${a.saturated.requests - a.saturated.errors} of ${a.saturated.requests} (Retry-After: ${[...new Set(a.saturated.retryAfter)].join(", ") || "–"}); ${a.saturated.saturations} saturations counted; leased pools kept: ${a.saturated.leasedPoolsKept ? "yes" : "NO"}; leases released: ${a.saturated.leasesReleased} of 2`,
      ],
      [
        "GET /v1/capacity during (a) and (b): max allocated+reserved; +draining; max waiters",
        `${a.capacity.maxAllocatedPlusReserved}; ${a.capacity.maxAllocatedPlusReservedPlusDraining} of ${a.budget.poolCapacity}; ${a.capacity.maxWaiters} (${a.capacity.samples} samples, ${a.capacity.violations} over budget)`,
      ],
    ],
  );
}

export interface Target {
  target: string;
  met: boolean;
  detail: string;
}

export function find(
  measurements: readonly Measurement[],
  where: Partial<Pick<Measurement, "path" | "route" | "query" | "transport" | "logLevel" | "concurrency">>,
): Measurement | undefined {
  return measurements.find((m) =>
    Object.entries(where).every(([key, value]) => m[key as keyof Measurement] === value),
  );
}

/** CPU milliseconds per request of every process the bench started (the client included). */
export function totalCpu(m: Measurement): number {
  const cpu = m.cpuMsPerRequest;
  return (
    cpu.benchClient + cpu.wranglerNode + cpu.workerdProxy + cpu.workerdWorker + cpu.wsProxy + cpu.postgres
  );
}

function divide(a: number | undefined, b: number | undefined): number | null {
  return a === undefined || b === undefined || b === 0 ? null : a / b;
}

/** Lessor against every baseline, for each query, route and concurrency Lessor was measured at. */
export function ratios(measurements: readonly Measurement[]): Ratio[] {
  const out: Ratio[] = [];
  for (const lessor of measurements) {
    if (lessor.path !== "lessor" || lessor.transport !== "light" || lessor.logLevel !== "info") continue;
    const same: Partial<Spec> = {
      route: lessor.route,
      concurrency: lessor.concurrency,
      transport: "light",
      logLevel: "info",
    };
    const bare = find(measurements, { ...same, path: "bare", query: lessor.query });
    const newconn = find(measurements, { ...same, path: "newconn", query: lessor.query });
    // The floor answers every query with the same canned row.
    const noop = find(measurements, { ...same, path: "noop" });
    const pgFloor = find(measurements, { path: "pg", query: lessor.query, concurrency: lessor.concurrency });
    out.push({
      query: lessor.query,
      route: lessor.route,
      concurrency: lessor.concurrency,
      lessorRps: lessor.rps,
      vsBare: divide(lessor.rps, bare?.rps),
      vsBareRounds: pairedRatios(lessor.roundRps, bare?.roundRps),
      vsNewconn: divide(lessor.rps, newconn?.rps),
      vsNoop: divide(lessor.rps, noop?.rps),
      vsPg: divide(lessor.rps, pgFloor?.rps),
      cpuVsBare: bare ? divide(totalCpu(bare), totalCpu(lessor)) : null,
      cpuVsNewconn: newconn ? divide(totalCpu(newconn), totalCpu(lessor)) : null,
      isolateCpuVsBare: bare
        ? divide(lessor.cpuMsPerRequest.workerdWorker, bare.cpuMsPerRequest.workerdWorker)
        : null,
      contended: lessor.contended || (bare?.contended ?? false),
      p50VsBare: divide(lessor.p50Ms, bare?.p50Ms),
      p50VsNewconn: divide(lessor.p50Ms, newconn?.p50Ms),
    });
  }
  return out;
}

/** Round i of `a` divided by round i of `b`: median, lowest and highest (null without rounds). */
export function pairedRatios(
  a: readonly number[] | undefined,
  b: readonly number[] | undefined,
): Ratio["vsBareRounds"] {
  if (!a || !b) return null;
  const pairs: number[] = [];
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const x = a[i];
    const y = b[i];
    if (x !== undefined && y !== undefined && y > 0) pairs.push(x / y);
  }
  if (pairs.length === 0) return null;
  pairs.sort((x, y) => x - y);
  const mid = pairs.length >> 1;
  const median = pairs.length % 2 === 1 ? (pairs[mid] ?? 0) : ((pairs[mid - 1] ?? 0) + (pairs[mid] ?? 0)) / 2;
  return { median, min: pairs[0] ?? 0, max: pairs.at(-1) ?? 0, rounds: pairs.length };
}

/** The targets of issue 7, judged on the direct route (the one without wrangler dev's proxy). */
export function judgeTargets(all: readonly Ratio[], storm: StormResult | null): Target[] {
  const direct = all.filter((r) => r.route === "direct");
  const cells = (pick: (r: Ratio) => number | null, byCpu: (r: Ratio) => number | null, floor: number) => {
    const judged = direct.map((r) => ({ r, value: pick(r), cpu: byCpu(r) }));
    const missed = judged.filter((j) => j.value === null || j.value < floor);
    const list = judged
      .map((j) => `${j.r.query} c=${j.r.concurrency}: ${fixed(j.value, 2)} (by CPU ${fixed(j.cpu, 2)})`)
      .join(", ");
    return {
      met: judged.length > 0 && missed.length === 0,
      detail: `${judged.length - missed.length} of ${judged.length} cells (${list})`,
    };
  };
  const targets: Target[] = [
    {
      target: "Lessor warm path ≥ 90% of the bare Durable Object's throughput (median of paired rounds)",
      ...pairedCells(direct, 0.9),
    },
    {
      target: "Lessor's isolate CPU per request ≤ 1.2× the bare Durable Object's",
      ...isolateCpuCells(direct, 1.2),
    },
    {
      target: "Lessor warm path ≥ 10× new-connection-per-request",
      ...cells(
        (r) => r.vsNewconn,
        (r) => r.cpuVsNewconn,
        10,
      ),
    },
  ];
  if (storm) {
    const { starts } = storm;
    const oneStart =
      starts.runtimeGeneration === 1 && starts.applicationNames === 1 && starts.generationLedgerRows === 1;
    targets.push({
      target: "Storm makes exactly one start",
      met: oneStart && storm.errors === 0,
      detail: `generation ${starts.runtimeGeneration}, ${starts.applicationNames} application_name(s), ${starts.generationLedgerRows} ledger row(s), ${storm.errors} error(s)`,
    });
    const limit = storm.warmBurst.p99Ms + 2 * storm.singleColdMedianMs;
    targets.push({
      target: "Storm p99 ≤ the warm burst's p99 + 2× a single cold start",
      met: storm.p99Ms <= limit,
      detail: `storm p99 ${fixed(storm.p99Ms, 0)} ms vs ${fixed(storm.warmBurst.p99Ms, 0)} + 2 × ${fixed(storm.singleColdMedianMs, 0)} ms = ${fixed(limit, 0)} ms`,
    });
  }
  return targets;
}

/** Lessor against the bare object per cell, on the median of paired rounds (the whole run's ratio without them). */
function pairedCells(direct: readonly Ratio[], floor: number): { met: boolean; detail: string } {
  const judged = direct.map((r) => ({ r, value: r.vsBareRounds?.median ?? r.vsBare }));
  const missed = judged.filter((j) => j.value === null || j.value < floor);
  return {
    met: judged.length > 0 && missed.length === 0,
    detail: `${judged.length - missed.length} of ${judged.length} cells (${judged
      .map(
        (j) =>
          `${j.r.query} c=${j.r.concurrency}: ${fixed(j.value, 2)}${
            j.r.vsBareRounds
              ? ` (rounds ${fixed(j.r.vsBareRounds.min, 2)}–${fixed(j.r.vsBareRounds.max, 2)})`
              : ""
          }`,
      )
      .join(", ")})`,
  };
}

/** Lessor's isolate CPU per request (Worker and objects) against the bare object's, per cell. */
function isolateCpuCells(direct: readonly Ratio[], ceiling: number): { met: boolean; detail: string } {
  const judged = direct.map((r) => ({ r, value: r.isolateCpuVsBare }));
  const missed = judged.filter((j) => j.value === null || j.value > ceiling);
  return {
    met: judged.length > 0 && missed.length === 0,
    detail: `${judged.length - missed.length} of ${judged.length} cells (${judged
      .map((j) => `${j.r.query} c=${j.r.concurrency}: ${fixed(j.value, 2)}`)
      .join(", ")})`,
  };
}

/** The summary line a run ends with: loud when a goal is missed, and when figures were contended. */
export function verdictLine(targets: readonly Target[], measurements: readonly Measurement[]): string {
  const missed = targets.filter((t) => !t.met);
  const contended = measurements.filter((m) => m.contended).length;
  const load =
    contended > 0
      ? `; ${contended} of ${measurements.length} measurements ran while other work did (†): hints, not results`
      : "";
  return missed.length === 0
    ? `GOALS: all ${targets.length} met${load}`
    : `GOALS MISSED: ${missed.length} of ${targets.length} (${missed.map((t) => t.target).join("; ")})${load}`;
}

export function fixed(value: number | null, digits: number): string {
  return value === null ? "–" : value.toFixed(digits);
}

/** A markdown table (harness.ts re-exports it: this module has no side effects, the harness does). */
export function mdTable(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const line = (cells: readonly string[]) => `| ${cells.join(" | ")} |`;
  return [line(header), line(header.map(() => "---")), ...rows.map(line)].join("\n");
}

const table = mdTable;

const queryTitle: Record<QueryName, string> = { select1: "SELECT 1", indexed: "indexed read" };

function describe(m: Measurement): string {
  const extras = [
    m.transport === "undici" ? "global fetch" : null,
    m.logLevel !== "info" ? `log-level ${m.logLevel}` : null,
  ].filter((x): x is string => x !== null);
  return `${m.path}${extras.length ? ` (${extras.join(", ")})` : ""}`;
}

export function measurementsTable(measurements: readonly Measurement[]): string {
  return table(
    [
      "path",
      "route",
      "query",
      "c",
      "requests",
      "req/s",
      "p50 ms",
      "p99 ms",
      "errors",
      "cores: bench / others",
    ],
    measurements.map((m) => [
      describe(m),
      m.route,
      m.path === "noop" ? "(none)" : queryTitle[m.query],
      String(m.concurrency),
      String(m.requests),
      fixed(m.rps, 0),
      fixed(m.p50Ms, 2),
      fixed(m.p99Ms, 2),
      String(m.errors),
      `${fixed(m.coresBusy, 2)} / ${fixed(m.otherCoresBusy, 2)}${m.contended ? " †" : ""}`,
    ]),
  );
}

export function ratiosTable(all: readonly Ratio[]): string {
  return table(
    [
      "route",
      "query",
      "c",
      "Lessor req/s",
      "÷ bare",
      "÷ bare, paired rounds: median (min–max)",
      "÷ bare (by CPU)",
      "isolate CPU ÷ bare",
      "÷ newconn",
      "÷ newconn (by CPU)",
      "÷ noop",
      "÷ pg",
      "p50 ÷ bare",
      "p50 ÷ newconn",
    ],
    all.map((r) => [
      r.route,
      queryTitle[r.query],
      String(r.concurrency),
      `${fixed(r.lessorRps, 0)}${r.contended ? " †" : ""}`,
      fixed(r.vsBare, 2),
      r.vsBareRounds
        ? `${fixed(r.vsBareRounds.median, 2)} (${fixed(r.vsBareRounds.min, 2)}–${fixed(r.vsBareRounds.max, 2)})`
        : "–",
      fixed(r.cpuVsBare, 2),
      fixed(r.isolateCpuVsBare, 2),
      fixed(r.vsNewconn, 1),
      fixed(r.cpuVsNewconn, 1),
      fixed(r.vsNoop, 2),
      fixed(r.vsPg, 2),
      fixed(r.p50VsBare, 2),
      fixed(r.p50VsNewconn, 3),
    ]),
  );
}

/** CPU per request by process: where the time goes. */
export function profileTable(measurements: readonly Measurement[]): string {
  return table(
    [
      "path",
      "route",
      "query",
      "c",
      "req/s",
      "client",
      "wrangler node",
      "workerd proxy",
      "workerd Worker",
      "ws proxy",
      "postgres",
      "total",
    ],
    measurements.map((m) => {
      const cpu = m.cpuMsPerRequest;
      const total =
        cpu.benchClient +
        cpu.wranglerNode +
        cpu.workerdProxy +
        cpu.workerdWorker +
        cpu.wsProxy +
        cpu.postgres;
      return [
        describe(m),
        m.route,
        m.path === "noop" ? "(none)" : queryTitle[m.query],
        String(m.concurrency),
        fixed(m.rps, 0),
        fixed(cpu.benchClient, 3),
        fixed(cpu.wranglerNode, 3),
        fixed(cpu.workerdProxy, 3),
        fixed(cpu.workerdWorker, 3),
        fixed(cpu.wsProxy, 3),
        fixed(cpu.postgres, 3),
        fixed(total, 3),
      ];
    }),
  );
}

export function stormTable(storm: StormResult): string {
  return table(
    ["measure", "value"],
    [
      ["concurrent first requests", `${storm.requests} (${storm.sizing.note})`],
      ["errors", String(storm.errors)],
      ["starts: runtime generation", String(storm.starts.runtimeGeneration)],
      ["starts: distinct application_name in pg_stat_activity", String(storm.starts.applicationNames)],
      ["starts: generation ledger rows", String(storm.starts.generationLedgerRows)],
      [
        "storm p50 / p99 / max ms",
        `${fixed(storm.p50Ms, 0)} / ${fixed(storm.p99Ms, 0)} / ${fixed(storm.maxMs, 0)}`,
      ],
      [
        "storm: first send to first answer / to last answer ms",
        `${fixed(storm.firstAnswerMs, 0)} / ${fixed(storm.wallMs, 0)}`,
      ],
      [
        "single cold start ms (each fresh tenant)",
        `${storm.singleColdMs.map((v) => fixed(v, 0)).join(", ")} (median ${fixed(storm.singleColdMedianMs, 0)})`,
      ],
      [
        "single cold start CPU ms: workerd (Worker + objects) / Postgres (control plane + tenant host)",
        storm.singleColdCpuMs
          ? storm.singleColdCpuMs.workerdWorker
              .map((w, i) => `${w} / ${storm.singleColdCpuMs?.postgres[i] ?? 0}`)
              .join(", ")
          : "not measured in this run",
      ],
      [
        "same burst on the warm pool: p50 / p99 ms; first / last answer ms",
        `${fixed(storm.warmBurst.p50Ms, 0)} / ${fixed(storm.warmBurst.p99Ms, 0)}; ${fixed(storm.warmBurst.firstAnswerMs, 0)} / ${fixed(storm.warmBurst.wallMs, 0)} (${storm.warmBurst.errors} errors)`,
      ],
    ],
  );
}

export function targetsTable(targets: readonly Target[]): string {
  return table(
    ["target", "result", "detail"],
    targets.map((t) => [t.target, t.met ? "met" : "missed", t.detail]),
  );
}

/** Isolate CPU per request by source, one column per profiled path. */
export function profileSourcesTable(profiles: Record<string, ProfileSummary>): string {
  const paths = Object.keys(profiles);
  const sources = [...new Set(paths.flatMap((p) => Object.keys(profiles[p]?.msPerRequestBySource ?? {})))];
  const share = (p: string, ms: number) => {
    const summary = profiles[p];
    const busy = summary?.requests ? summary.busyMs / summary.requests : 0;
    return busy ? ` (${((100 * ms) / busy).toFixed(0)}%)` : "";
  };
  const row = (source: string) => [
    source,
    ...paths.map((p) => {
      const ms = profiles[p]?.msPerRequestBySource[source] ?? 0;
      return `${fixed(ms, 3)}${share(p, ms)}`;
    }),
  ];
  const totals = [
    "total (isolate busy)",
    ...paths.map((p) => {
      const summary = profiles[p];
      return fixed(summary?.requests ? summary.busyMs / summary.requests : 0, 3);
    }),
  ];
  return table(["source (ms per request)", ...paths], [...sources.map(row), totals]);
}

export function topFunctionsTable(summary: ProfileSummary, limit = 12): string {
  return table(
    ["function", "source", "ms per request"],
    summary.top.slice(0, limit).map((t) => [t.fn, t.source, fixed(t.msPerRequest, 4)]),
  );
}
