import { localStackSetup } from "../global-setup.ts";

/** Its own Postgres, with the control plane reached as 127.0.0.3 so that it alone can be cut off. */
export const { setup, teardown } = localStackSetup("cp-outage", { controlPlaneAddress: "127.0.0.3" });
