import { localStackSetup } from "./global-setup.ts";

/**
 * The second half of the workerd integration files, on a Postgres of its own (test/run.ts), with a
 * customer's server behind a tunnel for the tunnel tests (test/customer-server.ts).
 */
export const { setup, teardown } = localStackSetup("main-2", { customerServer: true });
