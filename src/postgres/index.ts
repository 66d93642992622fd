/**
 * The one place Lessor configures the Neon serverless driver and opens Postgres connections.
 *
 * In production the driver reaches Neon over its secure WebSocket endpoint with the defaults.
 * Locally `LESSOR_WS_PROXY` points at the loopback WebSocket-to-TCP proxy: plain `ws://`, and no
 * pipelining (pipelined "password" connect breaks SCRAM against a vanilla Postgres).
 */
import { Client, neonConfig, Pool } from "@neondatabase/serverless";
import type { LessorConfig } from "../config/index.ts";

let configuredProxy: string | null | undefined;

/** Applies the WebSocket settings for this deployment (idempotent, per isolate). */
export function configureDriver(config: LessorConfig): void {
  if (configuredProxy === config.wsProxy) return;
  configuredProxy = config.wsProxy;
  if (config.wsProxy) {
    const proxy = config.wsProxy;
    neonConfig.wsProxy = (host, port) => `${proxy}/v2?address=${host}:${port}`;
    neonConfig.useSecureWebSocket = false;
    neonConfig.pipelineTLS = false;
    neonConfig.pipelineConnect = false;
  }
}

export type { Queryable } from "./queryable.ts";

export interface ConnectionTarget {
  host: string;
  port: number;
  user: string;
  password: string;
  database: string;
}

/** A pool for one tenant generation. Its errors are reported, never thrown into the isolate. */
export function openPool(
  config: LessorConfig,
  target: ConnectionTarget,
  options: { max: number; applicationName: string; onError: (error: Error) => void },
): Pool {
  configureDriver(config);
  const pool = new Pool({
    ...target,
    max: options.max,
    // A pooled connection lives as long as its generation; the TenantObject decides when it ends.
    idleTimeoutMillis: 0,
    connectionTimeoutMillis: 10_000,
    application_name: options.applicationName,
  });
  pool.on("error", options.onError);
  return pool;
}

/**
 * Runs `work` on a fresh connection and always closes it. For control-plane and provisioning work,
 * never for a tenant's queries (those go through the tenant's pool).
 */
export async function withConnection<T>(
  config: LessorConfig,
  connectionString: string,
  applicationName: string,
  work: (client: Client) => Promise<T>,
): Promise<T> {
  configureDriver(config);
  const client = new Client({
    connectionString,
    application_name: applicationName,
    connectionTimeoutMillis: 10_000,
  });
  client.on("error", () => undefined);
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end().catch(() => undefined);
  }
}
