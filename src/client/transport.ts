/**
 * How the client's requests reach Lessor. The Neon driver stays the engine: it builds every `/sql`
 * request, encodes the parameters and parses the rows. The client only carries its requests (to its
 * own endpoint, retrying what may be retried) and turns Lessor's refusals into typed errors.
 *
 * The driver has no per-client `fetchFunction` (only the global `neonConfig.fetchFunction`), but it
 * spreads a client's `fetchOptions` into the init it fetches with. So each client puts its transport
 * in its `fetchOptions` under a symbol, and one global dispatcher sends requests that carry one to
 * it; every other request goes to whatever `fetchFunction` was set before, or `fetch`.
 */
import { NeonDbError, type NeonQueryFunction, NeonQueryPromise, neonConfig } from "@neondatabase/serverless";
import { isPostgresError, LessorResponseError, readErrorAnswer } from "./errors.ts";
import { type Clock, decideRetry, type RetryOptions } from "./retry.ts";

/** `fetch` as the client calls it. */
export type FetchFunction = (url: string, init: RequestInit) => Promise<Response>;

/** Sends one driver request (its init: method, headers, body) to Lessor. */
export type Transport = (init: RequestInit) => Promise<Response>;

/** Where a client's transport travels inside the driver's fetch init. Shared by every copy of this module. */
export const transportKey: unique symbol = Symbol.for("lessor.client.transport");

const dispatcherMark = Symbol.for("lessor.client.dispatcher");

/** Everything one send needs besides the request. */
export interface SendSettings {
  fetch: FetchFunction;
  retry: RetryOptions;
  clock: Clock;
  random: () => number;
}

/**
 * Sends a request, and again after each retryable refusal, within the retry bounds. Resolves with a
 * 2xx answer or a Postgres error (a 400 the driver turns into a `NeonDbError`); rejects with a
 * `LessorResponseError` for any other answer. A failure of `fetch` itself is not retried: the
 * request may have arrived.
 */
export async function send(
  url: string,
  init: RequestInit,
  settings: SendSettings,
  onLease: boolean,
): Promise<Response> {
  let waitedMs = 0;
  for (let attempt = 1; ; attempt++) {
    const response = await reach(url, init, settings, attempt);
    if (response.ok) return response;
    const answer = await readErrorAnswer(response, settings.clock.now());
    if (isPostgresError(answer)) {
      return new Response(answer.body, {
        status: answer.status,
        headers: { "content-type": "application/json" },
      });
    }
    // A body that is not a string (a stream) cannot be sent twice.
    const resendable = init.body === undefined || init.body === null || typeof init.body === "string";
    const decision = resendable
      ? decideRetry(answer, { attempt, waitedMs, onLease }, settings.retry, settings.random)
      : { retry: false as const };
    if (!decision.retry) throw new LessorResponseError(answer, attempt);
    await settings.clock.sleep(decision.delayMs, init.signal ?? undefined);
    waitedMs += decision.delayMs;
  }
}

/** Code of a request that got no answer at all: Lessor down, a wrong URL, a network cut. */
export const unreachableCode = "unreachable";

/**
 * `fetch`, with its own failure (a refused connection, an unknown host: the bare `TypeError: fetch
 * failed`) turned into a `LessorResponseError` that says where the client looked, as lessorctl
 * does. An abort stays the caller's own error.
 */
async function reach(
  url: string,
  init: RequestInit,
  settings: SendSettings,
  attempt: number,
): Promise<Response> {
  try {
    return await settings.fetch(url, init);
  } catch (error) {
    if (init.signal?.aborted) throw error;
    const cause =
      error instanceof Error && error.cause instanceof Error ? error.cause.message : String(error);
    throw new LessorResponseError(
      {
        status: 0,
        code: unreachableCode,
        message: `Could not reach Lessor at ${new URL(url).origin} (${cause}). Is it running there? Its URL is the client's url option, or the connection string's host and port.`,
        retryAfter: undefined,
      },
      attempt,
      { cause: error },
    );
  }
}

/**
 * Makes sure `neonConfig.fetchFunction` is the dispatcher, keeping whatever function was there as
 * the route for requests that are not the client's. Called before every query, so a function an app
 * sets later is wrapped too instead of silently bypassing the client.
 */
export function installDispatcher(): void {
  const current: unknown = neonConfig.fetchFunction;
  if (typeof current === "function" && dispatcherMark in current) return;
  const previous = typeof current === "function" ? (current as FetchFunction) : undefined;
  const dispatcher = (url: string, init: RequestInit & { [transportKey]?: Transport }) => {
    const transport = init?.[transportKey];
    if (transport !== undefined) {
      const { [transportKey]: _ours, ...plain } = init;
      return transport(plain);
    }
    return previous ? previous(url, init) : fetch(url, init);
  };
  neonConfig.fetchFunction = Object.assign(dispatcher, { [dispatcherMark]: true });
}

/**
 * The driver wraps an error thrown by the fetch function as `Error connecting to database: …` with
 * the original in `sourceError`; the caller gets the original back.
 */
export function unwrapError(error: unknown): unknown {
  return error instanceof NeonDbError && error.sourceError instanceof LessorResponseError
    ? error.sourceError
    : error;
}

/**
 * `inner`, exactly as the driver made it (drizzle and `transaction([...])` keep working), except that
 * every query first installs the dispatcher and rejects with the client's typed error.
 */
export function guardQueryFunction<ArrayMode extends boolean, FullResults extends boolean>(
  inner: NeonQueryFunction<ArrayMode, FullResults>,
): NeonQueryFunction<ArrayMode, FullResults> {
  return new Proxy(inner, {
    apply: (target, thisArg, args) => guardPromise(Reflect.apply(target, thisArg, args)),
    get: (target, property, receiver) => {
      if (property === "query") {
        return (...args: Parameters<typeof target.query>) => guardPromise(target.query(...args));
      }
      if (property === "transaction") {
        return async (...args: Parameters<typeof target.transaction>) => {
          installDispatcher();
          try {
            return await target.transaction(...args);
          } catch (error) {
            throw unwrapError(error);
          }
        };
      }
      return Reflect.get(target, property, receiver);
    },
  });
}

/**
 * Wraps the promise's `execute` in place: it must stay the driver's own `NeonQueryPromise`, because
 * `transaction([...])` accepts nothing else (and reads only its query, not its `execute`).
 */
function guardPromise<T>(promise: T): T {
  if (promise instanceof NeonQueryPromise) {
    const execute = promise.execute;
    promise.execute = async (...args: Parameters<typeof execute>) => {
      installDispatcher();
      try {
        return await execute(...args);
      } catch (error) {
        throw unwrapError(error);
      }
    };
  }
  return promise;
}
