/**
 * Test harness for the workers project: drives Lessor through its real fetch handler, provisions
 * real tenants on the test Postgres, and looks behind Lessor with a superuser connection.
 */
import { env } from "cloudflare:test";
import { exports } from "cloudflare:workers";
import { Client, type HTTPTransactionOptions, neon, neonConfig } from "@neondatabase/serverless";
import { loadConfig } from "../../src/config/index.ts";
import { configureDriver } from "../../src/postgres/index.ts";

export const adminKey = env.LESSOR_ADMIN_KEY;
export const base = "http://lessor.test";

configureDriver(loadConfig(env));

/** A configured host's admin connection string (`LESSOR_HOSTS` values may be strings or objects). */
export function hostAdminUrl(name: string): string {
  return loadConfig(env).hosts.get(name)?.adminUrl ?? "";
}

/** Calls Lessor's fetch handler. */
export function lessor(path: string, init: RequestInit = {}): Promise<Response> {
  return exports.default.fetch(new Request(`${base}${path}`, init));
}

export function admin(path: string, init: RequestInit & { json?: unknown } = {}): Promise<Response> {
  const { json, ...rest } = init;
  const headers = new Headers(rest.headers);
  headers.set("Authorization", `Bearer ${adminKey}`);
  if (json !== undefined) headers.set("content-type", "application/json");
  return lessor(path, { ...rest, headers, ...(json === undefined ? {} : { body: JSON.stringify(json) }) });
}

/** A tenant id no other test uses. */
export function uniqueTenantId(prefix: string): string {
  return `${prefix}-${crypto.randomUUID().slice(0, 8)}`;
}

export interface CreatedTenant {
  id: string;
  key: string;
  connectionString: string;
  /** The tenant's database on its host (an opaque name the catalog holds). */
  database: string;
  /** The tenant's login role (the same opaque name). */
  role: string;
}

/**
 * Creates a tenant as a careful client would: a `503 maintenance_busy` (every maintenance slot of
 * the host in use by other creates) is retried after its Retry-After, a bounded number of times.
 */
export async function createTenant(id: string, extra: Record<string, unknown> = {}): Promise<CreatedTenant> {
  let response = await admin("/v1/tenants", { method: "POST", json: { id, ...extra } });
  for (let attempt = 0; attempt < 20 && response.status === 503; attempt++) {
    const body = await response.json<{ code: string }>();
    if (body.code !== "maintenance_busy") throw new Error(`create ${id}: 503 ${JSON.stringify(body)}`);
    await new Promise((resolve) =>
      setTimeout(resolve, Number(response.headers.get("Retry-After") ?? 1) * 1_000),
    );
    response = await admin("/v1/tenants", { method: "POST", json: { id, ...extra } });
  }
  if (response.status !== 201) throw new Error(`create ${id}: ${response.status} ${await response.text()}`);
  const body = await response.json<{ key: string; connectionString: string }>();
  const { database, role } = await placementOf(id);
  return { id, key: body.key, connectionString: body.connectionString, database, role };
}

/** A tenant's database and role names, from the catalog. */
export async function placementOf(id: string): Promise<{ database: string; role: string }> {
  const row = await asSuperuser(async (client) => {
    const { rows } = await client.query("SELECT database_name, role_name FROM tenants WHERE id = $1", [id]);
    return rows[0] as { database_name: string; role_name: string } | undefined;
  }, "lessor");
  if (!row) throw new Error(`no catalog row for ${id}`);
  return { database: row.database_name, role: row.role_name };
}

/** `lessor:<role>:`: the application_name prefix of a tenant's connections. */
export function appPrefix(tenant: { role: string }): string {
  return `lessor:${tenant.role}:`;
}

// The Neon client's HTTP requests go straight into Lessor's fetch handler.
neonConfig.fetchEndpoint = `${base}/sql`;
neonConfig.fetchFunction = (url: string, init: RequestInit) => exports.default.fetch(new Request(url, init));

/** The official `neon()` client, pointed at Lessor. */
export function sqlFor<ArrayMode extends boolean = false, FullResults extends boolean = false>(
  tenant: CreatedTenant,
  options: HTTPTransactionOptions<ArrayMode, FullResults> = {},
) {
  return neon<ArrayMode, FullResults>(tenant.connectionString, {
    disableWarningInBrowsers: true,
    ...options,
  });
}

