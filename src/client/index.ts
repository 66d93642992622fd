/**
 * `lessor/client`: a small typed client for apps that reach Lessor with the Neon serverless driver.
 * The driver stays the engine; this adds Lessor's refusals as typed errors, bounded retries of the
 * retryable ones, and session leases. Needs only `fetch`: runs in Workers and Node.
 *
 *     import { createClient } from "lessor/client";
 *     const { sql, lease } = createClient(process.env.LESSOR_CONNECTION_STRING);
 */
export {
  createClient,
  type LessorClient,
  type LessorClientOptions,
  parseConnectionString,
} from "./client.ts";
export { type ErrorAnswer, LessorResponseError } from "./errors.ts";
export type { Lease, LeaseOptions, LeaseQueries, LeaseTransactionOptions } from "./lease.ts";
export { type Clock, defaultRetryOptions, type RetryOptions } from "./retry.ts";
export type { FetchFunction } from "./transport.ts";
