/**
 * A tenant's end-user JWT mode (admin key; docs/adr/012-end-user-jwts.md):
 *
 *     PUT    /v1/tenants/:id/jwt   {issuer, audience, jwks | jwksUrl, role?, algorithms?, clockSkewSeconds?} → 200 {jwt}
 *     GET    /v1/tenants/:id/jwt   → 200 {jwt} | 404 jwt_not_configured
 *     DELETE /v1/tenants/:id/jwt   → 204
 */
import { Hono } from "hono";
import * as v from "valibot";
import { loadConfig } from "../config/index.ts";
import {
  defaultClockSkewSeconds,
  defaultJwtAlgorithms,
  defaultJwtRole,
  type JsonWebKeySetRecord,
  type JwtConfig,
  jwksProblem,
  jwksUrlProblem,
  jwtAlgorithms,
  jwtRoleProblem,
  maxClockSkewSeconds,
} from "../core/jwt-config.ts";
import { parseTenantId, type TenantId } from "../core/tenant-id.ts";
import { LessorError } from "../errors/index.ts";
import { getTenantJwt, removeTenantJwt, setTenantJwt } from "../provisioning/jwt.ts";
import { requireAdmin } from "./auth.ts";
import { type AppContext, type AppEnv, regionParam } from "./context.ts";
import { jsonBody, jsonObject } from "./validation.ts";

export const jwtRoutes = new Hono<AppEnv>();

function tenantParam(c: AppContext): TenantId {
  const id = parseTenantId(c.req.param("id"));
  if (!id) throw new LessorError("invalid_tenant_id");
  return id;
}

const nonEmpty = (field: string) =>
  v.pipe(
    v.string(`${field} must be a string.`),
    v.minLength(1, `${field} must not be empty.`),
    v.maxLength(1024),
  );

const jwtBody = jsonObject({
  issuer: nonEmpty("issuer"),
  audience: v.union(
    [nonEmpty("audience"), v.pipe(v.array(nonEmpty("audience")), v.minLength(1), v.maxLength(16))],
    "audience must be a string or a list of 1 to 16 strings.",
  ),
  jwks: v.optional(v.unknown()),
  jwksUrl: v.optional(nonEmpty("jwksUrl")),
  role: v.optional(v.string("role must be a string."), defaultJwtRole),
  algorithms: v.optional(
    v.pipe(
      v.array(v.picklist(jwtAlgorithms, `algorithms may hold only ${jwtAlgorithms.join(", ")}.`)),
      v.minLength(1, "algorithms must name at least one algorithm."),
    ),
  ),
  clockSkewSeconds: v.optional(
    v.pipe(
      v.number("clockSkewSeconds must be a number."),
      v.integer("clockSkewSeconds must be an integer."),
      v.minValue(0, "clockSkewSeconds must not be negative."),
      v.maxValue(maxClockSkewSeconds, `clockSkewSeconds is at most ${maxClockSkewSeconds}.`),
    ),
  ),
});

function invalid(message: string): LessorError {
  return new LessorError("invalid_request", { publicMessage: message });
}

jwtRoutes.put("/v1/tenants/:id/jwt", requireAdmin, jsonBody(jwtBody), async (c) => {
  const tenantId = tenantParam(c);
  const body = c.req.valid("json");
  if ((body.jwks === undefined) === (body.jwksUrl === undefined)) {
    throw invalid("Send exactly one of jwks (a static key set) and jwksUrl.");
  }
  const keysProblem = body.jwks !== undefined ? jwksProblem(body.jwks) : jwksUrlProblem(body.jwksUrl ?? "");
  if (keysProblem) throw invalid(keysProblem);
  const roleProblem = jwtRoleProblem(body.role);
  if (roleProblem) throw invalid(roleProblem);
  const config: JwtConfig = {
    issuer: body.issuer,
    audiences: typeof body.audience === "string" ? [body.audience] : [...new Set(body.audience)],
    jwks: body.jwks === undefined ? null : (body.jwks as JsonWebKeySetRecord),
    jwksUrl: body.jwksUrl ?? null,
    role: body.role,
    algorithms: [...new Set(body.algorithms ?? defaultJwtAlgorithms)],
    clockSkewSeconds: body.clockSkewSeconds ?? defaultClockSkewSeconds,
  };
  const stored = await setTenantJwt(c.env, loadConfig(c.env), regionParam(c), tenantId, config);
  return c.json({ jwt: stored });
});

jwtRoutes.get("/v1/tenants/:id/jwt", requireAdmin, async (c) => {
  const jwt = await getTenantJwt(c.env, loadConfig(c.env), regionParam(c), tenantParam(c));
  if (!jwt) {
    return c.json(
      { code: "jwt_not_configured", message: "This tenant has no end-user JWT configuration." },
      404,
    );
  }
  return c.json({ jwt });
});

jwtRoutes.delete("/v1/tenants/:id/jwt", requireAdmin, async (c) => {
  await removeTenantJwt(c.env, loadConfig(c.env), regionParam(c), tenantParam(c));
  return c.body(null, 204);
});
