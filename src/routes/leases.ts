/**
 * Session leases: an interactive transaction across requests. A lease is one pinned connection of
 * the tenant's current generation; only the owning tenant's key can use or release it.
 *
 *     POST   /v1/tenants/:id/leases   {"ttlMs": 30000}   → {lease, generation, expiresAt}
 *     POST   /v1/leases/:lease/sql    {"query", "params"} → the `/sql` result shape
 *     DELETE /v1/leases/:lease
 */
import { Hono } from "hono";
import * as v from "valibot";
import { parseSqlRequest } from "../core/neon-protocol.ts";
import { driverOutputMode } from "../core/result-shape.ts";
import { parseTenantId, type TenantId } from "../core/tenant-id.ts";
import { LessorError } from "../errors/index.ts";
import { sessionTokenPrefix } from "../rpc/tenant.ts";
import { tenantKeyHash } from "./auth.ts";
import { type AppEnv, readJson } from "./context.ts";
import { jsonBody, jsonObject } from "./validation.ts";

export const leaseRoutes = new Hono<AppEnv>();

/** `lsl_<tenant>_<random>`: the tenant part routes the call; the object checks the rest. */
function leaseTenant(token: string): TenantId {
  if (!token.startsWith(sessionTokenPrefix)) throw new LessorError("lease_not_found");
  const rest = token.slice(sessionTokenPrefix.length);
  const cut = rest.indexOf("_");
  const tenantId = cut > 0 ? parseTenantId(rest.slice(0, cut)) : null;
  if (!tenantId || !/^[0-9a-f]{48}$/.test(rest.slice(cut + 1))) throw new LessorError("lease_not_found");
  return tenantId;
}

const openLeaseBody = jsonObject({
  ttlMs: v.optional(
    v.pipe(
      v.number("ttlMs must be a positive number of milliseconds."),
      v.finite("ttlMs must be a positive number of milliseconds."),
      v.gtValue(0, "ttlMs must be a positive number of milliseconds."),
    ),
    30_000,
  ),
});

leaseRoutes.post("/v1/tenants/:id/leases", jsonBody(openLeaseBody), async (c) => {
  const tenantId = parseTenantId(c.req.param("id"));
  if (!tenantId) throw new LessorError("invalid_tenant_id");
  const keyHash = await tenantKeyHash(c);
  const { ttlMs } = c.req.valid("json");
  const opened = await c.env.TENANTS.getByName(tenantId).openSession(tenantId, keyHash, ttlMs);
  if (!opened.ok) throw notFoundIfUnauthenticated(opened.error);
  return c.json({ lease: opened.lease, generation: opened.generation, expiresAt: opened.expiresAt }, 201);
});

leaseRoutes.post("/v1/leases/:lease/sql", async (c) => {
  const token = c.req.param("lease");
  const tenantId = leaseTenant(token);
  const keyHash = await tenantKeyHash(c);
  const request = parseSqlRequest(await readJson(c), c.req.raw.headers);
  if ("problem" in request) throw new LessorError("invalid_request", { publicMessage: request.problem });
  if (request.kind !== "single") {
    throw new LessorError("invalid_request", {
      publicMessage: "A lease runs one statement per call; use BEGIN and COMMIT across calls.",
    });
  }
  // Lessor's own route: without Neon's output headers it answers as the driver asks (raw text arrays).
  const headers = c.req.raw.headers;
  const asked = headers.has("Neon-Raw-Text-Output") || headers.has("Neon-Array-Mode");
  const outcome = await c.env.TENANTS.getByName(tenantId).sessionSql(
    tenantId,
    keyHash,
    token,
    request.statement,
    asked ? request.output : driverOutputMode,
  );
  if (outcome.ok) return c.body(outcome.json, 200, { "content-type": "application/json" });
  if ("postgres" in outcome) return c.json(outcome.postgres, 400);
  throw leaseNotFoundIfUnauthenticated(outcome.error);
});

leaseRoutes.delete("/v1/leases/:lease", async (c) => {
  const token = c.req.param("lease");
  const tenantId = leaseTenant(token);
  const keyHash = await tenantKeyHash(c);
  const closed = await c.env.TENANTS.getByName(tenantId).closeSession(tenantId, keyHash, token);
  if (!closed.ok) throw leaseNotFoundIfUnauthenticated(closed.error);
  return c.body(null, 204);
});

/** Another tenant's key looks exactly like an unknown tenant. */
function notFoundIfUnauthenticated(error: Parameters<typeof LessorError.fromWire>[0]): LessorError {
  return error.code === "invalid_credentials"
    ? new LessorError("tenant_not_found")
    : LessorError.fromWire(error);
}

/** Another tenant's key on a lease looks exactly like an unknown lease. */
function leaseNotFoundIfUnauthenticated(error: Parameters<typeof LessorError.fromWire>[0]): LessorError {
  return error.code === "invalid_credentials"
    ? new LessorError("lease_not_found")
    : LessorError.fromWire(error);
}
