/**
 * `GET /metrics`: OpenMetrics (or Prometheus text, by `Accept`) for a scraper. It takes the admin
 * key, or `LESSOR_METRICS_KEY` when that is set, so a scraper need not hold the admin key. Every
 * value is read from durable state on each scrape (src/metrics/exposition.ts explains the series).
 */
import { Hono } from "hono";
import { createMiddleware } from "hono/factory";
import { loadConfig } from "../config/index.ts";
import { secretMatches } from "../crypto/keys.ts";
import { LessorError } from "../errors/index.ts";
import { readMetricsReadings } from "../fleet/overview.ts";
import { negotiateFormat, renderMetrics } from "../metrics/exposition.ts";
import { bearerToken } from "./auth.ts";
import type { AppEnv } from "./context.ts";

export const metricsRoutes = new Hono<AppEnv>();

/** The admin key, or the metrics key if one is configured; both compared in constant time. */
const requireMetricsKey = createMiddleware<AppEnv>(async (c, next) => {
  const token = bearerToken(c);
  const keys = [c.env.LESSOR_ADMIN_KEY, c.env.LESSOR_METRICS_KEY].filter(
    (key): key is string => typeof key === "string" && key !== "",
  );
  let ok = false;
  // Every key is compared, so the time taken does not tell which one matched.
  for (const key of keys) if (await secretMatches(token, key)) ok = true;
  if (!ok) throw new LessorError("invalid_credentials", { publicMessage: "Invalid key." });
  await next();
});

metricsRoutes.get("/metrics", requireMetricsKey, async (c) => {
  const config = loadConfig(c.env);
  const readings = await readMetricsReadings(c.env, config);
  const { body, contentType } = await renderMetrics(
    readings,
    config,
    negotiateFormat(c.req.header("Accept")),
  );
  return c.body(body, 200, { "content-type": contentType, "cache-control": "no-store" });
});
