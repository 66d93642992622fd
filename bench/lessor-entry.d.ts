/**
 * Types of bench/lessor-entry.js: the part of Lessor's Worker entry (src/index.ts) that the bench
 * Worker uses. Kept structural, so that the Node type-check of bench/ needs no Worker types.
 */

/** Lessor's fetch handler (Hono's `app.fetch`). */
declare const lessor: {
  fetch(request: Request, env: unknown, ctx: unknown): Response | Promise<Response>;
};
export default lessor;

type DurableObjectClass = abstract new (...args: never[]) => object;

/** Lessor's per-tenant Durable Object. */
export declare const TenantObject: DurableObjectClass;
/** Lessor's per-host connection budget. */
export declare const BudgetObject: DurableObjectClass;
