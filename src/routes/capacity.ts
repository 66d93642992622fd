/**
 * `GET /v1/capacity` (admin): per host, the budget and what holds it; and per customer tunnel
 * (`tunnels`, docs/customer-databases.md), the same apart from every host, with the tunnel's health.
 * Never lists every tenant.
 */
import { Hono } from "hono";
import { loadConfig } from "../config/index.ts";
import { budgetObject } from "../placement/index.ts";
import { requireAdmin } from "./auth.ts";
import type { AppEnv } from "./context.ts";

export const capacityRoutes = new Hono<AppEnv>();

capacityRoutes.get("/v1/capacity", requireAdmin, async (c) => {
  const config = loadConfig(c.env);
  const [hosts, tunnels] = await Promise.all([
    Promise.all([...config.hosts.keys()].map((host) => budgetObject(c.env, host).status(host, 5))),
    Promise.all(
      [...config.tunnels.values()].map((tunnel) =>
        budgetObject(c.env, tunnel.budgetName).status(tunnel.budgetName, 5),
      ),
    ),
  ]);
  return c.json({ hosts, tunnels });
});
