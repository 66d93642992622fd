/**
 * `POST /sql`: the Neon serverless driver's HTTP protocol. The tenant and its key come from the
 * `Neon-Connection-String` header; the key's MAC is checked here, before anything else happens,
 * and the query runs on that tenant's pool, under a lease, in its TenantObject. Nothing here
 * touches the control plane: the hot path opens no connection.
 *
 * Refusals a driver must be able to act on look like Postgres's own (status 400, a SQLSTATE in
 * `code`, so `neon()` throws a NeonDbError with that code): a failed authentication is `28P01`,
 * whatever failed (an unknown tenant, a forged key, another tenant's key, a revoked key), so the
 * answer says nothing about which tenants exist.
 *
 * `Authorization: Bearer <JWT>` (the driver's `authToken`) makes the request an end user's: the
 * tenant's object verifies the token and runs the statements under the tenant's end-user role, with
 * the claims readable through `auth.session()` (docs/adr/012-end-user-jwts.md). A token that fails,
 * or a tenant without JWT mode, is a 401 with a `jwt_*` code; it never runs as the tenant role.
 */
import { Hono } from "hono";
import { cors } from "hono/cors";
import { requiredSchemaVersion, schemaVersionHeader, waitUntil } from "../campaigns/schema-version.ts";
import { parseSqlConnectionString } from "../core/connection-string.ts";
import { parseSqlRequest } from "../core/neon-protocol.ts";
import type { TenantId } from "../core/tenant-id.ts";
import { LessorError } from "../errors/index.ts";
import type { KeyProof } from "../rpc/tenant.ts";
import { countFailedAuthentication, proveTenantKey } from "./auth.ts";
import { type AppContext, type AppEnv, readJson } from "./context.ts";
import { callSql } from "./sql-call.ts";

export const sqlRoutes = new Hono<AppEnv>();

// Browsers call the driver's endpoint from web apps: answer preflights as Neon's endpoint does.
// Only a request with an `Origin` (a browser's cross-origin call, or its preflight) needs the CORS
// headers; a server-side app sends none, and skipping the middleware for it saves building a
// placeholder response and merging its headers into the answer on every warm request (issue 25).
const sqlCors = cors({
  origin: "*",
  allowMethods: ["POST", "OPTIONS"],
  allowHeaders: [
    "Authorization",
    "Neon-Connection-String",
    "Neon-Raw-Text-Output",
    "Neon-Array-Mode",
    "Neon-Pool-Opt-In",
    "Neon-Batch-Read-Only",
    "Neon-Batch-Isolation-Level",
    "Neon-Batch-Deferrable",
    "Lessor-Schema-Version",
    "Content-Type",
  ],
  maxAge: 86_400,
});
sqlRoutes.use("/sql", (c, next) =>
  c.req.method === "OPTIONS" || c.req.header("Origin") !== undefined ? sqlCors(c, next) : next(),
);

interface SqlCaller {
  tenantId: TenantId;
  proof: KeyProof;
}

/**
 * Verified callers of recent connection strings, per isolate: saves the MAC check and the hash on
 * every request of a warm client. Only keys that passed the MAC check are kept (the object still
 * checks the hash, so a revoked key fails there). Bounded: the oldest entry goes first.
 */
const recentCallers = new Map<string, SqlCaller>();
const recentCallersLimit = 1_024;

/**
 * `28P01`, as Postgres answers a failed password: one body for every way authentication fails
 * (it does not even echo the user), so no two failures can be told apart.
 */
const authenticationFailed = {
  message: "password authentication failed",
  code: "28P01",
  severity: "FATAL",
} as const;

async function callerOf(c: AppContext, header: string | undefined): Promise<SqlCaller | Response> {
  const cached = header === undefined ? undefined : recentCallers.get(header);
  if (cached) return cached;
  const credentials = parseSqlConnectionString(header);
  if (credentials === "missing") {
    throw new LessorError("missing_credentials", {
      publicMessage: c.req.header("Authorization")
        ? "The tenant key goes in the connection string (Neon-Connection-String), not in Authorization, which carries an end user's token."
        : "Send the tenant's connection string in Neon-Connection-String (neon() does).",
    });
  }
  if (credentials === "malformed") throw new LessorError("invalid_connection_string");
  if (credentials === "invalid_tenant_id") throw new LessorError("invalid_tenant_id");
  // A user that is not its database's owner fails as a wrong password does on Postgres (and as the
  // Neon driver's own tests expect): the same status and body, so it tells nothing apart either.
  if (credentials === "mismatch") return c.json(authenticationFailed, 400);
  const proof = await proveTenantKey(c, credentials.tenantId, credentials.key);
  if (!proof) return c.json(authenticationFailed, 400);
  const caller = { tenantId: credentials.tenantId, proof };
  if (header !== undefined) {
    if (recentCallers.size >= recentCallersLimit) {
      const oldest = recentCallers.keys().next();
      if (!oldest.done) recentCallers.delete(oldest.value);
    }
    recentCallers.set(header, caller);
  }
  return caller;
}

/** The end user's token from `Authorization: Bearer`, null without the header. */
function bearerOf(c: AppContext): string | null {
  const authorization = c.req.header("Authorization");
  if (authorization === undefined) return null;
  const match = /^Bearer ([A-Za-z0-9_.~+/=-]+)$/.exec(authorization.trim());
  if (!match?.[1]) {
    throw new LessorError("jwt_invalid", {
      publicMessage: "Authorization on /sql must be `Bearer <JWT>` (an end user's token), or absent.",
    });
  }
  return match[1];
}

sqlRoutes.post("/sql", async (c) => {
  const header = c.req.header("Neon-Connection-String");
  const caller = await callerOf(c, header);
  if (caller instanceof Response) return caller;
  const bearer = bearerOf(c);

  const request = parseSqlRequest(await readJson(c), c.req.raw.headers);
  if ("problem" in request) throw new LessorError("invalid_request", { publicMessage: request.problem });

  // Lessor-Schema-Version: 409 schema_too_old if the tenant is older (or upgrade it first, if configured).
  const required = requiredSchemaVersion(c.req.header(schemaVersionHeader));
  const outcome = await callSql(
    c.env,
    (promise) => waitUntil(c, promise),
    caller.tenantId,
    caller.proof,
    request,
    required,
    bearer,
  );
  if (outcome.ok) return c.body(outcome.json, 200, { "content-type": "application/json" });
  if ("postgres" in outcome) return c.json(outcome.postgres, 400);
  if (outcome.error.code === "invalid_credentials") {
    // A key that passed the MAC check but not its object: revoked or expired. Not cached again.
    if (header !== undefined) recentCallers.delete(header);
    await countFailedAuthentication(c, caller.tenantId);
    return c.json(authenticationFailed, 400);
  }
  throw LessorError.fromWire(outcome.error);
});
