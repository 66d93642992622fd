import { localStackSetup } from "../global-setup.ts";

export const { setup, teardown } = localStackSetup("pg-restart");
