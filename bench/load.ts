/**
 * The load generator: a closed loop of `concurrency` workers, each sending its next request as soon
 * as the previous one answers, first for a warmup that is not recorded, then for a bounded duration
 * (or a request cap, whichever comes first). Every request is checked by the caller; an error or a
 * wrong answer is counted, never retried, and fails the run.
 */
import { Agent, request as httpRequest } from "node:http";

/** Latencies and failures of one measured phase. */
export interface LoadResult {
  concurrency: number;
  completed: number;
  errors: number;
  /** The first few failures, for the report. */
  errorSamples: string[];
  elapsedMs: number;
  latenciesMs: number[];
}

export interface LoadSpec {
  concurrency: number;
  warmupMs: number;
  durationMs: number;
  maxRequests: number;
  /** Sends one request and checks its answer; throws on an error or a wrong answer. */
  call: (worker: number, sequence: number) => Promise<void>;
}

async function loop(
  spec: LoadSpec,
  until: number,
  cap: number,
  record: boolean,
  result: LoadResult,
): Promise<void> {
  let started = 0;
  await Promise.all(
    Array.from({ length: spec.concurrency }, async (_, worker) => {
      while (performance.now() < until && started < cap) {
        const sequence = started++;
        const begin = performance.now();
        try {
          await spec.call(worker, sequence);
          if (record) {
            result.latenciesMs.push(performance.now() - begin);
            result.completed++;
          }
        } catch (error) {
          result.errors++;
          if (result.errorSamples.length < 5) {
            result.errorSamples.push(error instanceof Error ? error.message : String(error));
          }
        }
      }
    }),
  );
}

/** Runs the warmup, then the measured phase. `around` brackets the measured phase only. */
export async function runLoad(
  spec: LoadSpec,
  around: { before(): void; after(): void } = { before() {}, after() {} },
): Promise<LoadResult> {
  const result: LoadResult = {
    concurrency: spec.concurrency,
    completed: 0,
    errors: 0,
    errorSamples: [],
    elapsedMs: 0,
    latenciesMs: [],
  };
  await loop(spec, performance.now() + spec.warmupMs, Number.POSITIVE_INFINITY, false, result);
  around.before();
  const begin = performance.now();
  await loop(spec, begin + spec.durationMs, spec.maxRequests, true, result);
  result.elapsedMs = performance.now() - begin;
  around.after();
  return result;
}

/** Nearest-rank percentile of unsorted values (0 when there are none). */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.min(sorted.length, Math.max(1, Math.ceil((p / 100) * sorted.length)));
  return sorted[rank - 1] ?? 0;
}

/**
 * Sends `count` requests at `concurrency`, with no warmup and no time limit (a closed loop, as
 * `runLoad`), and fails the run if any of them failed: for the benches that measure a fixed number
 * of checked requests per cell, where one wrong answer means the figures are not results.
 */
export async function runRequests(
  count: number,
  concurrency: number,
  call: (sequence: number) => Promise<void>,
): Promise<LoadResult> {
  const result = await runLoad({
    concurrency,
    warmupMs: 0,
    durationMs: Number.POSITIVE_INFINITY,
    maxRequests: count,
    call: (_worker, sequence) => call(sequence),
  });
  if (result.errors > 0) {
    throw new Error(`${result.errors} of ${count} requests failed: ${result.errorSamples.join("; ")}`);
  }
  return result;
}

/** One cell of a fixed-count bench: requests, wall seconds, throughput and latency percentiles. */
export interface CountedCell {
  requests: number;
  seconds: number;
  requestsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
}

/** Sums the runs of one cell (interleaved rounds) into its figures; 0 req/s when no time passed. */
export function countedCell(runs: readonly Pick<LoadResult, "elapsedMs" | "latenciesMs">[]): CountedCell {
  const latencies = runs.flatMap((run) => run.latenciesMs);
  const seconds = runs.reduce((sum, run) => sum + run.elapsedMs, 0) / 1000;
  return {
    requests: latencies.length,
    seconds,
    requestsPerSecond: seconds > 0 ? latencies.length / seconds : 0,
    p50Ms: percentile(latencies, 50),
    p99Ms: percentile(latencies, 99),
  };
}

// ── HTTP transport ───────────────────────────────────────────────────────────────────────────────

/** Keep-alive connections, as many as the concurrency needs. */
const agent = new Agent({ keepAlive: true, maxSockets: Number.POSITIVE_INFINITY, maxFreeSockets: 1100 });
/**
 * A new connection per request, for the bursts of the cold-start storm: a first request comes on a
 * connection of its own, and a thousand idle keep-alive sockets left over from one burst would race
 * the server closing them when the next burst reuses them ("socket hang up").
 */
const burstAgent = new Agent({ keepAlive: false, maxSockets: Number.POSITIVE_INFINITY });

/** No request waits longer than this, whatever the server does. */
export const requestTimeoutMs = 30_000;

/**
 * A small `fetch` over node:http, for `neonConfig.fetchFunction` and the bench's own requests.
 *
 * Why not Node's global fetch: on loopback its client work (undici, plus decoding the gzip that
 * workerd applies when the client accepts it) costs several times what node:http costs, and on a
 * two-core machine that CPU is taken from the server being measured. It asks for no compression.
 * run.ts measures the difference on the floor path, so it is reported, not hidden.
 */
export function lightFetch(url: string, init: FetchInit = {}): Promise<Response> {
  return send(agent, url, init);
}

/** `lightFetch` on a new connection per request (see `burstAgent`). */
export function burstFetch(url: string, init: FetchInit = {}): Promise<Response> {
  return send(burstAgent, url, init);
}

interface FetchInit {
  method?: string;
  body?: string;
  headers?: Record<string, string>;
}

function send(via: Agent, url: string, init: FetchInit): Promise<Response> {
  return new Promise((resolve, reject) => {
    const body = init.body ?? "";
    const request = httpRequest(
      url,
      {
        method: init.method ?? "GET",
        agent: via,
        timeout: requestTimeoutMs,
        headers: {
          ...init.headers,
          "accept-encoding": "identity",
          ...(init.body === undefined ? {} : { "content-length": Buffer.byteLength(body) }),
        },
      },
      (response) => {
        const chunks: Buffer[] = [];
        response.on("data", (chunk: Buffer) => chunks.push(chunk));
        response.on("error", reject);
        response.on("end", () => {
          resolve(
            // A Response with a null-body status (204 …) must have no body, not even an empty one.
            new Response(
              [101, 204, 205, 304].includes(response.statusCode ?? 500) ? null : Buffer.concat(chunks),
              {
                status: response.statusCode ?? 500,
                headers: {
                  "content-type": String(response.headers["content-type"] ?? "text/plain"),
                  // Kept for the admission phase, which checks that refusals carry a retry hint.
                  ...(response.headers["retry-after"] === undefined
                    ? {}
                    : { "retry-after": String(response.headers["retry-after"]) }),
                },
              },
            ),
          );
        });
      },
    );
    request.on("timeout", () => request.destroy(new Error(`no answer within ${requestTimeoutMs} ms`)));
    request.on("error", reject);
    request.end(init.body === undefined ? undefined : body);
  });
}

/** Closes the idle keep-alive connections (at the end of a run). */
export function closeConnections(): void {
  agent.destroy();
  burstAgent.destroy();
}
