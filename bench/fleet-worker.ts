/**
 * The fleet benchmark's Worker (`npm run bench:fleet`): the bench Worker (Lessor unchanged, plus the
 * `/bench/*` routes, which the bench uses to find the Worker's own workerd) with Lessor's scheduled
 * handler, so that `wrangler dev --test-scheduled` can fire Lessor's cron jobs through /__scheduled.
 */
import lessor from "./lessor-entry.js";
import bench from "./worker.ts";

// Every Durable Object class the bench Worker exports (Lessor's and BareObject).
export * from "./worker.ts";

/** Lessor's scheduled handler, which lessor-entry.d.ts leaves out (the other benches do not use it). */
const lessorScheduled = (
  lessor as unknown as { scheduled(controller: unknown, env: unknown, ctx: unknown): Promise<void> }
).scheduled;

export default {
  fetch: bench.fetch,
  scheduled(controller: unknown, env: unknown, ctx: unknown): Promise<void> {
    return lessorScheduled(controller, env, ctx);
  },
};
