import { localStackSetup } from "./global-setup.ts";

/** The second half of the workerd integration files, on a Postgres of its own (test/run.ts). */
export const { setup, teardown } = localStackSetup("main-2");