/** Runs `work` on a superuser connection to the test cluster. */
export async function asSuperuser<T>(
  work: (client: Client) => Promise<T>,
  database = "postgres",
): Promise<T> {
  const url = new URL(env.TEST_PG_SUPERUSER_URL.replace(/^postgres:/, "http:"));
  url.pathname = `/${database}`;
  const client = new Client(url.toString().replace(/^http:/, "postgres:"));
  client.on("error", () => undefined);
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** Backends on the test cluster whose application_name starts with `prefix`. */
export async function countBackends(prefix: string): Promise<number> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE $1",
      [`${prefix}%`],
    );
    return Number(rows[0]?.n ?? 0);
  });
}

/** Runs `work` over `items` with at most `concurrency` in flight; results keep the input order. */
export async function mapConcurrent<T, R>(
  items: readonly T[],
  concurrency: number,
  work: (item: T, index: number) => Promise<R>,
): Promise<R[]> {
  const results = new Array<R>(items.length);
  let next = 0;
  async function worker(): Promise<void> {
    while (next < items.length) {
      const index = next++;
      results[index] = await work(items[index] as T, index);
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, items.length) }, worker));
  return results;
}

/**
 * Polls `probe` until `done` accepts its value, at most `attempts` times `intervalMs` apart, and
 * returns the last value either way: the caller asserts on it, so a timeout fails with the evidence.
 */
export async function pollUntil<T>(
  probe: () => Promise<T>,
  done: (value: T) => boolean,
  { attempts = 40, intervalMs = 250 }: { attempts?: number; intervalMs?: number } = {},
): Promise<T> {
  let value = await probe();
  for (let attempt = 1; attempt < attempts && !done(value); attempt++) {
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
    value = await probe();
  }
  return value;
}

/** Sends a raw `/sql` request the way the Neon driver does. */
export function sqlRequest(
  connectionString: string | null,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Response> {
  const all = new Headers(headers);
  if (connectionString !== null) all.set("Neon-Connection-String", connectionString);
  all.set("Neon-Raw-Text-Output", "true");
  all.set("Neon-Array-Mode", "true");
  all.set("content-type", "application/json");
  return lessor("/sql", {
    method: "POST",
    headers: all,
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

/** The runtime half of `GET /v1/tenants/:id`. */
export interface RuntimeStatus {
  state: string;
  generation: number;
  poolSize: number | null;
  leases: number;
  pendingEvents: number;
}

export async function runtimeOf(id: string): Promise<RuntimeStatus> {
  const response = await admin(`/v1/tenants/${id}`);
  if (response.status !== 200) throw new Error(`status ${id}: ${response.status} ${await response.text()}`);
  return (await response.json<{ runtime: RuntimeStatus }>()).runtime;
}

export interface LifecycleEvent {
  seq: number;
  generation: number;
  from: string;
  to: string;
  reason: string;
  at: string;
}

/** Every lifecycle event of a tenant in the control plane, oldest first (walks the pages). */
export async function eventsOf(id: string): Promise<LifecycleEvent[]> {
  const events: LifecycleEvent[] = [];
  let cursor: string | null = null;
  for (let page = 0; page < 50; page++) {
    const query: string = cursor === null ? "?limit=200" : `?limit=200&cursor=${cursor}`;
    const response = await admin(`/v1/tenants/${id}/events${query}`);
    if (response.status !== 200) throw new Error(`events ${id}: ${response.status} ${await response.text()}`);
    const body = await response.json<{ events: LifecycleEvent[]; nextCursor: string | null }>();
    events.push(...body.events);
    cursor = body.nextCursor;
    if (cursor === null) break;
  }
  return events.sort((a, b) => a.seq - b.seq);
}

/** The generations the control-plane ledger records for a tenant, ascending. */
export function ledgerGenerations(id: string): Promise<number[]> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT generation FROM generation_ledger WHERE tenant_id = $1 ORDER BY generation",
      [id],
    );
    return rows.map((row: { generation: number }) => Number(row.generation));
  }, "lessor");
}

/** application_name of every backend of a tenant's pools (`lessor:<role>:<generation>`), one per backend. */
export function tenantBackends(tenant: { role: string }): Promise<string[]> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT application_name FROM pg_stat_activity WHERE starts_with(application_name, $1) ORDER BY 1",
      [appPrefix(tenant)],
    );
    return rows.map((row: { application_name: string }) => row.application_name);
  });
}
