/**
 * `npm run soak -- --minutes N`: a chaos soak. Opt-in, never part of `npm test`.
 *
 * Stands Lessor up as the fleet bench does (bench/cluster-stack.ts: a control-plane Postgres, one
 * database host with its own Postgres, the WebSocket-to-TCP proxy; `wrangler dev --test-scheduled`
 * on a snapshot of the sources, running bench/soak-worker.ts) with a small host budget, provisions
 * `--tenants` tenants, and for N minutes drives mixed traffic over them while it injects faults at
 * random. An invariant checker samples every second. At the end it stops traffic and faults, waits
 * (bounded) for every pool to drain, and checks what must hold once everything is quiet.
 *
 * Traffic (`--concurrency` clients, each on a random tenant per operation): `/sql` reads of the
 * tenant's sentinel row, `/sql` writes (single statements and two-statement transactions) each
 * with a marker the soak remembers, and session leases (open, BEGIN, insert, read, COMMIT or
 * ROLLBACK, close). An operator loop meanwhile rotates credentials, drains pools (evictions on
 * demand), erases a tenant now and then (and provisions a new one in its place), and runs two
 * migration campaigns (an expand step, then a forced contract step); a cron loop fires the
 * scheduled handler every few seconds so campaigns, reconciles, folds and erase resumes run.
 *
 * Faults, one at a time, every few seconds: `pg_terminate_backend` of Lessor's backends on the
 * host; a restart of the host's Postgres (fast shutdown, a few seconds down); a tenant object killed
 * (`ctx.abort()` through the soak Worker); the whole Worker reloaded (`wrangler dev` rebuilds: every
 * object and request in flight dies); the proxy stalling every tunnel to the host for a few
 * seconds; and a cron tick killed mid-run (fired, then the Worker reloaded under it).
 *
 * Invariants (any violation fails the run, and is recorded with the request or sample):
 * - budget: `GET /v1/capacity` (pools within pool capacity plus the rotation reserve, maintenance
 *   within the reserve) and the host's `pg_stat_activity` (Lessor's `lessor:*` backends within
 *   connections plus the rotation reserve; no generation with more backends than its pool size);
 * - no tenant reads another's sentinel: every read checks it, and a sampler reads tenants' tables
 *   behind Lessor's back, where only the tenant's own rows may be;
 * - no duplicate start: in the control plane's lifecycle events, no start begins while the tenant
 *   has a live pool, and no generation starts twice; no role has backends of three generations;
 * - every answer is 2xx, or a documented code (src/errors/index.ts) with its status, and
 *   `Retry-After` when it is a 5xx or retryable; codes that mean a bug (`internal`, …) or a valid
 *   key refused are violations. Requests the Worker reload cut (wrangler's dev proxy answers them
 *   itself) count as outcomes unknown, and only inside a reload;
 * - writes: every acknowledged write is in the tenant's table, and no refused one is (only
 *   `connection_lost` and requests without an answer may have run);
 * - once traffic and faults stop: no lease, pool, maintenance slot or backend left (bounded wait);
 * - usage is exact: `queries − errors` of `GET /v1/tenants/:id/usage` is the tenant's own count of
 *   successful statements, give or take the requests whose outcome it could not know, and less at
 *   most those answered within a usage save interval before a kill of the tenant's object (usage is
 *   saved in batches: docs/adr/019-usage-saved-in-batches.md).
 *
 * Prints a summary like the demo's and `result=PASS` or `result=FAIL` (exit 1), and writes
 * bench/results/soak-<date>-<N>min.json. See bench/README.md.
 */
import { randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import pg from "pg";
import { errorCatalog } from "../src/errors/index.ts";
import { type RunningClusterStack, startClusterStack } from "./cluster-stack.ts";
import {
  inParallel,
  loadNow,
  machineFacts,
  packageVersion,
  progress,
  rank,
  round,
  sleep,
  sourceRevision,
  stopOnExit,
  wranglerVars,
} from "./harness.ts";
import { lightFetch } from "./load.ts";
import {
  cronTick,
  freePort,
  root,
  type ScheduledWrangler,
  startScheduledWrangler,
  within,
} from "./processes.ts";

// ── Arguments and settings ───────────────────────────────────────────────────────────────────────

function usage(problem: string): never {
  console.error(`${problem}
usage: npm run soak -- [--minutes N] [--tenants T] [--concurrency C] [--seed S]
  --minutes      how long traffic and faults run (default 10; 0.5 to 180)
  --tenants      tenants in the traffic at any time (default 50; 10 to 200)
  --concurrency  clients sending operations at once (default 8; 1 to 64)
  --seed         seed of the random choices (default: random; printed, and kept in the results)`);
  process.exit(2);
}

function numberOption(raw: string | undefined, name: string, fallback: number, min: number, max: number) {
  if (raw === undefined) return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < min || value > max) usage(`--${name} must be from ${min} to ${max}`);
  return value;
}

let options: { minutes?: string; tenants?: string; concurrency?: string; seed?: string };
try {
  options = parseArgs({
    options: {
      minutes: { type: "string" },
      tenants: { type: "string" },
      concurrency: { type: "string" },
      seed: { type: "string" },
    },
    strict: true,
  }).values;
} catch (error) {
  usage(error instanceof Error ? error.message : String(error));
}
const minutes = numberOption(options.minutes, "minutes", 10, 0.5, 180);
const tenantCount = Math.round(numberOption(options.tenants, "tenants", 50, 10, 200));
const concurrency = Math.round(numberOption(options.concurrency, "concurrency", 8, 1, 64));
const seed = Math.round(numberOption(options.seed, "seed", randomBytes(4).readUInt32BE(0) % 1e9, 0, 1e9));
const trafficMs = minutes * 60_000;
/** The command that runs this soak's plan again (the faults' timing still varies with the machine). */
const replayCommand = `npm run soak -- --minutes ${minutes} --tenants ${tenantCount} --concurrency ${concurrency} --seed ${seed}`;

const hostName = "pg";
/** A small host: 16 connections for pools, 2 for maintenance, 5 more while a rotation overlaps. */
const budget = { connections: 18, reserve: 2, rotationReserve: 5 };
const poolCapacity = budget.connections - budget.reserve;
const hostMaxConnections = 100;
/** Every fifth tenant is `standard` (pools of 5), the rest `free` (pools of 2). */
const standardEvery = 5;
/** Pools drain this long after their last use, so the fleet churns and the end drains in bounded time. */
const idleTimeoutMs = 15_000;
/** Each statement is tiny; a stalled one is cut after this (the default 30 s would outlast the client). */
const statementTimeoutMs = 5_000;
/** Session leases of the traffic: reclaimed by the object this long after a client vanished. */
const leaseTtlMs = 10_000;
/** After traffic stops: how long pools, leases and backends get to go. */
const drainDeadlineMs = 240_000;
const latestVersion = 3;

const stateDir = resolve(root, ".lessor/soak");
const envFile = resolve(stateDir, "wrangler.vars");
const persistDir = resolve(stateDir, "wrangler");
const snapshotDir = resolve(stateDir, "src-snapshot");
const logFile = resolve(stateDir, "wrangler.log");

// ── Randomness (seeded, so a run's plan can be replayed; timing still varies) ────────────────────

