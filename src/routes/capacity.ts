/**
 * `GET /v1/capacity?region=` (admin): per host of the region (the default region without it), the
 * budget and what holds it; and per customer tunnel (`tunnels`, docs/customer-databases.md), the
 * same apart from every host, with the tunnel's health. A tunnel's tenants are the default region's
 * (docs/adr/023-regions.md), so tunnels are listed with the default region only. The answer names
 * its region. Never lists every tenant.
 */
import { Hono } from "hono";
import { loadConfig, regionNamed } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { budgetObject } from "../placement/index.ts";
import { hostsTenancy } from "../placement/room.ts";
import { requireAdmin } from "./auth.ts";
import { type AppEnv, regionParam } from "./context.ts";

export const capacityRoutes = new Hono<AppEnv>();

capacityRoutes.get("/v1/capacity", requireAdmin, async (c) => {
  const config = loadConfig(c.env);
  const region = regionNamed(config, regionParam(c));
  const tunnels = region.name === config.defaultRegion ? [...config.tunnels.values()] : [];
  const [hostStatuses, tunnelStatuses] = await Promise.all([
    Promise.all(region.hosts.map((host) => budgetObject(c.env, host).status(host, 5))),
    Promise.all(tunnels.map((tunnel) => budgetObject(c.env, tunnel.budgetName).status(tunnel.budgetName, 5))),
  ]);
  // Room in tenants, from the catalog (one grouped read); the budgets answer without it.
  const tenancy = await withControlPlane(config, c.env, region.name, (db) =>
    hostsTenancy(db, config, region.hosts),
  ).catch(() => null);
  // Each host's connection path and TLS (docs/adr/027), from configuration: a weaker mode (sslmode
  // disable, loopback only) or the local-only WebSocket path shows here, knowingly.
  const hosts = hostStatuses.map((status) => {
    const room = tenancy?.get(status.host);
    const path = config.hosts.get(status.host)?.path;
    return {
      ...status,
      ...(path ? { connection: { path: path.path, sslmode: path.sslmode } } : {}),
      ...(room ? { tenancy: room } : {}),
    };
  });
  return c.json({ region: region.name, hosts, tunnels: tunnelStatuses });
});
