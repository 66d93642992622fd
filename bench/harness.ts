/**
 * What the peer and fleet benchmarks share: Lessor's admin API, a raw `POST /sql`, superuser access
 * to a cluster, the `[vars]` of wrangler.toml, CPU and memory of processes from /proc, and the facts
 * every results file records (machine, load average, versions, source commit).
 */
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync, readlinkSync, rmSync } from "node:fs";
import { cpus, loadavg, release, totalmem } from "node:os";
import { resolve } from "node:path";
import pg from "pg";
import { burstFetch, closeConnections, lightFetch, requestTimeoutMs } from "./load.ts";
import { descendants, root } from "./processes.ts";

// ── Progress ─────────────────────────────────────────────────────────────────────────────────────

const started = performance.now();

/** One progress line on stderr, with the seconds since the run started. */
export function progress(line: string): void {
  const seconds = ((performance.now() - started) / 1000).toFixed(0).padStart(4);
  process.stderr.write(`[${seconds}s] ${line}\n`);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

/** Runs `work` over `items`, at most `limit` at a time. */
export async function inParallel<T>(
  items: readonly T[],
  limit: number,
  work: (item: T, index: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) {
        const index = next++;
        await work(items[index] as T, index);
      }
    }),
  );
}

/** A bounded numeric setting from the environment. */
export function setting(name: string, fallback: number, min: number, max: number): number {
  const raw = process.env[name];
  const value = raw === undefined || raw === "" ? fallback : Number(raw);
  if (!Number.isFinite(value) || value < min || value > max) {
    throw new Error(`${name} must be a number from ${min} to ${max}`);
  }
  return value;
}

// ── Configuration ────────────────────────────────────────────────────────────────────────────────

/** The `[vars]` of ../wrangler.toml: `KEY = "value"` or `KEY = 'value'` lines, nothing fancier. */
export function wranglerVars(): Record<string, string> {
  const toml = readFileSync(resolve(root, "wrangler.toml"), "utf8");
  const vars: Record<string, string> = {};
  let inVars = false;
  for (const raw of toml.split("\n")) {
    const line = raw.trim();
    if (line.startsWith("[")) {
      inVars = line === "[vars]";
      continue;
    }
    if (!inVars || line === "" || line.startsWith("#")) continue;
    const match = /^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?:"([^"\\]*)"|'([^']*)')\s*(?:#.*)?$/.exec(line);
    if (!match?.[1]) throw new Error(`wrangler.toml [vars]: cannot read "${line}" (plain strings only)`);
    vars[match[1]] = match[2] ?? match[3] ?? "";
  }
  return vars;
}

// ── Lessor's API ─────────────────────────────────────────────────────────────────────────────────

export interface TenantCredentials {
  id: string;
  key: string;
}

export class ApiError extends Error {
  readonly status: number;
  readonly body: string;
  constructor(status: number, body: string, what: string) {
    super(`${what}: HTTP ${status} ${body.slice(0, 300)}`);
    this.status = status;
    this.body = body;
  }
}

/** An admin call; the answer's JSON, or an ApiError. */
export async function admin(
  base: string,
  adminKey: string,
  path: string,
  body?: unknown,
  method?: string,
): Promise<unknown> {
  // A read that meets a control-plane blip (503 control_plane_unavailable, which Lessor marks
  // retryable) is asked again, a few times; anything else is the caller's to judge.
  const reads = body === undefined && (method ?? "GET") === "GET";
  for (let attempt = 1; ; attempt++) {
    const response = await lightFetch(`${base}${path}`, {
      method: method ?? (body === undefined ? "GET" : "POST"),
      headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await response.text();
    if (reads && attempt < 5 && response.status === 503 && text.includes("control_plane_unavailable")) {
      await sleep(1_000 * attempt);
      continue;
    }
    if (!response.ok) throw new ApiError(response.status, text, `${method ?? "GET/POST"} ${path}`);
    return text === "" ? null : (JSON.parse(text) as unknown);
  }
}

/** `POST /v1/tenants`; returns the key. */
export async function provision(
  base: string,
  adminKey: string,
  id: string,
  host?: string,
): Promise<TenantCredentials> {
  // Provisioning takes a maintenance connection from the host's reserve: more concurrent creates
  // than the reserve holds answer 503 maintenance_busy, which a caller retries (bounded).
  for (let attempt = 1; ; attempt++) {
    try {
      const body = (await admin(
        base,
        adminKey,
        "/v1/tenants",
        host === undefined ? { id } : { id, host },
      )) as {
        key?: unknown;
      };
      if (typeof body.key !== "string") throw new Error(`provisioning ${id} returned no key`);
      return { id, key: body.key };
    } catch (error) {
      const retryable =
        error instanceof ApiError &&
        error.status === 503 &&
        /maintenance_busy|control_plane_unavailable/.test(error.body);
      if (!retryable || attempt >= 30) throw error;
      await sleep(500 + Math.random() * 500);
    }
  }
}

export interface RawAnswer {
  status: number;
  retryAfter: string | null;
  body: unknown;
  ms: number;
}

/**
 * One `POST /sql` of the Neon HTTP protocol, answer kept raw (status, Retry-After, body), so a
 * refusal's code and retry hint can be read. `fresh`: on a connection of its own (a first request).
 */
export async function rawSql(
  base: string,
  tenant: TenantCredentials,
  query: string,
  params: unknown[] = [],
  fresh = false,
): Promise<RawAnswer> {
  const begin = performance.now();
  const response = await (fresh ? burstFetch : lightFetch)(`${base}/sql`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "neon-connection-string": `postgres://${tenant.id}:${tenant.key}@lessor/${tenant.id}`,
    },
    body: JSON.stringify({ query, params }),
  });
  const text = await response.text();
  const ms = performance.now() - begin;
  let body: unknown = text;
  try {
    body = JSON.parse(text) as unknown;
  } catch {
    // kept as text
  }
  return { status: response.status, retryAfter: response.headers.get("retry-after"), body, ms };
}

