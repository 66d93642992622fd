import { localStackSetup } from "../global-setup.ts";

/**
 * Its own Postgres with two regions: the default region's control plane reached as 127.0.0.3, the
 * `eu` region's as 127.0.0.2, so that either can be cut off alone while the tenant databases stay
 * reachable as 127.0.0.1.
 */
export const { setup, teardown } = localStackSetup("regions", {
  controlPlaneAddress: "127.0.0.3",
  regions: true,
});
