/** Lessor's Worker entry: wires fetch and scheduled, and exports the Durable Object classes. */

import { app } from "./app.ts";
import { runScheduled } from "./cron/index.ts";
import { guardConsole } from "./log/console-guard.ts";

// Before anything runs: whatever any code in the isolate prints goes out as text without secrets.
guardConsole();

export { BudgetObject } from "./budget-object/index.ts";
export { ControlPlaneObject } from "./control-plane-object/index.ts";
export { TenantObject } from "./tenant-object/index.ts";
export { WireCancelObject } from "./wire-cancel-object/index.ts";

export default {
  fetch: app.fetch,
  async scheduled(controller, env, ctx) {
    // The jobs run under ctx.waitUntil; nothing to wait for here.
    void runScheduled(controller, env, ctx);
  },
} satisfies ExportedHandler<Env>;