let randomState = seed >>> 0;
/** mulberry32 */
function random(): number {
  randomState = (randomState + 0x6d2b79f5) >>> 0;
  let t = randomState;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
function between(min: number, max: number): number {
  return min + random() * (max - min);
}
function pick<T>(items: readonly T[]): T | undefined {
  return items.length === 0 ? undefined : items[Math.floor(random() * items.length)];
}

// ── Cleanup: nothing this run starts outlives it ─────────────────────────────────────────────────

const running: { stack: RunningClusterStack | null; wrangler: ScheduledWrangler | null } = {
  stack: null,
  wrangler: null,
};
const cleanup = stopOnExit("soak", envFile, running);

// ── The run's records ────────────────────────────────────────────────────────────────────────────

type Route =
  | "sql read"
  | "sql write"
  | "sql batch"
  | "lease open"
  | "lease sql"
  | "lease close"
  | "rotate"
  | "drain"
  | "erase"
  | "provision"
  | "campaign"
  | "capacity"
  | "admin read";

interface Violation {
  invariant: Invariant;
  at: string;
  what: string;
}

type Invariant =
  | "budget_ledger"
  | "budget_backends"
  | "sentinel"
  | "duplicate_start"
  | "answers"
  | "writes"
  | "leaks"
  | "usage"
  | "campaigns";

const invariants: readonly Invariant[] = [
  "budget_ledger",
  "budget_backends",
  "sentinel",
  "duplicate_start",
  "answers",
  "writes",
  "leaks",
  "usage",
  "campaigns",
];

const record = {
  startedAt: Date.now(),
  /** Answers by route and `status code`. */
  answers: new Map<string, number>(),
  latencies: [] as number[],
  latenciesByRoute: new Map<Route, number[]>(),
  faults: new Map<string, number>(),
  faultLog: [] as { kind: string; at: string; detail: string; ms: number }[],
  operations: new Map<string, number>(),
  checks: new Map<Invariant, number>(invariants.map((i) => [i, 0])),
  violations: [] as Violation[],
  violationCounts: new Map<Invariant, number>(invariants.map((i) => [i, 0])),
  /** Samples the checker could not take (Postgres down, the Worker reloading): counted, not hidden. */
  skippedSamples: new Map<string, number>(),
  notes: [] as string[],
  workerErrors: new Map<string, number>(),
};

function bump<K>(map: Map<K, number>, key: K, by = 1): void {
  map.set(key, (map.get(key) ?? 0) + by);
}

function checked(invariant: Invariant, by = 1): void {
  bump(record.checks, invariant, by);
}

function violation(invariant: Invariant, what: string): void {
  bump(record.violationCounts, invariant);
  // The first 200 are kept whole; the counts go on.
  if (record.violations.length < 200)
    record.violations.push({ invariant, at: new Date().toISOString(), what });
  if ((record.violationCounts.get(invariant) ?? 0) <= 5) progress(`VIOLATION ${invariant}: ${what}`);
}

function operation(name: string): void {
  bump(record.operations, name);
}

// ── Tenants ──────────────────────────────────────────────────────────────────────────────────────

interface SoakTenant {
  id: string;
  key: string;
  tier: "free" | "standard";
  poolSize: number;
  database: string;
  role: string;
  sentinel: string;
  phase: "live" | "erasing" | "erased";
  /**
   * While its `DELETE` is in flight: the refusals that only an erased tenant may get (the erase may
   * have begun on Lessor's side before its answer comes back). They are forgiven if the erase was
   * accepted, and violations if it was refused.
   */
  eraseInFlight: string[] | null;
  /** Statements Lessor answered 200 (`/sql` and lease statements): what its usage must count. */
  successes: number;
  /** Statements whose outcome the soak could not know (no answer, a reload's answer, a violation). */
  unknown: number;
  /** When each success was answered (for what a kill may take from the usage, below). */
  successTimes: number[];
  /**
   * Successes answered within a usage save interval before the tenant's object was killed: Lessor
   * saves usage in batches (docs/adr/019-usage-saved-in-batches.md), so a kill may take these.
   */
  mayBeUncounted: number;
  /** Successes up to this moment were already looked at for `mayBeUncounted`. */
  forgivenUntil: number;
  /** Write markers: acknowledged, refused (must not be in the table), unknown (either way). */
  committed: Set<string>;
  refused: Set<string>;
  ambiguous: Set<string>;
  writes: number;
  /** Numbers the markers (clients run concurrently on one tenant: each marker is taken once). */
  serial: number;
}

const tenants = new Map<string, SoakTenant>();
let tenantSerial = 0;
const liveTenants = () => [...tenants.values()].filter((t) => t.phase === "live");
/** Tenants traffic goes to: the live ones, and for a while the ones being erased. */
let trafficTenants: SoakTenant[] = [];
function refreshTrafficTenants(): void {
  trafficTenants = [...tenants.values()].filter((t) => t.phase !== "erased" || erasedRecently.has(t.id));
}
const erasedRecently = new Set<string>();

let adminKey = "";
let baseUrl = "";

// ── Talking to Lessor ────────────────────────────────────────────────────────────────────────────

interface Answer {
  status: number;
  retryAfter: string | null;
  text: string;
  json: unknown;
  sentAt: number;
  doneAt: number;
  /** Why there was no answer (a connection error, the client's 30 s bound), or null. */
  transport: string | null;
}

async function send(
  method: string,
  path: string,
  init: { key?: string; json?: unknown; headers?: Record<string, string> } = {},
): Promise<Answer> {
  const sentAt = Date.now();
  const headers: Record<string, string> = { ...init.headers };
  if (init.key !== undefined) headers.authorization = `Bearer ${init.key}`;
  if (init.json !== undefined) headers["content-type"] = "application/json";
  try {
    const response = await lightFetch(`${baseUrl}${path}`, {
      method,
      headers,
      ...(init.json === undefined ? {} : { body: JSON.stringify(init.json) }),
    });
    const text = await response.text();
    let json: unknown = null;
    try {
      json = text === "" ? null : (JSON.parse(text) as unknown);
    } catch {
      json = null;
    }
    return {
      status: response.status,
      retryAfter: response.headers.get("retry-after"),
      text,
      json,
      sentAt,
      doneAt: Date.now(),
      transport: null,
    };
  } catch (error) {
    return {
      status: 0,
      retryAfter: null,
      text: "",
      json: null,
      sentAt,
      doneAt: Date.now(),
      transport: error instanceof Error ? error.message : String(error),
    };
  }
}

/** What an answer means to the soak. */
type Outcome =
  | { kind: "ok" }
  /** A documented refusal; `mayHaveRun` only for `connection_lost` ("the query may not have run"). */
  | { kind: "refused"; code: string; mayHaveRun: boolean }
  /** No answer Lessor gave (a reload cut it), or a violation: the statement may or may not have run. */
  | { kind: "unknown"; why: string };

/** Codes that mean the soak sent something wrong or Lessor broke: never expected here. */
const bugCodes = new Set([
  "internal",
  "misconfigured",
  "not_found",
  "invalid_json",
  "invalid_request",
  "invalid_connection_string",
  "invalid_tenant_id",
  "payload_too_large",
  "missing_credentials",
  "tenant_not_found",
  "key_not_found",
  "confirm_mismatch",
  "unknown_host",
  "unknown_tier",
  "response_too_large",
  "tenant_exists",
  "campaign_state_conflict",
  "campaign_not_found",
  "schema_version_unknown",
  "schema_too_old",
  "schema_upgrade_failed",
  "erase_not_found",
  "lease_not_found",
  "prepared_transaction_refused",
  // Every fault the soak injects is transient: a create cut by one is retried, or answers
  // `provisioning_interrupted` (503, Retry-After); `provisioning_failed` would blame the create.
  "provisioning_failed",
]);
/** Codes that refuse a valid key: expected only for a tenant that is being or has been erased. */
const goneCodes = new Set([
  "tenant_erasing",
  "tenant_erased",
  "invalid_credentials",
  "authentication_rate_limited",
  "28P01",
]);

/** Which part of the run an answer belongs to (every answer is judged; the summary splits them). */
let phase: "setup" | "traffic" | "quiet" = "setup";

/** Windows during which the Worker was being reloaded: wrangler's dev proxy answers cut requests itself. */
const reloadWindows: { from: number; to: number }[] = [];
let reloadingSince: number | null = null;
function duringReload(answer: Answer): boolean {
  const overlaps = (from: number, to: number) => answer.sentAt <= to && answer.doneAt >= from;
  if (reloadingSince !== null && answer.doneAt >= reloadingSince) return true;
  // A request cut by a reload may be answered a little after wrangler says the reload is done.
  return reloadWindows.some((w) => overlaps(w.from, w.to + 3_000));
}

const documented = errorCatalog as Record<string, { status: number; retryable?: boolean }>;

/**
 * Records an answer (counts, latency) and judges it against the answer invariant. `describe` says
 * what the request was, for the violation record.
 */
function judge(route: Route, tenant: SoakTenant | null, answer: Answer, describe: string): Outcome {
  const latency = answer.doneAt - answer.sentAt;
  const label = (what: string) => bump(record.answers, `${phase}\t${route}\t${what}`);
  checked("answers");
  if (answer.transport !== null) {
    label("no answer");
    if (duringReload(answer)) return { kind: "unknown", why: "cut by a reload" };
    violation(
      "answers",
      `${describe}: no answer (${answer.transport}) after ${latency} ms, outside any reload`,
    );
    return { kind: "unknown", why: "no answer" };
  }
  // Latencies are the traffic's: setup and the quiet end's polling would drown them.
  if (phase === "traffic") {
    record.latencies.push(latency);
    const list = record.latenciesByRoute.get(route) ?? [];
    list.push(latency);
    record.latenciesByRoute.set(route, list);
  }
  if (answer.status >= 200 && answer.status < 300) {
    label(String(answer.status));
    return { kind: "ok" };
  }
  const body = answer.json as { code?: unknown; severity?: unknown; message?: unknown } | null;
  const code = typeof body?.code === "string" ? body.code : null;
  label(`${answer.status} ${code ?? "(no code)"}`);
  const shown = `${describe}: ${answer.status} ${answer.text.slice(0, 240)}${answer.retryAfter === null ? "" : ` (Retry-After ${answer.retryAfter})`}`;
  if (code === null) {
    if (
      answer.status === 503 &&
      answer.text.startsWith("Your worker restarted mid-request") &&
      duringReload(answer)
    ) {
      return { kind: "unknown", why: "cut by a reload" };
    }
    // The evidence to find who answered: when it was sent and answered, and the faults around it.
    const nearby = record.faultLog
      .filter((f) => Math.abs(Date.parse(f.at) - answer.sentAt) < 120_000)
      .map((f) => `${f.kind}@${new Date(f.at).toISOString().slice(11, 23)}`)
      .join(" ");
    violation(
      "answers",
      `${shown}: no documented code (sent ${new Date(answer.sentAt).toISOString().slice(11, 23)}, answered ${new Date(answer.doneAt).toISOString().slice(11, 23)}; faults within 2 min: ${nearby || "none"})`,
    );
    return { kind: "unknown", why: "undocumented answer" };
  }
  const gone = tenant !== null && tenant.phase !== "live";
  // A Postgres-shaped error on /sql or a lease (SQLSTATE in `code`, a `severity`).
  if (typeof body?.severity === "string" || /^[0-9A-Z]{5}$/.test(code)) {
    if (code === "28P01" && gone) return { kind: "refused", code, mayHaveRun: false };
    violation("answers", `${shown}: a Postgres error reached the client`);
    return { kind: "unknown", why: "postgres error" };
  }
  const spec = documented[code];
  if (!spec) {
    violation("answers", `${shown}: undocumented code`);
    return { kind: "unknown", why: "undocumented code" };
  }
  if (spec.status !== answer.status) {
    violation("answers", `${shown}: ${code} is documented as ${spec.status}`);
    return { kind: "unknown", why: "wrong status" };
  }
  const retryAfter = Number(answer.retryAfter);
  if (
    (answer.status >= 500 || spec.retryable) &&
    (answer.retryAfter === null || !Number.isInteger(retryAfter) || retryAfter < 0)
  ) {
    violation("answers", `${shown}: no Retry-After`);
    return { kind: "unknown", why: "no Retry-After" };
  }
  if (bugCodes.has(code)) {
    violation("answers", `${shown}: never expected`);
    return { kind: "unknown", why: code };
  }
  if (goneCodes.has(code) && !gone && tenant?.eraseInFlight) {
    tenant.eraseInFlight.push(
      `${shown}: a live tenant's valid key refused while its erase was asked and then refused`,
    );
    return { kind: "refused", code, mayHaveRun: false };
  }
  if (goneCodes.has(code) && !gone) {
    violation("answers", `${shown}: a live tenant's valid key refused`);
    return { kind: "unknown", why: code };
  }
  // Documented as "the statement may or may not have run" (docs/failures.md).
  return { kind: "refused", code, mayHaveRun: code === "connection_lost" || code === "object_unavailable" };
}

/** Rows of a `/sql` or lease answer (array mode or objects), as arrays. */
function rowsOf(answer: Answer): unknown[][] {
  const rows = (answer.json as { rows?: unknown } | null)?.rows;
  if (!Array.isArray(rows)) return [];
  return rows.map((row) => (Array.isArray(row) ? row : Object.values(row as Record<string, unknown>)));
}

function sqlHeaders(tenant: SoakTenant): Record<string, string> {
  return {
    "neon-connection-string": `postgres://${tenant.id}:${tenant.key}@lessor/${tenant.id}`,
    "neon-array-mode": "true",
  };
}

const sentinelQuery =
  "SELECT body, current_setting('application_name') AS app, current_database() AS db FROM notes WHERE body LIKE 'sentinel:%'";

/** Checks a sentinel read: exactly the tenant's own sentinel, in its own database, on its own pool. */
function checkSentinel(tenant: SoakTenant, answer: Answer, via: string): void {
  checked("sentinel");
  const rows = rowsOf(answer);
  const [body, app, db] = rows[0] ?? [];
  if (
    rows.length !== 1 ||
    body !== tenant.sentinel ||
    db !== tenant.database ||
    typeof app !== "string" ||
    !app.startsWith(`lessor:${tenant.role}:`)
  ) {
    violation(
      "sentinel",
      `${via} of ${tenant.id} read ${JSON.stringify(rows).slice(0, 300)} (expected ${tenant.sentinel} in ${tenant.database})`,
    );
  }
}

/** Usage bookkeeping of a statement Lessor counts (`/sql`, lease statements). */
function counted(tenant: SoakTenant, outcome: Outcome): void {
  if (outcome.kind === "ok") {
    tenant.successes++;
    tenant.successTimes.push(Date.now());
  } else if (outcome.kind === "unknown") tenant.unknown++;
}

/** How far before a kill a success may still be unsaved: the save interval, and a margin for the kill's own way. */
const usageSaveWindowMs = 1_000 + 1_000;

/** The tenant's object was (or may have been) killed between `from` and `to`: its last unsaved usage may go. */
function forgiveUnsavedUsage(tenant: SoakTenant, from: number, to: number): void {
  const since = Math.max(from - usageSaveWindowMs, tenant.forgivenUntil);
  tenant.mayBeUncounted += tenant.successTimes.filter((t) => t > since && t <= to).length;
  tenant.forgivenUntil = Math.max(tenant.forgivenUntil, to);
}

/** Write bookkeeping: where a marker must (not) be once everything is quiet. */
function noteWrite(tenant: SoakTenant, marker: string, outcome: Outcome): void {
  tenant.writes++;
  if (outcome.kind === "ok") tenant.committed.add(marker);
  else if (outcome.kind === "unknown" || outcome.mayHaveRun) tenant.ambiguous.add(marker);
  else tenant.refused.add(marker);
}

/** After a 503, a client waits its Retry-After (capped, jittered) before it tries that tenant again. */
async function backOff(outcome: Outcome, answer: Answer): Promise<void> {
  if (outcome.kind === "refused" && answer.status === 503) {
    await sleep(Math.min(3, Math.max(0.2, Number(answer.retryAfter) || 1)) * 1_000 * between(0.5, 1));
  } else if (outcome.kind !== "ok") {
    await sleep(between(50, 250));
  }
}

// ── Traffic ──────────────────────────────────────────────────────────────────────────────────────

async function sqlRead(tenant: SoakTenant): Promise<void> {
  operation("sql read");
  const answer = await send("POST", "/sql", {
    headers: sqlHeaders(tenant),
    json: { query: sentinelQuery, params: [] },
  });
  const outcome = judge("sql read", tenant, answer, `POST /sql (${tenant.id}, sentinel read)`);
  counted(tenant, outcome);
  if (outcome.kind === "ok") checkSentinel(tenant, answer, "/sql");
  await backOff(outcome, answer);
}

async function sqlWrite(tenant: SoakTenant): Promise<void> {
  operation("sql write");
  const marker = `w:${tenant.id}:${tenant.serial++}`;
  const answer = await send("POST", "/sql", {
    headers: sqlHeaders(tenant),
    json: { query: "INSERT INTO notes (body) VALUES ($1) RETURNING id", params: [marker] },
  });
  const outcome = judge("sql write", tenant, answer, `POST /sql (${tenant.id}, insert ${marker})`);
  counted(tenant, outcome);
  noteWrite(tenant, marker, outcome);
  await backOff(outcome, answer);
}

/** A two-statement transaction on `/sql`: an insert, then the sentinel read in the same snapshot. */
async function sqlBatch(tenant: SoakTenant): Promise<void> {
  operation("sql batch");
  const marker = `b:${tenant.id}:${tenant.serial++}`;
  const answer = await send("POST", "/sql", {
    headers: sqlHeaders(tenant),
    json: {
      queries: [
        { query: "INSERT INTO notes (body) VALUES ($1)", params: [marker] },
        { query: sentinelQuery, params: [] },
      ],
    },
  });
  const outcome = judge(
    "sql batch",
    tenant,
    answer,
    `POST /sql (${tenant.id}, transaction inserting ${marker})`,
  );
  counted(tenant, outcome);
  noteWrite(tenant, marker, outcome);
  if (outcome.kind === "ok") {
    const results = (answer.json as { results?: unknown[] } | null)?.results;
    const second = Array.isArray(results) ? results[1] : undefined;
    checkSentinel(tenant, { ...answer, json: second ?? null }, "/sql transaction");
  }
  await backOff(outcome, answer);
}

/** A session lease: open, BEGIN, insert, read, COMMIT or ROLLBACK (held across a pause), close. */
async function leaseSession(tenant: SoakTenant): Promise<void> {
  operation("lease");
  const opened = await send("POST", `/v1/tenants/${tenant.id}/leases`, {
    key: tenant.key,
    json: { ttlMs: leaseTtlMs },
  });
  const openOutcome = judge("lease open", tenant, opened, `POST /v1/tenants/${tenant.id}/leases`);
  const lease = (opened.json as { lease?: unknown } | null)?.lease;
  if (openOutcome.kind !== "ok" || typeof lease !== "string") {
    if (openOutcome.kind === "ok") violation("answers", `lease open of ${tenant.id}: 201 without a lease`);
    await backOff(openOutcome, opened);
    return;
  }
  const commit = random() < 0.7;
  const marker = `${commit ? "l" : "r"}:${tenant.id}:${tenant.serial++}`;
  const statement = async (query: string, params: unknown[] = []) => {
    const answer = await send("POST", `/v1/leases/${lease}/sql`, {
      key: tenant.key,
      headers: { "neon-array-mode": "true" },
      json: { query, params },
    });
    const outcome = judge(
      "lease sql",
      tenant,
      answer,
      `lease ${lease.slice(0, 12)}… of ${tenant.id}: ${query.slice(0, 60)}`,
    );
    counted(tenant, outcome);
    return { answer, outcome };
  };
  let inserted = false;
  let finished = false;
  let last: { answer: Answer; outcome: Outcome } | null = null;
  try {
    last = await statement("BEGIN");
    if (last.outcome.kind !== "ok") return;
    last = await statement("INSERT INTO notes (body) VALUES ($1)", [marker]);
    // Whatever it answered, no COMMIT has been sent: unless one succeeds, the row must not exist.
    inserted = true;
    if (last.outcome.kind !== "ok") return;
    // Hold the transaction open for a moment, so faults can land inside it.
    await sleep(between(50, 600));
    last = await statement(sentinelQuery);
    if (last.outcome.kind !== "ok") return;
    checkSentinel(tenant, last.answer, "a lease");
    last = await statement(commit ? "COMMIT" : "ROLLBACK");
    finished = true;
    tenant.writes++;
    if (commit) {
      if (last.outcome.kind === "ok") tenant.committed.add(marker);
      else if (last.outcome.kind === "unknown" || last.outcome.mayHaveRun) tenant.ambiguous.add(marker);
      else tenant.refused.add(marker);
    } else {
      tenant.refused.add(marker);
    }
  } finally {
    if (inserted && !finished) {
      tenant.writes++;
      tenant.refused.add(marker);
    }
    const closed = await send("DELETE", `/v1/leases/${lease}`, { key: tenant.key });
    const closeOutcome = judge(
      "lease close",
      tenant,
      closed,
      `DELETE /v1/leases/${lease.slice(0, 12)}… (${tenant.id})`,
    );
    if (last && last.outcome.kind !== "ok") await backOff(last.outcome, last.answer);
    else if (closeOutcome.kind !== "ok") await backOff(closeOutcome, closed);
  }
}

let trafficRunning = true;

async function trafficClient(): Promise<void> {
  while (trafficRunning) {
    const tenant = pick(trafficTenants);
    if (!tenant) {
      await sleep(100);
      continue;
    }
    const roll = random();
    if (roll < 0.4) await sqlRead(tenant);
    else if (roll < 0.65) await sqlWrite(tenant);
    else if (roll < 0.8) await sqlBatch(tenant);
    else await leaseSession(tenant);
    // A small pause between operations: the machine is shared, and the point is chaos, not load.
    await sleep(between(0, 40));
  }
}

// ── Operator: rotations, drains, erases, campaigns ───────────────────────────────────────────────

async function rotate(tenant: SoakTenant): Promise<void> {
  operation("rotation");
  const answer = await send("POST", `/v1/tenants/${tenant.id}/rotate-credentials`, { key: adminKey });
  judge("rotate", tenant, answer, `POST /v1/tenants/${tenant.id}/rotate-credentials`);
  if (answer.status === 202) operation("rotation accepted");
}

async function drain(tenant: SoakTenant): Promise<void> {
  operation("operator drain");
  const answer = await send("POST", `/v1/tenants/${tenant.id}/drain`, { key: adminKey, json: {} });
  judge("drain", tenant, answer, `POST /v1/tenants/${tenant.id}/drain`);
}

const erasures: Promise<void>[] = [];
const eraseOutcomes: {
  id: string;
  requestedAt: string;
  erasedAfterMs: number | null;
  problem: string | null;
}[] = [];

/** Erases a tenant: `DELETE`, then (in the background, bounded) until `erased`; provisions a new one in its place. */
async function erase(tenant: SoakTenant): Promise<boolean> {
  operation("erase asked");
  tenant.eraseInFlight = [];
  const answer = await send("DELETE", `/v1/tenants/${tenant.id}?confirm=${tenant.id}`, { key: adminKey });
  const outcome = judge("erase", tenant, answer, `DELETE /v1/tenants/${tenant.id}`);
  const refusedMeanwhile = tenant.eraseInFlight;
  tenant.eraseInFlight = null;
  if (outcome.kind !== "ok") {
    for (const shown of refusedMeanwhile) violation("answers", shown);
    return false;
  }
  operation("erase started");
  tenant.phase = "erasing";
  const requestedAt = Date.now();
  refreshTrafficTenants();
  erasures.push(
    (async () => {
      let erasedAfterMs: number | null = null;
      let problem: string | null = null;
      // Bounded: five minutes (the cron loop resumes an erase a fault interrupted).
      for (let attempt = 0; attempt < 600 && erasedAfterMs === null; attempt++) {
        await sleep(500);
        const view = await send("GET", `/v1/tenants/${tenant.id}/erase`, { key: adminKey });
        const viewOutcome = judge("admin read", tenant, view, `GET /v1/tenants/${tenant.id}/erase`);
        if (viewOutcome.kind === "ok" && (view.json as { state?: unknown } | null)?.state === "erased") {
          erasedAfterMs = Date.now() - requestedAt;
        }
      }
      if (erasedAfterMs === null) problem = `${tenant.id} not erased within 5 minutes`;
      tenant.phase = "erased";
      // Traffic keeps coming at the erased id a little longer: it must get the erased answers.
      erasedRecently.add(tenant.id);
      refreshTrafficTenants();
      setTimeout(() => {
        erasedRecently.delete(tenant.id);
        refreshTrafficTenants();
      }, 5_000).unref();
      eraseOutcomes.push({
        id: tenant.id,
        requestedAt: new Date(requestedAt).toISOString(),
        erasedAfterMs,
        problem,
      });
      if (problem) record.notes.push(problem);
      else operation("erase finished");
    })(),
  );
  // A new tenant takes its place in the traffic.
  await provisionOne(nextTenantId()).catch((error: unknown) => {
    record.notes.push(
      `provisioning a replacement failed: ${error instanceof Error ? error.message : String(error)}`,
    );
  });
  return true;
}

interface CampaignRun {
  id: string;
  toVersion: number;
  createdAt: number;
  enrolled: number;
  state: string;
  counts: Record<string, number>;
  finishedAfterMs: number | null;
}
const campaigns: CampaignRun[] = [];

async function startCampaign(toVersion: number, force: boolean): Promise<void> {
  operation("campaign");
  const answer = await send("POST", "/v1/campaigns", {
    key: adminKey,
    // No canary: a migration a fault cuts fails that tenant, and a failed canary would end the
    // campaign at once; with continueOnFailure the rollout goes on through the whole fleet.
    json: {
      toVersion,
      concurrency: 4,
      continueOnFailure: true,
      force,
      drainTimeoutMs: 5_000,
    },
  });
  const outcome = judge("campaign", null, answer, `POST /v1/campaigns {toVersion: ${toVersion}}`);
  const body = answer.json as { campaign?: { id?: string }; enrolled?: number } | null;
  if (outcome.kind === "ok" && typeof body?.campaign?.id === "string") {
    campaigns.push({
      id: body.campaign.id,
      toVersion,
      createdAt: Date.now(),
      enrolled: body.enrolled ?? 0,
      state: "pending",
      counts: {},
      finishedAfterMs: null,
    });
  }
}

/** How long the quiet phase waits for the campaigns to finish (a tenant a fault interrupted retries within 2 min). */
const campaignDeadlineMs = 300_000;

/**
 * Every fault the soak injects is transient, so every campaign must end `done` with each tenant
 * `succeeded` (or erased): a migration a fault interrupted is run again, never `failed`. Cron
 * ticks keep running until they finish (bounded).
 */
async function checkCampaigns(worker: ScheduledWrangler): Promise<void> {
  const began = Date.now();
  const finished = () => campaigns.every((c) => ["done", "failed", "cancelled"].includes(c.state));
  await refreshCampaigns();
  while (!finished() && Date.now() - began < campaignDeadlineMs) {
    await cronTick(worker, ["migration-campaigns"], 60_000).catch(() => undefined);
    await sleep(2_000);
    await refreshCampaigns();
  }
  for (const campaign of campaigns) {
    checked("campaigns");
    const { succeeded = 0, erased = 0, total = campaign.enrolled } = campaign.counts;
    if (campaign.state !== "done") {
      violation(
        "campaigns",
        `campaign to v${campaign.toVersion} is ${campaign.state} after ${campaignDeadlineMs / 1000} s of quiet`,
      );
    } else if (succeeded + erased !== total) {
      violation(
        "campaigns",
        `campaign to v${campaign.toVersion}: ${succeeded} succeeded and ${erased} erased of ${total} (${JSON.stringify(campaign.counts)}); every fault is transient`,
      );
    }
  }
}

async function refreshCampaigns(): Promise<void> {
  for (const campaign of campaigns) {
    if (["done", "failed", "cancelled"].includes(campaign.state)) continue;
    const answer = await send("GET", `/v1/campaigns/${campaign.id}?limit=1`, { key: adminKey });
    const outcome = judge("admin read", null, answer, `GET /v1/campaigns/${campaign.id}`);
    const view = answer.json as { campaign?: { state?: string }; counts?: Record<string, number> } | null;
    if (outcome.kind !== "ok" || !view?.campaign?.state) continue;
    campaign.state = view.campaign.state;
    campaign.counts = view.counts ?? {};
    if (["done", "failed", "cancelled"].includes(campaign.state))
      campaign.finishedAfterMs = Date.now() - campaign.createdAt;
  }
}

let operatorRunning = true;

async function operatorLoop(trafficStartedAt: number): Promise<void> {
  // The campaigns: an expand step early, a forced contract step in the middle.
  const plan = [
    { at: 0.1, run: () => startCampaign(2, false) },
    { at: 0.45, run: () => startCampaign(latestVersion, true) },
  ];
  // Erases: a few over the run (at least one), never in the last 15 %.
  const eraseCount = Math.max(1, Math.round(minutes / 3));
  for (let i = 0; i < eraseCount; i++) {
    plan.push({
      at: 0.2 + (0.6 * (i + 0.5)) / eraseCount,
      run: async () => {
        // An erase is refused while a campaign migrates the tenant; another tenant is tried then.
        for (let tries = 0; tries < 5; tries++) {
          const tenant = pick(liveTenants());
          if (!tenant || (await erase(tenant))) return;
          await sleep(1_000);
        }
      },
    });
  }
  plan.sort((a, b) => a.at - b.at);
  while (operatorRunning) {
    const elapsed = (Date.now() - trafficStartedAt) / trafficMs;
    const due = plan[0];
    if (due && elapsed >= due.at) {
      plan.shift();
      await due.run();
      continue;
    }
    const roll = random();
    const tenant = pick(liveTenants());
    if (tenant) {
      if (roll < 0.45) await rotate(tenant);
      else await drain(tenant);
    }
    await refreshCampaigns();
    await sleep(between(3_000, 8_000));
  }
}

// ── Cron ─────────────────────────────────────────────────────────────────────────────────────────

let cronRunning = true;
let cronFired = 0;

/** Fires the scheduled handler every few seconds (production fires it every minute). */
async function cronLoop(worker: ScheduledWrangler): Promise<void> {
  while (cronRunning) {
    await sleep(between(5_000, 10_000));
    if (!cronRunning) break;
    const answer = await send("GET", "/__scheduled?cron=*+*+*+*+*");
    cronFired++;
    if (answer.status !== 200 && !duringReload(answer)) {
      record.notes.push(`/__scheduled answered ${answer.status || answer.transport}`);
    }
    void worker;
  }
}

// ── Faults ───────────────────────────────────────────────────────────────────────────────────────

type FaultKind =
  | "backend-kill"
  | "pg-restart"
  | "object-abort"
  | "worker-reload"
  | "proxy-stall"
  | "cron-killed";

/** The host superuser's URL: the soak's own inspection and faults (Lessor gets the host admin's). */
let hostSuperuserUrl = "";
let controlPlaneUrl = "";
let buildNumber = 0;

function hostClient(database = "postgres"): pg.Client {
  const url = new URL(hostSuperuserUrl);
  url.pathname = `/${database}`;
  const client = new pg.Client({
    connectionString: url.toString(),
    application_name: "soak",
    connectionTimeoutMillis: 3_000,
    query_timeout: 10_000,
  });
  client.on("error", () => undefined);
  return client;
}

async function onHost<T>(work: (client: pg.Client) => Promise<T>, database = "postgres"): Promise<T> {
  const client = hostClient(database);
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** One connection to the control plane (its own cluster: no fault touches it), reopened if it breaks. */
const controlPlane: { client: pg.Client | null } = { client: null };
async function onControlPlane<T>(work: (client: pg.Client) => Promise<T>): Promise<T> {
  let client = controlPlane.client;
  if (!client) {
    const fresh = new pg.Client({
      connectionString: controlPlaneUrl,
      application_name: "soak",
      query_timeout: 15_000,
    });
    fresh.on("error", () => {
      if (controlPlane.client === fresh) controlPlane.client = null;
    });
    await fresh.connect();
    controlPlane.client = fresh;
    client = fresh;
  }
  return work(client);
}

/** Rewrites the build number in the snapshot and waits (bounded) until the reloaded Worker answers it. */
async function reloadWorker(): Promise<string> {
  buildNumber++;
  const file = resolve(snapshotDir, "bench/soak-worker.ts");
  const text = readFileSync(file, "utf8");
  const next = text.replace(/const soakBuild = "\d+";/, `const soakBuild = "${buildNumber}";`);
  if (next === text) throw new Error("the soak Worker's build line is missing");
  const from = Date.now();
  reloadingSince = from;
  try {
    writeFileSync(file, next);
    for (let attempt = 0; attempt < 600; attempt++) {
      await sleep(200);
      const answer = await send("GET", "/bench/soak/build");
      if (answer.status === 200 && answer.text === String(buildNumber)) return `build ${buildNumber}`;
    }
    throw new Error(`the Worker did not reload to build ${buildNumber} within 120 s`);
  } finally {
    reloadWindows.push({ from, to: Date.now() });
    reloadingSince = null;
    // A reload restarts every object.
    for (const tenant of liveTenants()) forgiveUnsavedUsage(tenant, from, Date.now());
  }
}

async function injectFault(kind: FaultKind, stack: RunningClusterStack): Promise<string> {
  switch (kind) {
    case "backend-kill": {
      const count = 1 + Math.floor(random() * 3);
      return onHost(async (client) => {
        const { rows } = await client.query<{ app: string }>(
          `SELECT application_name AS app, pg_terminate_backend(pid) AS ok FROM (
             SELECT pid, application_name FROM pg_stat_activity
              WHERE application_name LIKE 'lessor:%' ORDER BY random() LIMIT $1) AS victims`,
          [count],
        );
        return `terminated ${rows.length}: ${rows.map((r) => r.app.replace(/^lessor:t_[0-9a-f]{10}/, "lessor:t_…")).join(", ")}`;
      });
    }
    case "pg-restart": {
      const downMs = Math.round(between(1_000, 5_000));
      await stack.restartHost(hostName, hostMaxConnections, downMs);
      return `down ${downMs} ms`;
    }
    case "object-abort": {
      const victims = [...new Set([pick(liveTenants()), pick(liveTenants())])].filter(
        (t): t is SoakTenant => t !== undefined,
      );
      const outcomes: string[] = [];
      for (const tenant of victims) {
        const sent = Date.now();
        const answer = await send("POST", `/bench/soak/abort?tenant=${tenant.id}`);
        forgiveUnsavedUsage(tenant, sent, Date.now());
        outcomes.push(
          `${tenant.id}: ${answer.status === 200 ? "killed" : `${answer.status} ${answer.text.slice(0, 80)}`}`,
        );
      }
      return outcomes.join(", ");
    }
    case "worker-reload":
      return reloadWorker();
    case "proxy-stall": {
      const stallMs = Math.round(between(2_000, 9_000));
      await stack.stallHost(hostName);
      await sleep(stallMs);
      await stack.unstallHost(hostName);
      return `stalled ${stallMs} ms`;
    }
    case "cron-killed": {
      // The tick's jobs run under waitUntil after /__scheduled answers; the reload kills them mid-run.
      const answer = await send("GET", "/__scheduled?cron=*+*+*+*+*");
      cronFired++;
      const delay = Math.round(between(50, 1_500));
      await sleep(delay);
      const reloaded = await reloadWorker();
      return `tick answered ${answer.status}, Worker reloaded ${delay} ms later (${reloaded})`;
    }
  }
}

let faultsRunning = true;

async function faultLoop(stack: RunningClusterStack): Promise<void> {
  const kinds: FaultKind[] = [
    "backend-kill",
    "pg-restart",
    "object-abort",
    "worker-reload",
    "proxy-stall",
    "cron-killed",
  ];
  const weights: Record<FaultKind, number> = {
    "backend-kill": 5,
    "object-abort": 5,
    "proxy-stall": 2,
    "pg-restart": 1.5,
    "worker-reload": 1,
    "cron-killed": 1,
  };
  // Every kind once first (in a random order), so even a short run injects each; then by weight.
  const firstRound = [...kinds].sort(() => random() - 0.5);
  await sleep(between(3_000, 6_000));
  while (faultsRunning) {
    let kind = firstRound.shift();
    if (!kind) {
      const roll = random() * Object.values(weights).reduce((a, b) => a + b, 0);
      let sum = 0;
      kind =
        kinds.find((k) => {
          sum += weights[k];
          return roll < sum;
        }) ?? "backend-kill";
    }
    const began = Date.now();
    let detail: string;
    try {
      detail = await injectFault(kind, stack);
    } catch (error) {
      detail = `failed to inject: ${error instanceof Error ? error.message : String(error)}`;
      record.notes.push(`fault ${kind} ${detail}`);
    }
    bump(record.faults, kind);
    record.faultLog.push({ kind, at: new Date(began).toISOString(), detail, ms: Date.now() - began });
    progress(`fault ${kind}: ${detail}`);
    if (!faultsRunning) break;
    await sleep(between(4_000, 10_000) * Math.min(1, minutes / 2 + 0.25));
  }
}

// ── The invariant checker (every second) ─────────────────────────────────────────────────────────

interface HostCapacity {
  host: string;
  poolCapacity: number;
  reserve: number;
  rotationReserve: number;
  allocated: number;
  reserved: number;
  draining: number;
  evictions: number;
  admissions: number;
  saturations: number;
  leases: number;
  maintenance: { inUse: number; waiting: number; byPurpose: Record<string, number> };
}

async function capacityNow(): Promise<HostCapacity | null> {
  const answer = await send("GET", "/v1/capacity", { key: adminKey });
  const outcome = judge("capacity", null, answer, "GET /v1/capacity");
  if (outcome.kind !== "ok") return null;
  return (answer.json as { hosts?: HostCapacity[] }).hosts?.find((h) => h.host === hostName) ?? null;
}

const maxSeen = { ledger: 0, backends: 0, maintenance: 0 };

async function checkLedger(): Promise<void> {
  const host = await capacityNow();
  if (!host) {
    bump(record.skippedSamples, "capacity");
    return;
  }
  checked("budget_ledger");
  const used = host.allocated + host.reserved + host.draining;
  maxSeen.ledger = Math.max(maxSeen.ledger, used);
  maxSeen.maintenance = Math.max(maxSeen.maintenance, host.maintenance.inUse);
  if (used > host.poolCapacity + host.rotationReserve) {
    violation(
      "budget_ledger",
      `ledger holds ${used} (allocated ${host.allocated}, reserved ${host.reserved}, draining ${host.draining}) > pool capacity ${host.poolCapacity} + rotation reserve ${host.rotationReserve}`,
    );
  }
  if (host.maintenance.inUse > host.reserve) {
    violation(
      "budget_ledger",
      `maintenance slots in use ${host.maintenance.inUse} > reserve ${host.reserve}`,
    );
  }
}

interface Backend {
  app: string;
  state: string | null;
  usename: string;
}

async function lessorBackends(): Promise<Backend[]> {
  return onHost(async (client) => {
    const { rows } = await client.query<Backend>(
      "SELECT application_name AS app, state, usename FROM pg_stat_activity WHERE application_name LIKE 'lessor:%'",
    );
    return rows;
  });
}

async function checkBackends(): Promise<void> {
  let backends: Backend[];
  try {
    backends = await lessorBackends();
  } catch {
    bump(record.skippedSamples, "pg_stat_activity");
    return;
  }
  checked("budget_backends");
  checked("duplicate_start");
  maxSeen.backends = Math.max(maxSeen.backends, backends.length);
  const cap = budget.connections + budget.rotationReserve;
  if (backends.length > cap) {
    const byKind = new Map<string, number>();
    for (const b of backends)
      bump(byKind, b.app.replace(/^lessor:t_[0-9a-f]+:/, "lessor:<role>:").replace(/:\d+$/, ":<gen>"));
    violation(
      "budget_backends",
      `${backends.length} lessor:* backends on the host > connections ${budget.connections} + rotation reserve ${budget.rotationReserve} (${[...byKind].map(([k, n]) => `${k} ×${n}`).join(", ")})`,
    );
  }
  // Per role: backends of each pooled generation within the pool size; at most two generations.
  const byRole = new Map<string, Map<number, number>>();
  for (const b of backends) {
    const match = /^lessor:(t_[0-9a-f]+):(\d+)$/.exec(b.app);
    if (!match?.[1] || !match[2]) continue;
    const generations = byRole.get(match[1]) ?? new Map<number, number>();
    bump(generations, Number(match[2]));
    byRole.set(match[1], generations);
  }
  for (const [role, generations] of byRole) {
    const tenant = [...tenants.values()].find((t) => t.role === role);
    const size = tenant?.poolSize ?? 6;
    for (const [generation, n] of generations) {
      if (n > size)
        violation(
          "budget_backends",
          `${tenant?.id ?? role} generation ${generation} holds ${n} backends > its pool size ${size}`,
        );
    }
    if (generations.size > 2) {
      violation(
        "duplicate_start",
        `${tenant?.id ?? role} has backends of ${generations.size} generations at once: ${[...generations.keys()].join(", ")}`,
      );
    }
  }
}

/** Reads tenants' tables behind Lessor's back: only the tenant's own sentinel and markers may be there. */
async function sweepTables(sample: readonly SoakTenant[]): Promise<void> {
  for (const tenant of sample) {
    let bodies: string[];
    try {
      bodies = await onHost(async (client) => {
        const { rows } = await client.query<{ body: string }>("SELECT body FROM notes");
        return rows.map((r) => r.body);
      }, tenant.database);
    } catch {
      bump(record.skippedSamples, "table sweep");
      continue;
    }
    checked("sentinel");
    const own = new RegExp(`^(sentinel|w|b|l|r):${tenant.id}:`);
    const foreign = bodies.filter((b) => !own.test(b));
    const sentinels = bodies.filter((b) => b.startsWith("sentinel:"));
    if (foreign.length > 0 || sentinels.length !== 1 || sentinels[0] !== tenant.sentinel) {
      violation(
        "sentinel",
        `${tenant.id}'s table holds ${foreign.length} foreign row(s) ${JSON.stringify(foreign.slice(0, 3))} and sentinels ${JSON.stringify(sentinels)}`,
      );
    }
  }
}

// Lifecycle events: no start while a pool lives, no generation started twice.

interface LifecycleEvent {
  tenant_id: string;
  seq: number;
  generation: number;
  from_state: string;
  to_state: string;
  reason: string;
}

const eventsByTenant = new Map<string, Map<number, LifecycleEvent>>();
const startViolations = new Set<string>();
const eventStats = { events: 0, starts: 0 };

async function readEvents(): Promise<void> {
  const seen = [...eventsByTenant].map(
    ([tenant, events]) => [tenant, Math.max(0, ...events.keys())] as const,
  );
  const rows = await onControlPlane(async (client) => {
    const { rows } = await client.query<LifecycleEvent>(
      `SELECT e.tenant_id, e.seq::int AS seq, e.generation::int AS generation, e.from_state, e.to_state, e.reason
         FROM lifecycle_events e
         LEFT JOIN unnest($1::text[], $2::int[]) AS known(tenant_id, seq) ON known.tenant_id = e.tenant_id
        WHERE e.seq > coalesce(known.seq, 0) AND e.tenant_id = ANY($3::text[])`,
      [seen.map(([t]) => t), seen.map(([, s]) => s), [...tenants.keys()]],
    );
    return rows;
  });
  const touched = new Set<string>();
  for (const row of rows) {
    const events = eventsByTenant.get(row.tenant_id) ?? new Map<number, LifecycleEvent>();
    events.set(row.seq, row);
    eventsByTenant.set(row.tenant_id, events);
    touched.add(row.tenant_id);
  }
  for (const tenant of touched) walkEvents(tenant);
}

/** Walks a tenant's events in order: a start must begin from a stopped or failed pool, once per generation. */
function walkEvents(tenantId: string): void {
  const events = [...(eventsByTenant.get(tenantId)?.values() ?? [])].sort((a, b) => a.seq - b.seq);
  const started = new Set<number>();
  let starts = 0;
  // The pool's own state: `migrating` is an overlay on it (an event into it leaves the pool as it was).
  let pool = "stopped";
  for (const event of events) {
    // A start is the transition core/lifecycle.ts's beginStart makes: on demand, or a retry after a failure.
    if (event.reason === "demand" || event.reason === "retry") {
      starts++;
      const key = `${tenantId}:${event.seq}`;
      if (!["stopped", "failed"].includes(pool) && !startViolations.has(key)) {
        startViolations.add(key);
        violation(
          "duplicate_start",
          `${tenantId} began generation ${event.generation} while its pool was ${pool} (event ${event.seq}: ${event.from_state} → ${event.to_state})`,
        );
      }
      if (started.has(event.generation) && !startViolations.has(`${key}:again`)) {
        startViolations.add(`${key}:again`);
        violation(
          "duplicate_start",
          `${tenantId} started generation ${event.generation} twice (event ${event.seq})`,
        );
      }
      started.add(event.generation);
    }
    if (event.to_state !== "migrating") pool = event.to_state;
  }
  eventStats.events = [...eventsByTenant.values()].reduce((n, m) => n + m.size, 0);
  startsByTenant.set(tenantId, starts);
  eventStats.starts = [...startsByTenant.values()].reduce((a, b) => a + b, 0);
}
const startsByTenant = new Map<string, number>();

let checkerRunning = true;

async function checkerLoop(): Promise<void> {
  let sweepCursor = 0;
  while (checkerRunning) {
    const began = Date.now();
    await checkLedger().catch(() => bump(record.skippedSamples, "capacity"));
    await checkBackends();
    const live = liveTenants();
    const sample = [0, 1]
      .map(() => live[sweepCursor++ % Math.max(1, live.length)])
      .filter((t): t is SoakTenant => t !== undefined);
    await sweepTables(sample);
    await readEvents().then(
      () => checked("duplicate_start"),
      () => bump(record.skippedSamples, "lifecycle events"),
    );
    await sleep(Math.max(0, 1_000 - (Date.now() - began)));
  }
}

// ── Setup ────────────────────────────────────────────────────────────────────────────────────────

function nextTenantId(): string {
  tenantSerial++;
  return `soak-${String(tenantSerial).padStart(3, "0")}`;
}

/** Provisions a tenant (retrying the retryable refusals, bounded) and writes its sentinel row through `/sql`. */
async function provisionOne(id: string): Promise<SoakTenant> {
  const tier = Number(id.slice(id.lastIndexOf("-") + 1)) % standardEvery === 0 ? "standard" : "free";
  let key: string | null = null;
  for (let attempt = 1; attempt <= 60 && key === null; attempt++) {
    const answer = await send("POST", "/v1/tenants", { key: adminKey, json: { id, tier, host: hostName } });
    const outcome = judge("provision", null, answer, `POST /v1/tenants {id: ${id}}`);
    const body = answer.json as { key?: unknown } | null;
    if (outcome.kind === "ok" && typeof body?.key === "string") key = body.key;
    else if (outcome.kind === "ok") throw new Error(`provisioning ${id} answered no key`);
    else await sleep(Math.min(3, Math.max(0.5, Number(answer.retryAfter) || 1)) * 1_000);
  }
  if (key === null) throw new Error(`could not provision ${id}`);
  const names = await onControlPlane(async (client) => {
    const { rows } = await client.query<{ database_name: string; role_name: string }>(
      "SELECT database_name, role_name FROM tenants WHERE id = $1",
      [id],
    );
    return rows[0];
  });
  if (!names) throw new Error(`${id} is not in the catalog`);
  const pools = JSON.parse(wranglerVars().LESSOR_POOL_SIZES ?? "{}") as Record<string, number>;
  const tenant: SoakTenant = {
    id,
    key,
    tier,
    poolSize: pools[tier] ?? 5,
    database: names.database_name,
    role: names.role_name,
    sentinel: `sentinel:${id}:${randomBytes(6).toString("hex")}`,
    phase: "live",
    eraseInFlight: null,
    successes: 0,
    unknown: 0,
    successTimes: [],
    mayBeUncounted: 0,
    forgivenUntil: 0,
    committed: new Set(),
    refused: new Set(),
    ambiguous: new Set(),
    writes: 0,
    serial: 0,
  };
  // The sentinel goes in through Lessor, like any write (and counts as a statement).
  for (let attempt = 1; ; attempt++) {
    const answer = await send("POST", "/sql", {
      headers: sqlHeaders(tenant),
      json: { query: "INSERT INTO notes (body) VALUES ($1)", params: [tenant.sentinel] },
    });
    const outcome = judge("sql write", tenant, answer, `POST /sql (${id}, sentinel)`);
    counted(tenant, outcome);
    if (outcome.kind === "ok") break;
    if (outcome.kind === "unknown" || outcome.mayHaveRun) {
      // Did it land? Look, then write it only if it did not.
      const landed = await onHost(async (client) => {
        const { rows } = await client.query("SELECT 1 FROM notes WHERE body = $1", [tenant.sentinel]);
        return rows.length > 0;
      }, tenant.database).catch(() => false);
      if (landed) break;
    }
    if (attempt >= 60) throw new Error(`could not write ${id}'s sentinel`);
    await sleep(Math.min(3, Math.max(0.5, Number(answer.retryAfter) || 1)) * 1_000);
  }
  tenants.set(id, tenant);
  refreshTrafficTenants();
  return tenant;
}

/**
 * Every tenant database back to schema version 1 (superuser DDL and the catalog's version, as
 * bench/campaign.ts does), so the campaigns have something to migrate.
 */
async function rollBackSchemas(all: readonly SoakTenant[]): Promise<void> {
  await inParallel(all, 4, async (tenant) => {
    await onHost(async (client) => {
      await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
      await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
      await client.query("DELETE FROM lessor.schema_migrations WHERE version > 1");
    }, tenant.database);
  });
  await onControlPlane((client) =>
    client.query("UPDATE tenants SET schema_version = 1 WHERE id = ANY($1::text[])", [all.map((t) => t.id)]),
  );
}

// ── After the run ────────────────────────────────────────────────────────────────────────────────

interface DrainOutcome {
  drainedAfterMs: number | null;
  last: { ledger: number; maintenance: number; backends: number; leases: number; sessions: number };
  problems: string[];
}

/** Waits (bounded) until no pool, lease, maintenance slot or backend of Lessor is left; cron ticks meanwhile. */
async function waitForDrain(worker: ScheduledWrangler): Promise<DrainOutcome> {
  const began = Date.now();
  let lastTick = 0;
  let last = { ledger: -1, maintenance: -1, backends: -1, leases: -1, sessions: -1 };
  let maintenanceHeldBy: Record<string, number> = {};
  let lastReport = Date.now();
  while (Date.now() - began < drainDeadlineMs) {
    if (Date.now() - lastTick > 10_000) {
      lastTick = Date.now();
      await cronTick(worker, ["budget-reconcile"], 60_000).catch(() => undefined);
    }
    const host = await capacityNow();
    const backends = await lessorBackends().catch(() => null);
    let sessions = 0;
    let leases = 0;
    await inParallel(liveTenants(), 4, async (tenant) => {
      const answer = await send("GET", `/v1/tenants/${tenant.id}`, { key: adminKey });
      judge("admin read", tenant, answer, `GET /v1/tenants/${tenant.id}`);
      const runtime = (answer.json as { runtime?: { sessions?: number; leases?: number } } | null)?.runtime;
      sessions += runtime?.sessions ?? 0;
      leases += runtime?.leases ?? 0;
    });
    if (host && backends) {
      maintenanceHeldBy = host.maintenance.byPurpose;
      last = {
        ledger: host.allocated + host.reserved + host.draining,
        maintenance: host.maintenance.inUse,
        backends: backends.length,
        leases: Math.max(leases, host.leases),
        sessions,
      };
      if (Object.values(last).every((n) => n === 0)) {
        return { drainedAfterMs: Date.now() - began, last, problems: [] };
      }
      if (Date.now() - lastReport > 20_000) {
        lastReport = Date.now();
        progress(`  still held: ${JSON.stringify(last)}, maintenance ${JSON.stringify(maintenanceHeldBy)}`);
      }
    }
    await sleep(2_000);
  }
  const backends = await lessorBackends().catch(() => []);
  const problems = [
    `after ${drainDeadlineMs / 1000} s: ledger ${last.ledger}, maintenance ${last.maintenance}, backends ${last.backends}, leases ${last.leases}, sessions ${last.sessions} (maintenance held for ${JSON.stringify(maintenanceHeldBy)})`,
    ...backends.slice(0, 10).map((b) => `left: ${b.app} (${b.state ?? "?"})`),
  ];
  return { drainedAfterMs: null, last, problems };
}

interface UsageRow {
  id: string;
  successes: number;
  unknown: number;
  /** Successes answered just before a kill of the tenant's object, whose usage may not have been saved. */
  mayBeUncounted: number;
  lessorQueries: number;
  lessorErrors: number;
}

/** Usage: `queries − errors` (what Lessor counts as succeeded) against the tenant's own count. */
async function checkUsage(): Promise<{ rows: UsageRow[]; settledAfterMs: number | null }> {
  const began = Date.now();
  const live = liveTenants();
  const read = async (tenant: SoakTenant) => {
    const answer = await send("GET", `/v1/tenants/${tenant.id}/usage`, { key: adminKey });
    judge("admin read", tenant, answer, `GET /v1/tenants/${tenant.id}/usage`);
    const usage = (answer.json as { usage?: { queries?: number; errors?: number } } | null)?.usage;
    return { queries: Number(usage?.queries ?? Number.NaN), errors: Number(usage?.errors ?? Number.NaN) };
  };
  const matches = (tenant: SoakTenant, u: { queries: number; errors: number }) => {
    const ok = u.queries - u.errors;
    return ok >= tenant.successes - tenant.mayBeUncounted && ok <= tenant.successes + tenant.unknown;
  };
  // The objects flush their usage on their heartbeat (30 s): wait (bounded) until every count settles.
  let rows: UsageRow[] = [];
  let settledAfterMs: number | null = null;
  for (let round = 0; round < 30; round++) {
    rows = [];
    await inParallel(live, 4, async (tenant) => {
      const u = await read(tenant);
      rows.push({
        id: tenant.id,
        successes: tenant.successes,
        unknown: tenant.unknown,
        mayBeUncounted: tenant.mayBeUncounted,
        lessorQueries: u.queries,
        lessorErrors: u.errors,
      });
    });
    if (
      rows.every((r) =>
        matches(tenants.get(r.id) as SoakTenant, { queries: r.lessorQueries, errors: r.lessorErrors }),
      )
    ) {
      settledAfterMs = Date.now() - began;
      break;
    }
    await sleep(5_000);
  }
  for (const row of rows.sort((a, b) => a.id.localeCompare(b.id))) {
    checked("usage");
    const ok = row.lessorQueries - row.lessorErrors;
    if (!(ok >= row.successes - row.mayBeUncounted && ok <= row.successes + row.unknown)) {
      violation(
        "usage",
        `${row.id}: Lessor counts ${ok} successful statements (queries ${row.lessorQueries} − errors ${row.lessorErrors}); the tenant saw ${row.successes} succeed (${row.mayBeUncounted} of them just before a kill of its object) and ${row.unknown} without a known outcome`,
      );
    }
  }
  return { rows, settledAfterMs };
}

/** Writes: every acknowledged marker is in the table, no refused one is. */
async function checkWrites(): Promise<{
  committed: number;
  refused: number;
  ambiguous: number;
  ambiguousLanded: number;
}> {
  const totals = { committed: 0, refused: 0, ambiguous: 0, ambiguousLanded: 0 };
  await inParallel(liveTenants(), 4, async (tenant) => {
    const bodies = await onHost(async (client) => {
      const { rows } = await client.query<{ body: string }>("SELECT body FROM notes");
      return rows.map((r) => r.body);
    }, tenant.database);
    const present = new Map<string, number>();
    for (const body of bodies) bump(present, body);
    checked("writes");
    const missing = [...tenant.committed].filter((m) => !present.has(m));
    const landed = [...tenant.refused].filter((m) => present.has(m));
    const twice = [...present].filter(([body, n]) => n > 1 && !body.startsWith("sentinel:")).map(([b]) => b);
    totals.committed += tenant.committed.size;
    totals.refused += tenant.refused.size;
    totals.ambiguous += tenant.ambiguous.size;
    totals.ambiguousLanded += [...tenant.ambiguous].filter((m) => present.has(m)).length;
    if (missing.length > 0)
      violation(
        "writes",
        `${tenant.id}: ${missing.length} acknowledged write(s) missing: ${missing.slice(0, 5).join(", ")}`,
      );
    if (landed.length > 0)
      violation(
        "writes",
        `${tenant.id}: ${landed.length} refused or rolled-back write(s) committed: ${landed.slice(0, 5).join(", ")}`,
      );
    if (twice.length > 0)
      violation(
        "writes",
        `${tenant.id}: ${twice.length} write(s) committed twice: ${twice.slice(0, 5).join(", ")}`,
      );
  });
  return totals;
}

/** The erased tenants' databases and roles must be gone from the host. */
async function checkErased(): Promise<number> {
  const erased = [...tenants.values()].filter((t) => t.phase === "erased");
  if (erased.length === 0) return 0;
  return onHost(async (client) => {
    const { rows } = await client.query<{ n: number }>(
      `SELECT (SELECT count(*) FROM pg_database WHERE datname = ANY($1))::int
            + (SELECT count(*) FROM pg_roles WHERE rolname = ANY($2))::int AS n`,
      [erased.map((t) => t.database), erased.map((t) => t.role)],
    );
    return Number(rows[0]?.n ?? 0);
  });
}

// ── Main ─────────────────────────────────────────────────────────────────────────────────────────

async function main(): Promise<boolean> {
  const loadAtStart = loadNow();
  const source = sourceRevision();
  progress(
    `soak: ${minutes} min, ${tenantCount} tenants on one host with budget ${budget.connections} (reserve ${budget.reserve}, rotation reserve ${budget.rotationReserve}), concurrency ${concurrency}, seed ${seed}; load average ${loadAtStart.join(" ")}`,
  );
  rmSync(stateDir, { recursive: true, force: true });
  mkdirSync(stateDir, { recursive: true });
  const password = randomBytes(18).toString("base64url");
  progress("starting the control-plane Postgres, the host's Postgres and the WebSocket proxy");
  const stack = await startClusterStack({
    password,
    persistent: false,
    controlPlane: {
      name: "control",
      dataDir: resolve(stateDir, "pg-control"),
      port: await freePort(),
      maxConnections: 200,
    },
    hosts: [
      {
        name: hostName,
        dataDir: resolve(stateDir, `pg-${hostName}`),
        port: await freePort(),
        maxConnections: hostMaxConnections,
      },
    ],
  });
  running.stack = stack;
  const host = stack.info.hosts[0];
  if (!host) throw new Error("the stack has no host");
  hostSuperuserUrl = host.superuserUrl;
  controlPlaneUrl = stack.info.controlPlaneUrl;

  adminKey = `lak_soak_${randomBytes(24).toString("base64url")}`;
  const env = {
    ...wranglerVars(),
    LESSOR_ADMIN_KEY: adminKey,
    LESSOR_SEAL_KEY: randomBytes(32).toString("base64"),
    LESSOR_KEY_MAC_KEYS: randomBytes(32).toString("base64"),
    LESSOR_CONTROL_PLANE_URL: controlPlaneUrl,
    LESSOR_HOSTS: JSON.stringify({ [hostName]: host.adminUrl }),
    LESSOR_BUDGETS: JSON.stringify({ "*": budget }),
    LESSOR_IDLE_TIMEOUT_MS: String(idleTimeoutMs),
    LESSOR_STATEMENT_TIMEOUT_MS: String(statementTimeoutMs),
    LESSOR_WS_PROXY: stack.info.wsProxy,
    BENCH_DATABASE_URL: "postgres://unused@127.0.0.1:1/unused",
  };
  progress("starting wrangler dev --test-scheduled on a snapshot of the sources (bench/soak-worker.ts)");
  const log: string[] = [];
  const worker = await startScheduledWrangler({
    env,
    envFile,
    persistDir,
    snapshotDir,
    registryDir: resolve(stateDir, "registry"),
    config: "bench/soak-wrangler.toml",
    benchFiles: ["worker.ts", "fleet-worker.ts", "soak-worker.ts", "lessor-entry.js", "soak-wrangler.toml"],
    onLine: (line) => {
      log.push(line);
      const event = /"level":"error","event":"([a-z_]+)"/.exec(line)?.[1];
      if (event) bump(record.workerErrors, event);
    },
  });
  running.wrangler = worker;
  baseUrl = worker.publicUrl;

  progress(`provisioning ${tenantCount} tenants (each with a sentinel row written through /sql)`);
  const setupBegan = Date.now();
  const ids = Array.from({ length: tenantCount }, () => nextTenantId());
  await inParallel(ids, 2, async (id) => {
    await provisionOne(id);
  });
  progress(
    `  ${tenants.size} tenants ready in ${round((Date.now() - setupBegan) / 1000, 1)} s; rolling their schemas back to version 1 for the campaigns`,
  );
  await rollBackSchemas([...tenants.values()]);
  const ledgerBefore = await onControlPlane(async (c) =>
    Number(
      (await c.query<{ n: number }>("SELECT count(*)::int AS n FROM generation_ledger")).rows[0]?.n ?? 0,
    ),
  );
  const capacityBefore = await capacityNow();

  progress(`traffic and faults for ${minutes} min`);
  const trafficStartedAt = Date.now();
  phase = "traffic";
  const checker = checkerLoop();
  const clients = Array.from({ length: concurrency }, () => trafficClient());
  const operator = operatorLoop(trafficStartedAt);
  const cron = cronLoop(worker);
  const faults = faultLoop(stack);
  const ticker = setInterval(() => {
    const total = [...record.answers.values()].reduce((a, b) => a + b, 0);
    const bad = [...record.violationCounts.values()].reduce((a, b) => a + b, 0);
    progress(
      `  ${round((Date.now() - trafficStartedAt) / 60_000, 1)} min: ${total} answers, ${[...record.faults.values()].reduce((a, b) => a + b, 0)} faults, ${bad} violations, load ${loadNow()[0]}`,
    );
  }, 30_000);
  const loadSamples: number[] = [];
  const loadSampler = setInterval(() => loadSamples.push(loadNow()[0] ?? 0), 10_000);
  await sleep(trafficMs);
  clearInterval(ticker);
  progress("stopping faults, then traffic");
  faultsRunning = false;
  await faults;
  operatorRunning = false;
  await operator;
  trafficRunning = false;
  await Promise.all(clients);
  cronRunning = false;
  await cron;

  const trafficEndedAt = Date.now();
  phase = "quiet";
  progress(`waiting for ${erasures.length} erase(s) to finish`);
  await Promise.all(erasures);
  await refreshCampaigns();
  checkerRunning = false;
  await checker;

  progress("quiet: waiting (bounded) for every pool, lease, maintenance slot and backend to go");
  const drained = await waitForDrain(worker);
  checked("leaks");
  if (drained.drainedAfterMs === null) for (const problem of drained.problems) violation("leaks", problem);
  else progress(`  drained in ${round(drained.drainedAfterMs / 1000, 1)} s`);
  await checkCampaigns(worker);
  // Lifecycle events are flushed by now (the objects flush on their heartbeat): a last full walk.
  await readEvents().catch(() => record.notes.push("the last read of lifecycle events failed"));
  for (const tenant of eventsByTenant.keys()) walkEvents(tenant);
  checked("duplicate_start");
  progress("checking usage (waiting, bounded, for the objects' last flush) and every write");
  const usage = await checkUsage();
  const writes = await checkWrites();
  const erasedLeftovers = await checkErased();
  if (erasedLeftovers > 0)
    violation("leaks", `${erasedLeftovers} database(s) or role(s) of erased tenants are still on the host`);
  checked("leaks");
  const ledgerAfter = await onControlPlane(async (c) =>
    Number(
      (await c.query<{ n: number }>("SELECT count(*)::int AS n FROM generation_ledger")).rows[0]?.n ?? 0,
    ),
  );
  const capacityAfter = await capacityNow();
  clearInterval(loadSampler);
  writeFileSync(logFile, log.join("\n"));

  // ── Summary ──
  const total = [...record.answers.values()].reduce((a, b) => a + b, 0);
  const byStatus = new Map<string, number>();
  const byPhase = new Map<string, number>();
  const notOkByPhase = new Map<string, number>();
  for (const [key, n] of record.answers) {
    const [answerPhase = "?", , status = "?"] = key.split("\t");
    bump(byPhase, answerPhase, n);
    if (!/^2/.test(status)) bump(notOkByPhase, answerPhase, n);
    if (answerPhase === "traffic") bump(byStatus, status, n);
  }
  const trafficTotal = byPhase.get("traffic") ?? 0;
  const sorted = [...record.latencies].sort((a, b) => a - b);
  const violated = [...record.violationCounts.values()].reduce((a, b) => a + b, 0);
  const pass = violated === 0 && tenants.size > 0 && total > 0;
  const loadEnd = loadNow();
  const lines = [
    `# soak: ${minutes} min of traffic, ${tenantCount} tenants (${[...tenants.values()].filter((t) => t.tier === "standard").length} standard, pools of 5; the rest free, pools of 2) on one host, budget ${budget.connections} (reserve ${budget.reserve}, rotation reserve ${budget.rotationReserve}), concurrency ${concurrency}, seed ${seed}`,
    `# load average at start ${loadAtStart.join(" ")}, during (1-min, every 10 s) median ${rank(
      [...loadSamples].sort((a, b) => a - b),
      50,
    )} max ${Math.max(0, ...loadSamples)}, at end ${loadEnd.join(" ")}; ${machineFacts().cores} cores`,
    `requests=${trafficTotal} ok=${trafficTotal - (notOkByPhase.get("traffic") ?? 0)} p50_ms=${rank(sorted, 50)} p99_ms=${rank(sorted, 99)} (traffic phase; also judged: setup ${byPhase.get("setup") ?? 0} answers, ${notOkByPhase.get("setup") ?? 0} not 2xx; quiet end ${byPhase.get("quiet") ?? 0}, ${notOkByPhase.get("quiet") ?? 0} not 2xx)`,
    `answers: ${[...byStatus]
      .sort((a, b) => b[1] - a[1])
      .map(([k, n]) => `${k.replaceAll(" ", "_")}=${n}`)
      .join(" ")}`,
    `operations: ${[...record.operations].map(([k, n]) => `${k.replaceAll(" ", "_")}=${n}`).join(" ")} cron_ticks=${cronFired} pool_starts=${ledgerAfter - ledgerBefore} evictions=${(capacityAfter?.evictions ?? 0) - (capacityBefore?.evictions ?? 0)}`,
    `campaigns: ${campaigns.map((c) => `to_v${c.toVersion}=${c.state}(${c.counts.succeeded ?? 0}/${c.counts.total ?? c.enrolled}${c.counts.failed ? `,failed=${c.counts.failed}` : ""})`).join(" ") || "none"} erases: ${eraseOutcomes.filter((e) => e.erasedAfterMs !== null).length}/${eraseOutcomes.length} leftover_databases=${erasedLeftovers}`,
    `faults: ${[...record.faults].map(([k, n]) => `${k}=${n}`).join(" ")}`,
    `max_ledger=${maxSeen.ledger}/${poolCapacity}(+${budget.rotationReserve}) max_backends=${maxSeen.backends}/${budget.connections}(+${budget.rotationReserve}) max_maintenance=${maxSeen.maintenance}/${budget.reserve}`,
    `drained_after_s=${drained.drainedAfterMs === null ? "never" : round(drained.drainedAfterMs / 1000, 1)} usage_settled_after_s=${usage.settledAfterMs === null ? "never" : round(usage.settledAfterMs / 1000, 1)}`,
    `writes: acknowledged=${writes.committed} refused=${writes.refused} unknown=${writes.ambiguous} (of which landed ${writes.ambiguousLanded})`,
    `invariants: ${invariants.map((i) => `${i}=${record.checks.get(i) ?? 0}/${record.violationCounts.get(i) ?? 0}`).join(" ")} (checks/violations)`,
    ...(record.skippedSamples.size > 0
      ? [
          `samples_skipped: ${[...record.skippedSamples].map(([k, n]) => `${k.replaceAll(" ", "_")}=${n}`).join(" ")}`,
        ]
      : []),
    ...(record.workerErrors.size > 0
      ? [`worker_error_logs: ${[...record.workerErrors].map(([k, n]) => `${k}=${n}`).join(" ")}`]
      : []),
    `result=${pass ? "PASS" : "FAIL"}`,
  ];

  const date = new Date().toISOString().slice(0, 10);
  const resultsDir = resolve(root, "bench/results");
  mkdirSync(resultsDir, { recursive: true });
  const file = resolve(resultsDir, `soak-${date}-${minutes}min.json`);
  const result = {
    kind: "soak",
    startedAt: new Date(record.startedAt).toISOString(),
    trafficStartedAt: new Date(trafficStartedAt).toISOString(),
    trafficEndedAt: new Date(trafficEndedAt).toISOString(),
    source,
    settings: {
      minutes,
      tenants: tenantCount,
      concurrency,
      seed,
      budget,
      hostMaxConnections,
      idleTimeoutMs,
      statementTimeoutMs,
      leaseTtlMs,
      drainDeadlineMs,
    },
    machine: { ...machineFacts(), loadAtStart, loadAtEnd: loadEnd, loadDuring: loadSamples },
    versions: {
      wrangler: packageVersion("wrangler"),
      miniflare: packageVersion("miniflare"),
      neon: packageVersion("@neondatabase/serverless"),
      postgres: await onHost(
        async (c) => (await c.query<{ v: string }>("SHOW server_version AS v")).rows[0]?.v ?? "?",
      ).catch(() => "?"),
    },
    pass,
    summary: lines,
    requests: { total, byPhase: Object.fromEntries(byPhase), notOkByPhase: Object.fromEntries(notOkByPhase) },
    answers: Object.fromEntries(record.answers),
    latencyMs: {
      p50: rank(sorted, 50),
      p99: rank(sorted, 99),
      byRoute: Object.fromEntries(
        [...record.latenciesByRoute].map(([route, list]) => {
          const s = [...list].sort((a, b) => a - b);
          return [route, { n: s.length, p50: rank(s, 50), p99: rank(s, 99) }];
        }),
      ),
    },
    operations: Object.fromEntries(record.operations),
    cronTicks: cronFired,
    poolStarts: ledgerAfter - ledgerBefore,
    faults: Object.fromEntries(record.faults),
    faultLog: record.faultLog,
    campaigns,
    erasures: eraseOutcomes,
    maxSeen,
    drain: drained,
    usage,
    writes,
    invariants: Object.fromEntries(
      invariants.map((i) => [
        i,
        { checks: record.checks.get(i) ?? 0, violations: record.violationCounts.get(i) ?? 0 },
      ]),
    ),
    violations: record.violations,
    skippedSamples: Object.fromEntries(record.skippedSamples),
    workerErrorLogs: Object.fromEntries(record.workerErrors),
    lifecycleEvents: eventStats,
    notes: record.notes,
  };
  writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  for (const v of record.violations.slice(0, 20))
    console.log(`# VIOLATION ${v.invariant} ${v.at}: ${v.what}`);
  for (const note of record.notes.slice(0, 10)) console.log(`# note: ${note}`);
  console.log(`# results: ${file}; the Worker's log: ${logFile}`);
  for (const line of lines) console.log(line);
  if (!pass) console.log(`# replay: ${replayCommand}`);
  return pass;
}

let pass = false;
try {
  pass = await within(main(), trafficMs + 30 * 60_000, "the soak");
} catch (error) {
  console.error(
    `# soak could not run: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`,
  );
  console.log("result=FAIL");
  console.log(`# replay: ${replayCommand}`);
} finally {
  await controlPlane.client?.end().catch(() => undefined);
  await cleanup();
}
process.exit(pass ? 0 : 1);
