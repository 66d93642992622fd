/** Lessor's Worker entry: wires fetch and scheduled, and exports the Durable Object classes. */
import { app } from "./app.ts";

export { BudgetObject } from "./budget-object/index.ts";
export { TenantObject } from "./tenant-object/index.ts";

export default {
  fetch: app.fetch,
  async scheduled() {
    // Cron fan-out lands with the maintenance issues; the trigger is declared so it can be tested.
  },
} satisfies ExportedHandler<Env>;
