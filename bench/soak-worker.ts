/**
 * The chaos soak's Worker (`npm run soak`): the fleet bench Worker (Lessor unchanged, the `/bench/*`
 * routes, Lessor's scheduled handler for `wrangler dev --test-scheduled`) with two hooks a soak
 * needs and a deployment never has:
 *
 * - `POST /bench/soak/abort?tenant=<id>` kills that tenant's Durable Object the way a crash or a
 *   deploy does (`ctx.abort()`, what the tests do through `runInDurableObject`): its memory and its
 *   in-flight work are gone, its storage stays, and the next request builds a new instance.
 * - `GET /bench/soak/build` answers the build number below. The soak reloads the Worker (every
 *   Durable Object and the cron tick in flight die with it) by rewriting that number in its
 *   snapshot of the sources; `wrangler dev` rebuilds, and the new number says the reload is done.
 */

import fleet from "./fleet-worker.ts";
import { TenantObject as LessorTenantObject } from "./lessor-entry.js";

// Every Durable Object class the fleet Worker exports; TenantObject is replaced by the one below.
export * from "./fleet-worker.ts";

/** Rewritten by the soak in its snapshot (`soakBuild = "<n>"`) to make `wrangler dev` reload. */
const soakBuild = "0";

/** Lessor's TenantObject, unchanged, plus a way to kill it. */
export class TenantObject extends LessorTenantObject {
  soakAbort(reason: string): void {
    this.ctx.abort(reason);
  }
}

interface SoakEnv {
  TENANTS: { getByName(name: string): { soakAbort(reason: string): Promise<void> } };
}

export default {
  async fetch(request: Request, env: SoakEnv, ctx: unknown): Promise<Response> {
    const url = new URL(request.url);
    if (url.pathname === "/bench/soak/build") return new Response(soakBuild);
    if (url.pathname === "/bench/soak/abort" && request.method === "POST") {
      const tenant = url.searchParams.get("tenant") ?? "";
      if (!/^[a-z0-9][a-z0-9-]{0,39}$/.test(tenant)) return new Response("bad tenant", { status: 400 });
      // The call rejects with the abort's reason when the kill worked.
      const outcome = await env.TENANTS.getByName(tenant)
        .soakAbort("soak: object killed")
        .then(
          () => "not killed",
          (error: unknown) => String(error),
        );
      return new Response(outcome, { status: outcome.includes("object killed") ? 200 : 500 });
    }
    return fleet.fetch(request, env as never, ctx as never);
  },
  scheduled: fleet.scheduled,
};