/**
 * Each tenant's database name, from the control plane's catalog: Lessor names a tenant's database
 * and role opaquely (`t_<16 hex>`, src/core/names.ts) and its API never shows them.
 */
export async function tenantDatabaseNames(controlPlaneUrl: string): Promise<Map<string, string>> {
  return asSuperuser(controlPlaneUrl, async (client) => {
    const { rows } = await client.query<{ id: string; database_name: string }>(
      "SELECT id, database_name FROM tenants",
    );
    return new Map(rows.map((row) => [row.id, row.database_name]));
  });
}

/** Whether a raw answer is the one row `n = 1` (`SELECT 1 AS n`). */
export function isOne(answer: RawAnswer): boolean {
  const rows = (answer.body as { rows?: unknown } | null)?.rows;
  if (answer.status !== 200 || !Array.isArray(rows) || rows.length !== 1) return false;
  const row = rows[0] as Record<string, unknown> | unknown[];
  const n = Array.isArray(row) ? row[0] : row.n;
  return n === 1 || n === "1";
}

/** The error code of a refusal (`{code}` of an error body), or the status when there is none. */
export function answerKind(answer: RawAnswer): string {
  const code = (answer.body as { code?: unknown } | null)?.code;
  return `${answer.status} ${typeof code === "string" ? code : "(no code)"}`;
}

// ── Superuser access ─────────────────────────────────────────────────────────────────────────────

export async function asSuperuser<T>(url: string, work: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url, query_timeout: requestTimeoutMs });
  client.on("error", () => undefined);
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

export function databaseUrl(superuserUrl: string, database: string): string {
  const url = new URL(superuserUrl);
  url.pathname = `/${database}`;
  return url.toString();
}

// ── /proc ────────────────────────────────────────────────────────────────────────────────────────

/** utime + stime + cutime + cstime of `pid`, in seconds (0 when it is gone). */
export function cpuSeconds(pid: number): number {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return 0;
  }
  const rest = text.slice(text.lastIndexOf(")") + 2).split(" ");
  const field = (index: number) => Number(rest[index - 3]);
  return (field(14) + field(15) + field(16) + field(17)) / 100;
}

/** CPU seconds of a group: the given pids, and with `withDescendants`, every live process under them. */
export function groupCpuSeconds(pids: readonly number[], withDescendants = false): number {
  const all = withDescendants
    ? [...pids, ...pids.flatMap((pid) => descendants(pid).map((d) => d.pid))]
    : pids;
  return [...new Set(all)].reduce((sum, pid) => sum + cpuSeconds(pid), 0);
}

/** Busy CPU seconds of the whole machine so far (user, nice, system, irq, softirq, steal). */
export function machineBusySeconds(): number {
  const line = readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "";
  const [, user, nice, system, , , irq, softirq, steal] = line.trim().split(/\s+/).map(Number);
  return ((user ?? 0) + (nice ?? 0) + (system ?? 0) + (irq ?? 0) + (softirq ?? 0) + (steal ?? 0)) / 100;
}

function statusField(pid: number, field: string): number {
  try {
    const match = new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(
      readFileSync(`/proc/${pid}/status`, "utf8"),
    );
    return match?.[1] ? Number(match[1]) : 0;
  } catch {
    return 0;
  }
}

/** Resident set size of `pid`, in MiB. */
export function rssMiB(pid: number): number {
  return statusField(pid, "VmRSS") / 1024;
}

/**
 * Proportional set size of `pids` (and, with `withDescendants`, every process under them), in MiB:
 * shared pages (Postgres' shared buffers) are split between the processes that map them, so the
 * sum is what the group really holds, unlike a sum of RSS.
 */
export function pssMiB(pids: readonly number[], withDescendants = false): number {
  const all = withDescendants
    ? [...pids, ...pids.flatMap((pid) => descendants(pid).map((d) => d.pid))]
    : pids;
  let kb = 0;
  for (const pid of new Set(all)) {
    try {
      const match = /^Pss:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, "utf8"));
      if (match?.[1]) kb += Number(match[1]);
    } catch {
      // Gone, or not readable.
    }
  }
  return kb / 1024;
}

