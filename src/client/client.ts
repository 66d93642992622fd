/**
 * `createClient`: the Neon driver's `neon()`, pointed at Lessor, with Lessor's refusals as typed
 * errors, bounded retries of the retryable ones, and session leases.
 */
import { type HTTPTransactionOptions, type NeonQueryFunction, neon } from "@neondatabase/serverless";
import { type Lease, type LeaseOptions, openLease } from "./lease.ts";
import { type Clock, defaultRetryOptions, type RetryOptions, systemClock } from "./retry.ts";
import {
  type FetchFunction,
  guardQueryFunction,
  installDispatcher,
  type SendSettings,
  send,
  type Transport,
  transportKey,
} from "./transport.ts";

/** Options of `createClient`: the `neon()` options, plus where Lessor is and how to retry. */
export interface LessorClientOptions<ArrayMode extends boolean = false, FullResults extends boolean = false>
  extends HTTPTransactionOptions<ArrayMode, FullResults> {
  /**
   * Lessor's base URL (`http://127.0.0.1:8787`, `https://lessor.example.com`). Default: the host and
   * port the connection string names (Lessor writes its own address there), over `http` for a
   * loopback host and `https` for any other.
   */
  url?: string;
  /** The `fetch` to send with (default: the global `fetch`, looked up at each request). */
  fetch?: FetchFunction;
  /** Retry bounds; unset fields keep `defaultRetryOptions`. `{ maxAttempts: 1 }` turns retries off. */
  retry?: Partial<RetryOptions>;
  /** Time for the retry waits; tests pass a fake one. */
  clock?: Clock;
  /** Source of jitter in [0, 1) (default `Math.random`); tests pass a fixed one. */
  random?: () => number;
}

/** A tenant's connection to Lessor. */
export interface LessorClient<ArrayMode extends boolean = false, FullResults extends boolean = false> {
  /**
   * The Neon driver's query function (`` sql`…` ``, `sql.query()`, `sql.transaction()`), usable
   * wherever `neon()`'s is, drizzle's `neon-http` included. Lessor's refusals reject with a
   * `LessorResponseError`; Postgres errors stay the driver's `NeonDbError`.
   */
  readonly sql: NeonQueryFunction<ArrayMode, FullResults>;
  /** The tenant the connection string names. */
  readonly tenantId: string;
  /** Opens a session lease: one connection held across requests, for interactive transactions. */
  lease(options?: LeaseOptions): Promise<Lease>;
}

/**
 * A client for the tenant of `connectionString` (`postgres://<tenant>:<key>@<host>/<tenant>`, as
 * `POST /v1/tenants` returns it). Works in Workers and Node: it needs only `fetch`.
 *
 * The Neon driver has no per-client fetch function, so the first client installs one on
 * `neonConfig.fetchFunction` that serves clients made here and passes every other request to the
 * function set before it (or `fetch`). `neonConfig.fetchEndpoint` is not used: each client sends to
 * its own `url`.
 */
export function createClient<ArrayMode extends boolean = false, FullResults extends boolean = false>(
  connectionString: string,
  options: LessorClientOptions<ArrayMode, FullResults> = {},
): LessorClient<ArrayMode, FullResults> {
  const { url, fetch: fetchFunction, retry, clock, random, ...driverOptions } = options;
  const { tenantId, key, host } = parseConnectionString(connectionString);
  const baseUrl = (url ?? defaultBaseUrl(host)).replace(/\/+$/, "");
  const settings: SendSettings = {
    fetch: fetchFunction ?? ((target, init) => fetch(target, init)),
    retry: { ...defaultRetryOptions, ...retry },
    clock: clock ?? systemClock,
    random: random ?? Math.random,
  };
  const transport: Transport = (init) => send(`${baseUrl}/sql`, init, settings, false);
  installDispatcher();
  const sql = guardQueryFunction(
    neon<ArrayMode, FullResults>(connectionString, {
      ...driverOptions,
      fetchOptions: { ...driverOptions.fetchOptions, [transportKey]: transport },
    }),
  );
  return {
    sql,
    tenantId,
    lease: (leaseOptions) =>
      openLease(
        {
          baseUrl,
          tenantId,
          key,
          connectionString,
          settings,
          driverOptions: {
            types: driverOptions.types,
            disableWarningInBrowsers: driverOptions.disableWarningInBrowsers,
          },
        },
        leaseOptions,
      ),
  };
}

/**
 * The tenant, its key and Lessor's host:port from a Lessor connection string. The error never
 * repeats the string: it carries the key.
 */
export function parseConnectionString(connectionString: string): {
  tenantId: string;
  key: string;
  host: string;
} {
  const malformed = () =>
    new TypeError(
      "A Lessor connection string is postgres://<tenant>:<tenant key>@<host>/<tenant>, as POST /v1/tenants returns it.",
    );
  const scheme = /^postgres(?:ql)?:\/\//i.exec(connectionString);
  if (!scheme) throw malformed();
  let parts: { tenantId: string; key: string; host: string };
  try {
    // Parsed as http: so that the URL parser splits user, password, host and path.
    const parsed = new URL(`http://${connectionString.slice(scheme[0].length)}`);
    parts = {
      tenantId: decodeURIComponent(parsed.username),
      key: decodeURIComponent(parsed.password),
      host: parsed.host,
    };
  } catch {
    throw malformed();
  }
  if (parts.tenantId === "" || parts.key === "" || parts.host === "") throw malformed();
  return parts;
}

/** `http` only where nothing leaves the machine; a key must not cross a network in the clear. */
function defaultBaseUrl(host: string): string {
  const hostname = host.replace(/:\d*$/, "");
  const loopback = hostname === "localhost" || hostname === "[::1]" || /^127(?:\.\d{1,3}){3}$/.test(hostname);
  return `${loopback ? "http" : "https"}://${host}`;
}
