/**
 * `POST /sql`: the Neon serverless driver's HTTP protocol. The tenant and its key come from the
 * `Neon-Connection-String` header; the query runs on that tenant's pool, under a lease, in its
 * TenantObject. Nothing here touches the control plane: the hot path opens no connection.
 */
import { Hono } from "hono";
import { schemaVersionHeader, sqlWithSchemaVersion, waitUntil } from "../campaigns/schema-version.ts";
import { parseSqlConnectionString } from "../core/connection-string.ts";
import { parseSqlRequest } from "../core/neon-protocol.ts";
import type { TenantId } from "../core/tenant-id.ts";
import { hashKey } from "../crypto/keys.ts";
import { LessorError } from "../errors/index.ts";
import { type AppEnv, readJson } from "./context.ts";

export const sqlRoutes = new Hono<AppEnv>();

/**
 * Parsed connection strings of recent callers → (tenant, key hash), per isolate. Saves parsing and
 * hashing on every request of a warm client; it authenticates nothing (the tenant's object compares
 * the hash). Bounded: the oldest entry goes first.
 */
const recentCredentials = new Map<string, { tenantId: TenantId; keyHash: string }>();
const recentCredentialsLimit = 1_024;

async function credentialsOf(header: string | undefined): Promise<{ tenantId: TenantId; keyHash: string }> {
  const cached = header === undefined ? undefined : recentCredentials.get(header);
  if (cached) return cached;
  const credentials = parseSqlConnectionString(header);
  if (credentials === "missing") throw new LessorError("missing_credentials");
  if (credentials === "malformed") throw new LessorError("invalid_connection_string");
  if (credentials === "invalid_tenant_id") throw new LessorError("invalid_tenant_id");
  const resolved = { tenantId: credentials.tenantId, keyHash: await hashKey(credentials.key) };
  if (header !== undefined) {
    if (recentCredentials.size >= recentCredentialsLimit) {
      const oldest = recentCredentials.keys().next();
      if (!oldest.done) recentCredentials.delete(oldest.value);
    }
    recentCredentials.set(header, resolved);
  }
  return resolved;
}

sqlRoutes.post("/sql", async (c) => {
  const credentials = await credentialsOf(c.req.header("Neon-Connection-String"));

  const request = parseSqlRequest(await readJson(c), c.req.raw.headers);
  if ("problem" in request) throw new LessorError("invalid_request", { publicMessage: request.problem });

  const keyHash = credentials.keyHash;
  // Lessor-Schema-Version: 409 schema_too_old if the tenant is older (or upgrade it first, if configured).
  const outcome = await sqlWithSchemaVersion(
    c.env,
    (promise) => waitUntil(c, promise),
    credentials.tenantId,
    keyHash,
    request,
    c.req.header(schemaVersionHeader),
  );
  if (outcome.ok) return c.body(outcome.json, 200, { "content-type": "application/json" });
  if ("postgres" in outcome) return c.json(outcome.postgres, 400);
  throw LessorError.fromWire(outcome.error);
});