/**
 * Local TCP ports of the connected sockets of `pid` (IPv4 and IPv6): matched against
 * `pg_stat_activity.client_port`, they say which backends a process (PgBouncer) holds.
 */
export function connectedLocalPorts(pid: number): Set<number> {
  const inodes = new Set<string>();
  let fds: string[] = [];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return new Set();
  }
  for (const fd of fds) {
    try {
      const match = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (match?.[1]) inodes.add(match[1]);
    } catch {
      // Closed while we looked.
    }
  }
  const ports = new Set<number>();
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    let text = "";
    try {
      text = readFileSync(table, "utf8");
    } catch {
      continue;
    }
    for (const line of text.split("\n").slice(1)) {
      const columns = line.trim().split(/\s+/);
      const local = columns[1];
      const state = columns[3];
      const inode = columns[9];
      // 01 is ESTABLISHED.
      if (!local || state !== "01" || !inode || !inodes.has(inode)) continue;
      const port = Number.parseInt(local.slice(local.lastIndexOf(":") + 1), 16);
      if (Number.isInteger(port)) ports.add(port);
    }
  }
  return ports;
}

// ── What every results file records ──────────────────────────────────────────────────────────────

export function packageVersion(name: string): string {
  try {
    const pkg = JSON.parse(readFileSync(resolve(root, "node_modules", name, "package.json"), "utf8")) as {
      version?: string;
    };
    return pkg.version ?? "?";
  } catch {
    return "?";
  }
}

/** The commit the measured code came from, and whether src/ had uncommitted changes (read-only git). */
export function sourceRevision(): { commit: string; srcUncommittedChanges: boolean | null } {
  const git = (args: string[]) => {
    const result = spawnSync("git", args, { cwd: root, encoding: "utf8", timeout: 10_000 });
    return result.status === 0 ? result.stdout.trim() : null;
  };
  const status = git(["status", "--porcelain", "--", "src", "wrangler.toml"]);
  return {
    commit: git(["rev-parse", "HEAD"]) ?? "?",
    srcUncommittedChanges: status === null ? null : status !== "",
  };
}

/** The machine, with the 1-, 5- and 15-minute load averages now (other work on the machine). */
export function machineFacts() {
  const cpuInfo = cpus();
  return {
    cores: cpuInfo.length,
    cpuModel: cpuInfo[0]?.model ?? "?",
    memoryMiB: Math.round(totalmem() / 2 ** 20),
    platform: `${process.platform} ${release()}`,
    node: process.version,
    loadavg: loadavg().map((v) => Number(v.toFixed(2))),
  };
}

export function loadNow(): number[] {
  return loadavg().map((v) => Number(v.toFixed(2)));
}

/** Nearest-rank percentile (0 when empty); `sorted` must be ascending. */
export function rank(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return 0;
  const at = Math.min(sorted.length, Math.max(1, Math.ceil((p / 100) * sorted.length)));
  return sorted[at - 1] ?? 0;
}

export function round(value: number, digits = 2): number {
  const scale = 10 ** digits;
  return Math.round(value * scale) / scale;
}

export { mdTable } from "./report.ts";

/** A number for a table: fixed digits, or "–" when there is none. */
export function num(value: number | null | undefined, digits = 0): string {
  return value === null || value === undefined || !Number.isFinite(value) ? "–" : value.toFixed(digits);
}

/** What a bench run starts and must stop however it ends: its Postgres stack and `wrangler dev`. */
export interface BenchRunning {
  stack: { stop(): Promise<unknown> } | null;
  wrangler: { stop(): Promise<unknown>; killNow(): void } | null;
}

/**
 * Makes sure nothing a bench run starts outlives it: on exit `wrangler dev` is killed and the vars
 * file removed; on SIGINT/SIGTERM everything is stopped and the run exits 130. Returns the cleanup
 * a run calls when it ends normally. `before` stops what only that script holds (pools, PgBouncers).
 */
export function stopOnExit(
  name: string,
  envFile: string,
  running: BenchRunning,
  options: { onSignal?: string; before?: () => Promise<void> } = {},
): () => Promise<void> {
  const cleanup = async (): Promise<void> => {
    closeConnections();
    await options.before?.();
    await running.wrangler?.stop().catch(() => undefined);
    running.wrangler = null;
    await running.stack?.stop().catch(() => undefined);
    running.stack = null;
    rmSync(envFile, { force: true });
  };
  process.on("exit", () => {
    running.wrangler?.killNow();
    rmSync(envFile, { force: true });
  });
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.on(signal, () => {
      console.error(`\n${name}: ${signal}, stopping${options.onSignal ? ` (${options.onSignal})` : ""}`);
      void cleanup().finally(() => process.exit(130));
    });
  }
  return cleanup;
}
