/** The HTTP surface: routes, limits and the one place errors become answers. */
import { Hono, type MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import { HTTPException } from "hono/http-exception";
import { loadConfig } from "./config/index.ts";
import { describeFailure, durableObjectFailure, errorHeaders, LessorError } from "./errors/index.ts";
import { logEvent, logEventSampled } from "./log/index.ts";
import { auditRoutes } from "./routes/audit.ts";
import { campaignRoutes } from "./routes/campaigns.ts";
import { capacityRoutes } from "./routes/capacity.ts";
import type { AppEnv } from "./routes/context.ts";
import { credentialRoutes } from "./routes/credentials.ts";
import { eraseRoutes } from "./routes/erase.ts";
import { fleetRoutes } from "./routes/fleet.ts";
import { jwtRoutes } from "./routes/jwt.ts";
import { keyRoutes } from "./routes/keys.ts";
import { leaseRoutes } from "./routes/leases.ts";
import { maintenanceRoutes } from "./routes/maintenance.ts";
import { metricsRoutes } from "./routes/metrics.ts";
import { moveRoutes } from "./routes/moves.ts";
import { sqlRoutes } from "./routes/sql.ts";
import { statusPageRoutes } from "./routes/status-page.ts";
import { tenantRoutes } from "./routes/tenants.ts";
import { usageRoutes } from "./routes/usage.ts";
import { wireRoutes } from "./routes/wire.ts";

export const app = new Hono<AppEnv>();

/** One body-limit middleware per configuration (the env object is stable within an isolate). */
const bodyLimits = new WeakMap<object, MiddlewareHandler<AppEnv>>();
app.use("*", (c, next) => {
  let limit = bodyLimits.get(c.env);
  if (!limit) {
    const maxBytes = loadConfig(c.env).maxBodyBytes;
    limit = bodyLimit({
      maxSize: maxBytes,
      onError: () => {
        throw new LessorError("payload_too_large", {
          publicMessage: `The request body is larger than ${maxBytes} bytes (LESSOR_MAX_BODY_BYTES).`,
        });
      },
    });
    bodyLimits.set(c.env, limit);
  }
  return limit(c, next);
});

app.get("/", (c) => c.json({ service: "lessor", sql: "/sql", wire: "/v2", api: "/v1" }));
app.route("/", sqlRoutes);
app.route("/", wireRoutes);
app.route("/", usageRoutes);
app.route("/", maintenanceRoutes);
app.route("/", tenantRoutes);
app.route("/", eraseRoutes);
app.route("/", moveRoutes);
app.route("/", auditRoutes);
app.route("/", leaseRoutes);
app.route("/", keyRoutes);
app.route("/", credentialRoutes);
app.route("/", jwtRoutes);
app.route("/", capacityRoutes);
app.route("/", campaignRoutes);
app.route("/", fleetRoutes);
app.route("/", metricsRoutes);
app.route("/", statusPageRoutes);

app.notFound(() => {
  throw new LessorError("not_found");
});

app.onError((error, c) => {
  if (error instanceof LessorError) {
    if (error.status >= 500 && !error.retryAfterSeconds) {
      logEvent("error", "request_failed", {
        code: error.code,
        failure: describeFailure(error),
        ...(error.cause === undefined ? {} : { cause: describeFailure(error.cause) }),
      });
    }
    return c.json(error.body(), error.status, errorHeaders(error));
  }
  if (error instanceof HTTPException) {
    // Hono's own refusals (bearer auth) already carry a JSON body in our shape.
    return error.getResponse();
  }
  const objectFailure = durableObjectFailure(error);
  if (objectFailure) {
    // An object reset mid-request (a deploy, a crash) or unreachable: retryable, not a bug.
    // A deploy resets every object at once: one line a kind per window, with the count left out.
    logEventSampled("warn", "object_unavailable", objectFailure, {
      path: c.req.path,
      kind: objectFailure,
      failure: describeFailure(error),
    });
    const unavailable = new LessorError("object_unavailable", {
      cause: error,
      retryAfterSeconds: objectFailure === "overloaded" ? 5 : 1,
    });
    return c.json(unavailable.body(), 503, errorHeaders(unavailable));
  }
  logEvent("error", "unhandled_error", { path: c.req.path, failure: describeFailure(error) });
  const internal = new LessorError("internal");
  return c.json(internal.body(), 500);
});
