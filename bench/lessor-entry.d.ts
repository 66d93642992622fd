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

/**
 * Lessor's per-tenant Durable Object. Declared as a class so a bench Worker can extend it (the soak
 * kills it through `ctx.abort`, bench/soak-worker.ts).
 */
export declare class TenantObject {
  constructor(ctx: unknown, env: unknown);
  protected readonly ctx: { abort(reason?: string): void };
}
/** Lessor's per-host connection budget. */
export declare const BudgetObject: DurableObjectClass;
