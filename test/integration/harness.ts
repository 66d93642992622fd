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
}

export async function createTenant(id: string, extra: Record<string, unknown> = {}): Promise<CreatedTenant> {
  const response = await admin("/v1/tenants", { method: "POST", json: { id, ...extra } });
  if (response.status !== 201) throw new Error(`create ${id}: ${response.status} ${await response.text()}`);
  const body = await response.json<{ key: string; connectionString: string }>();
  return { id, key: body.key, connectionString: body.connectionString };
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
