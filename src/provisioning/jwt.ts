/**
 * Switching a tenant's end-user JWT mode on, changing it, and off (docs/adr/012-end-user-jwts.md).
 * Setting it installs, through the host's admin role (each connection within a maintenance slot of
 * the host's reserve) and idempotently, what the tenant database
 * needs (the `auth` functions and their claims key, the end-user role, the tenant's end-user login
 * role), then writes the catalog row and hands the tenant's object its new record, so the next
 * request sees it. Sending the same request again finishes one that failed half way.
 */
import { eq, sql } from "drizzle-orm";
import type { DatabaseHost, LessorConfig } from "../config/index.ts";
import { loadSealedPassword, loadTenantRecord, withControlPlane } from "../control-plane/index.ts";
import { tenantJwt, tenants } from "../control-plane/schema.ts";
import { type JwtConfig, jwtLoginRoleName } from "../core/jwt-config.ts";
import type { TenantId } from "../core/tenant-id.ts";
import { tunnelOfBudgetName } from "../core/tunnel.ts";
import { hmacPads, jwtClaimsKey, jwtLoginPassword } from "../crypto/jwt-claims.ts";
import { loginGuardKey } from "../crypto/login-guard.ts";
import { unseal } from "../crypto/seal.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { tenantObject } from "../placement/index.ts";
import { assertRoom } from "../placement/room.ts";
import { guardKeyId } from "../tenant-db/connect.ts";
import {
  disableJwtLogin,
  ensureJwtRoles,
  installAuthFunctions,
  jwtRoleConflict,
} from "../tenant-db/jwt-install.ts";
import { withHostAdmin } from "../tenant-db/maintenance.ts";

/** The catalog row of a tenant that may be configured (it exists and is not being provisioned). */
async function placementOf(env: Env, config: LessorConfig, region: string, tenantId: TenantId) {
  const row = await withControlPlane(config, env, region, async (db) => {
    const [found] = await db.select().from(tenants).where(eq(tenants.id, tenantId)).limit(1);
    if (!found || found.status === "provisioning") return null;
    // An erase owns the tenant: no role or configuration may be added behind it.
    if (found.status === "erasing") throw new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
    return { ...found, sealed: await loadSealedPassword(db, tenantId) };
  });
  if (!row?.sealed) throw new LessorError("tenant_not_found");
  if (tunnelOfBudgetName(row.host) !== null) {
    throw new LessorError("adopted_database", {
      publicMessage:
        "JWT mode installs Lessor's functions and an end-user role in the tenant's database; this database is its customer's, where Lessor creates nothing.",
    });
  }
  const host = config.hosts.get(row.host);
  if (!host)
    throw new LessorError("misconfigured", { internal: `tenant host ${row.host} is not configured` });
  return { row, sealed: row.sealed, host };
}

/** Hands the tenant's object its current record (with or without JWT mode). */
async function refreshObject(
  env: Env,
  config: LessorConfig,
  region: string,
  tenantId: TenantId,
): Promise<void> {
  const record = await withControlPlane(config, env, region, (db) => loadTenantRecord(db, config, tenantId));
  if (record) await tenantObject(env, region, tenantId).configure(record);
}

/**
 * The `auth` functions and their claims key, in the tenant database: at provisioning, and again
 * whenever JWT mode is set (which brings a tenant provisioned before JWT mode existed up to date).
 */
async function installTenantAuth(
  env: Env,
  config: LessorConfig,
  host: DatabaseHost,
  tenantId: TenantId,
  databaseName: string,
  password: string,
): Promise<void> {
  const guardKey = await loginGuardKey(password);
  const pads = hmacPads(await jwtClaimsKey(password));
  await withHostAdmin(
    env,
    config,
    host,
    { purpose: "jwt", tenantId, database: databaseName },
    async (admin) => installAuthFunctions(admin, await guardKeyId(guardKey), pads),
  );
}

