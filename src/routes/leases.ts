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
import { LessorError, type WireError } from "../errors/index.ts";
import { callOwner } from "../placement/moves.ts";
import {
  type KeyProof,
  type SessionOpened,
  type SqlOutcome,
  sessionTokenPrefix,
  type Verdict,
} from "../rpc/tenant.ts";
import { bearerToken, countFailedAuthentication, proveTenantKey } from "./auth.ts";
import { type AppContext, type AppEnv, readJson } from "./context.ts";
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

/** The caller's tenant key, checked at the edge: a forged or foreign key never reaches the object. */
async function leaseProof(c: AppContext, tenantId: TenantId): Promise<KeyProof> {
  const proof = await proveTenantKey(c, tenantId, bearerToken(c));
  if (!proof) throw new LessorError("invalid_credentials");
  return proof;
}

/** An object's refusal; a key it does not accept (revoked, expired) counts as a failed authentication. */
async function refusal(c: AppContext, tenantId: TenantId, error: WireError): Promise<LessorError> {
  if (error.code === "invalid_credentials") await countFailedAuthentication(c, tenantId);
  return LessorError.fromWire(error);
}

leaseRoutes.post("/v1/tenants/:id/leases", jsonBody(openLeaseBody), async (c) => {
  const tenantId = parseTenantId(c.req.param("id"));
  if (!tenantId) throw new LessorError("invalid_tenant_id");
  const proof = await leaseProof(c, tenantId);
  const { ttlMs } = c.req.valid("json");
  const { answer: opened } = await callOwner<SessionOpened>(c.env, tenantId, proof, async (object, owner) =>
    object.openSession(tenantId, owner, ttlMs),
  );
  if (!opened.ok) throw await refusal(c, tenantId, opened.error);
  return c.json({ lease: opened.lease, generation: opened.generation, expiresAt: opened.expiresAt }, 201);
});

leaseRoutes.post("/v1/leases/:lease/sql", async (c) => {
  const token = c.req.param("lease");
  const tenantId = leaseTenant(token);
  const proof = await leaseProof(c, tenantId);
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
  const { answer: outcome } = await callOwner<SqlOutcome>(c.env, tenantId, proof, async (object, owner) =>
    object.sessionSql(tenantId, owner, token, request.statement, asked ? request.output : driverOutputMode),
  );
  if (outcome.ok) return c.body(outcome.json, 200, { "content-type": "application/json" });
  if ("postgres" in outcome) return c.json(outcome.postgres, 400);
  throw await refusal(c, tenantId, outcome.error);
});

leaseRoutes.delete("/v1/leases/:lease", async (c) => {
  const token = c.req.param("lease");
  const tenantId = leaseTenant(token);
  const proof = await leaseProof(c, tenantId);
  const { answer: closed } = await callOwner<Verdict>(c.env, tenantId, proof, async (object, owner) =>
    object.closeSession(tenantId, owner, token),
  );
  if (!closed.ok) throw await refusal(c, tenantId, closed.error);
  return c.body(null, 204);
});