/** Sets (or replaces) a tenant's JWT configuration; answers it as stored. */
export async function setTenantJwt(
  env: Env,
  config: LessorConfig,
  region: string,
  tenantId: TenantId,
  jwt: JwtConfig,
): Promise<JwtConfig> {
  const { row, sealed, host } = await placementOf(env, config, region, tenantId);
  // JWT mode takes one more role on the host (`<role>_jwt`): a host whose roles are all taken
  // refuses it with `507 host_full` (docs/adr/028-a-fleet-that-sleeps.md). A tenant that has it
  // already takes nothing more.
  await withControlPlane(config, env, region, async (db) => {
    const [configured] = await db
      .select({ tenantId: tenantJwt.tenantId })
      .from(tenantJwt)
      .where(eq(tenantJwt.tenantId, tenantId))
      .limit(1);
    if (!configured) await assertRoom(db, config, host.name, { databases: 0, roles: 1 });
  });
  const password = await unseal(env.LESSOR_SEAL_KEY, tenantId, sealed);
  const loginRole = jwtLoginRoleName(row.roleName);
  try {
    const loginPassword = await jwtLoginPassword(password);
    const poolSize = config.poolSizes.get(row.tier) ?? 1;
    await withHostAdmin(env, config, host, { purpose: "jwt", tenantId }, async (admin, report) => {
      // Host catalog edits are serialised with provisioning's (same lock, released at close).
      await admin.query("SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtext('lessor:host-admin'))");
      const conflict = await jwtRoleConflict(admin, jwt.role);
      if (conflict) throw new LessorError("jwt_role_unavailable", { publicMessage: conflict });
      await ensureJwtRoles(admin, {
        database: row.databaseName,
        loginRole,
        secret: { password: loginPassword, mode: report.verdict.passwordMode },
        connectionLimit: poolSize,
        role: jwt.role,
      });
    });
    await installTenantAuth(env, config, host, tenantId, row.databaseName, password);
  } catch (error) {
    if (error instanceof LessorError) throw error;
    logEvent("error", "jwt_setup_failed", { tenant: tenantId, failure: describeFailure(error) });
    throw new LessorError("jwt_setup_failed", { cause: error, retryAfterSeconds: 1 });
  }
  const values = {
    issuer: jwt.issuer,
    audiences: jwt.audiences,
    jwks: jwt.jwks,
    jwksUrl: jwt.jwksUrl,
    role: jwt.role,
    algorithms: jwt.algorithms,
    clockSkewSeconds: jwt.clockSkewSeconds,
  };
  await withControlPlane(config, env, region, (db) =>
    db
      .insert(tenantJwt)
      .values({ tenantId, ...values })
      .onConflictDoUpdate({ target: tenantJwt.tenantId, set: { ...values, updatedAt: sql`now()` } }),
  );
  await refreshObject(env, config, region, tenantId);
  logEvent("info", "tenant_jwt_configured", { tenant: tenantId, role: jwt.role });
  return values;
}

/** The tenant's JWT configuration, or null. */
export async function getTenantJwt(
  env: Env,
  config: LessorConfig,
  region: string,
  tenantId: TenantId,
): Promise<JwtConfig | null> {
  const { row } = await placementOf(env, config, region, tenantId);
  const record = await withControlPlane(config, env, region, (db) => loadTenantRecord(db, config, row.id));
  if (!record?.jwt) return null;
  const { loginRole: _loginRole, ...stored } = record.jwt;
  return stored;
}

/** Switches JWT mode off: the catalog row goes, and the end-user login role can no longer log in. */
export async function removeTenantJwt(
  env: Env,
  config: LessorConfig,
  region: string,
  tenantId: TenantId,
): Promise<void> {
  const { row, host } = await placementOf(env, config, region, tenantId);
  await withControlPlane(config, env, region, (db) =>
    db.delete(tenantJwt).where(eq(tenantJwt.tenantId, tenantId)),
  );
  // The object first: from its next request on, a token is refused (jwt_not_configured).
  await refreshObject(env, config, region, tenantId);
  await withHostAdmin(env, config, host, { purpose: "jwt", tenantId }, (admin) =>
    disableJwtLogin(admin, row.databaseName, jwtLoginRoleName(row.roleName)),
  );
  logEvent("info", "tenant_jwt_removed", { tenant: tenantId });
}
