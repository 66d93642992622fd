/**
 * Tenant provisioning: catalog row, a contained database and login role on the tenant's host
 * (opaque names, a connection limit, the password sent as a SCRAM verifier, the login guard;
 * docs/adr/007-tenant-containment.md), sealed password, tenant schema migrations, key. Every step is idempotent, so a create that failed half way is
 * resumed by sending the same create again; a concurrent create of the same id is refused while
 * the first holds the tenant's provisioning lock.
 */
import { eq, sql } from "drizzle-orm";
import { writeAudit } from "../audit/index.ts";
import { type DatabaseHost, keyRegionOf, type LessorConfig, regionOfHost } from "../config/index.ts";
import { type ControlPlane, tenantRecordFromRow, withControlPlane } from "../control-plane/index.ts";
import { tenantCredentials, tenantKeys, tenants } from "../control-plane/schema.ts";
import type { HostReport } from "../core/host-capabilities.ts";
import { tenantFootprint } from "../core/host-room.ts";
import { newTenantObjectName, tenantMaintenanceApplicationName } from "../core/names.ts";
import type { TenantId } from "../core/tenant-id.ts";
import { isTransientFailure } from "../core/transient.ts";
import { hmacPads, jwtClaimsKey } from "../crypto/jwt-claims.ts";
import { generateDatabasePassword, hashKey } from "../crypto/keys.ts";
import { loginGuardKey } from "../crypto/login-guard.ts";
import { seal } from "../crypto/seal.ts";
import { mintTenantKey } from "../crypto/tenant-keys.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { tenantMigrations } from "../migrations/tenant.gen.ts";
import { tenantObjectNear } from "../placement/index.ts";
import { assertRoom, withHostRoomLock } from "../placement/room.ts";
import { underDeadline, withTenantConnection } from "../postgres/index.ts";
import type { TenantKeyRecord } from "../rpc/tenant.ts";
import {
  guardKeyId,
  migrationLimits,
  migrationSettings,
  roleLimits,
  tenantCredential,
} from "../tenant-db/connect.ts";
import {
  createClosedDatabase,
  ensureTenantRole,
  openTenantDatabase,
  revokePublicConnect,
} from "../tenant-db/host-admin.ts";
import { installAuthFunctions } from "../tenant-db/jwt-install.ts";
import { installLoginGuard } from "../tenant-db/login-guard.ts";
import {
  adminDeadlineMs,
  requireFitHost,
  withAdminConnection,
  withMaintenanceSlot,
} from "../tenant-db/maintenance.ts";
import { migrateTenantDatabase } from "../tenant-db/migrator.ts";
import { provisioningHooksForTests } from "./test-hooks.ts";

export interface ProvisionInput {
  id: TenantId;
  tier: string;
  host: string;
  /** How the host was chosen when the create named none (audited with the create). */
  placement?: Record<string, unknown>;
}

export type CatalogRow = typeof tenants.$inferSelect;

/** The public view of a catalog row: never the key hash. */
export function publicTenant(row: CatalogRow) {
  return {
    id: row.id,
    ordinal: row.ordinal,
    status: row.status,
    tier: row.tier,
    host: row.host,
    schemaVersion: row.schemaVersion,
    createdAt: row.createdAt.toISOString(),
    updatedAt: row.updatedAt.toISOString(),
  };
}

export interface Provisioned {
  row: CatalogRow;
  /** The first key, shown once. */
  key: string;
  keys: TenantKeyRecord[];
}

/**
 * Creates the tenant (or resumes a create that failed half way). `actor` is who asked, for the
 * audit row written with the tenant's activation.
 */
export async function provisionTenant(
  env: Env,
  config: LessorConfig,
  input: ProvisionInput,
  actor: string,
): Promise<Provisioned> {
  if (!config.poolSizes.has(input.tier)) {
    throw new LessorError("unknown_tier", {
      publicMessage: `No tier "${input.tier}"; the configured tiers are ${[...config.poolSizes.keys()].join(", ")}.`,
    });
  }
  if (!config.hosts.has(input.host)) {
    throw new LessorError("unknown_host", {
      publicMessage: `No database host "${input.host}"; the configured hosts are ${[...config.hosts.keys()].join(", ")}.`,
    });
  }
  // The tenant's region is its host's: its catalog goes to that region's control plane only.
  const region = regionOfHost(config, input.host);
  // A resumed create keeps the host it started on; a new one goes where it was asked.
  const [existing] = await withControlPlane(config, env, region, (db) =>
    db.select({ host: tenants.host }).from(tenants).where(eq(tenants.id, input.id)).limit(1),
  );
  // The maintenance slot comes first, so a create waiting for one holds no control-plane session.
  // Its connections (admin, login guard, first migration) open one after another under it.
  const provisioned = await withMaintenanceSlot(
    env,
    config,
    existing?.host ?? input.host,
    { purpose: "provision", tenantId: input.id, deadlineMs: 3 * adminDeadlineMs },
    (knownReport) =>
      withControlPlane(config, env, region, async (db) => {
        // The lock is on the control-plane session, which withControlPlane keeps for this call and
        // resets (pg_advisory_unlock_all) before its connection serves anyone else.
        const { rows } = await db.execute<{ locked: boolean }>(
          sql`SELECT pg_try_advisory_lock(hashtext('lessor:provision'), hashtext(${input.id})) AS locked`,
        );
        if (!rows[0]?.locked) throw new LessorError("provisioning_in_progress", { retryAfterSeconds: 2 });
        try {
          return await provisionLocked(db, env, config, { ...input, region }, actor, knownReport);
        } finally {
          await db.execute(
            sql`SELECT pg_advisory_unlock(hashtext('lessor:provision'), hashtext(${input.id}))`,
          );
        }
      }),
  );
  // Tell the tenant's object about its record now, so the first query needs no catalog read.
  // If this fails, the object loads the record from the catalog on its first request instead.
  const record = tenantRecordFromRow(provisioned.row, provisioned.keys, config);
  if (record)
    await tenantObjectNear(env, input.id, provisioned.row.host)
      .configure(record)
      .catch(() => undefined);
  return provisioned;
}

async function provisionLocked(
  db: ControlPlane,
  env: Env,
  config: LessorConfig,
  input: ProvisionInput & { region: string },
  actor: string,
  knownReport: HostReport | null,
): Promise<Provisioned> {
  let [row] = await db.select().from(tenants).where(eq(tenants.id, input.id)).limit(1);
  // The id may be created again once its erase has committed (a new tenant, a new ordinal).
  if (row?.status === "erasing") throw new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
  if (row?.status === "moving") throw new LessorError("tenant_moving", { retryAfterSeconds: 5 });
  if (row && row.status !== "provisioning") throw new LessorError("tenant_exists");
  if (!row) {
    // Opaque names: another tenant can read pg_database, pg_roles and pg_stat_activity.
    const name = newTenantObjectName(crypto.getRandomValues(new Uint8Array(8)));
    // The host's room is counted and taken under its lock: two creates never share its last place
    // (a database and a role; docs/adr/028-a-fleet-that-sleeps.md). A resumed create has its place.
    [row] = await withHostRoomLock(db, input.host, async () => {
      await assertRoom(db, config, input.host, tenantFootprint(false));
      return db
        .insert(tenants)
        .values({
          id: input.id,
          status: "provisioning",
          tier: input.tier,
          host: input.host,
          databaseName: name,
          roleName: name,
        })
        .returning();
    });
  }
  if (!row) throw new LessorError("internal", { internal: "catalog insert returned nothing" });
  // A resumed create keeps the host it started on: the half-made database is there.
  const host = config.hosts.get(row.host);
  if (!host || host.region !== input.region) throw new LessorError("unknown_host");

  const password = generateDatabasePassword();
  const sealed = await seal(env.LESSOR_SEAL_KEY, input.id, password);
  await db
    .insert(tenantCredentials)
    .values({ tenantId: input.id, sealedPassword: sealed })
    .onConflictDoUpdate({
      target: tenantCredentials.tenantId,
      set: { sealedPassword: sealed, sealedAt: sql`now()` },
    });

  const schemaVersion = await provisionDatabaseRetrying(
    env,
    config,
    input.id,
    row,
    host,
    password,
    knownReport,
  );

  // The first key. A create resumed after a crash here mints again; the unseen key goes with it.
  const minted = await mintTenantKey(config.keyMacRing, input.id, keyRegionOf(config, input.region));
  const keyHash = await hashKey(minted.key);
  const active = await db.transaction(async (tx) => {
    await tx.delete(tenantKeys).where(eq(tenantKeys.tenantId, input.id));
    await tx.insert(tenantKeys).values({ tenantId: input.id, keyId: minted.keyId, keyHash });
    const [updated] = await tx
      .update(tenants)
      .set({ status: "active", schemaVersion, updatedAt: sql`now()` })
      .where(eq(tenants.id, input.id))
      .returning();
    if (updated) {
      await writeAudit(tx, {
        actor,
        action: "tenant.create",
        tenantId: input.id,
        detail: {
          ordinal: updated.ordinal,
          tier: updated.tier,
          host: updated.host,
          schemaVersion,
          ...(input.placement ? { placement: input.placement } : {}),
        },
      });
    }
    return updated;
  });
  if (!active) throw new LessorError("internal", { internal: "catalog update returned nothing" });
  logEvent("info", "tenant_provisioned", { tenant: input.id, host: active.host, schemaVersion });
  return {
    row: active,
    key: minted.key,
    keys: [{ keyId: minted.keyId, hash: keyHash, expiresAt: null, scope: "full" }],
  };
}

/** Attempts at the database steps within one create request, and the time they may take together. */
const provisionAttempts = 3;
const provisionRetryWithinMs = 8_000;

/**
 * The database steps of a create, each idempotent (a role that exists is altered, a database that
 * exists is kept, the guard and functions are replaced, the migrator skips what its ledger holds),
 * so a transient fault (a killed backend, a restarted host, a cut network) is cured by running them
 * again: up to `provisionAttempts` times within `provisionRetryWithinMs`. A fault that outlasts
 * that answers `provisioning_interrupted` (503, retryable, Retry-After); a failure of the steps'
 * own answers `provisioning_failed`. Either way the same create request resumes it.
 */
async function provisionDatabaseRetrying(
  env: Env,
  config: LessorConfig,
  tenantId: string,
  row: typeof tenants.$inferSelect,
  host: DatabaseHost,
  password: string,
  knownReport: HostReport | null,
): Promise<number> {
  const began = Date.now();
  for (let attempt = 1; ; attempt++) {
    try {
      return await provisionDatabase(env, config, tenantId, row, host, password, knownReport);
    } catch (error) {
      if (!isTransientFailure(error)) {
        if (error instanceof LessorError) throw error;
        logEvent("error", "provisioning_failed", { tenant: tenantId, failure: describeFailure(error) });
        throw new LessorError("provisioning_failed", { cause: error, retryAfterSeconds: 1 });
      }
      const delayMs = 250 * 4 ** (attempt - 1);
      if (attempt >= provisionAttempts || Date.now() - began + delayMs > provisionRetryWithinMs) {
        logEvent("warn", "provisioning_interrupted", {
          tenant: tenantId,
          attempts: attempt,
          failure: describeFailure(error),
        });
        throw new LessorError("provisioning_interrupted", { cause: error, retryAfterSeconds: 2 });
      }
      logEvent("warn", "provisioning_retried", {
        tenant: tenantId,
        attempt,
        failure: describeFailure(error),
      });
      await new Promise((resolve) => setTimeout(resolve, delayMs));
    }
  }
}

/** The role, the closed database, the guard and auth functions, the opening, the first migration. */
async function provisionDatabase(
  env: Env,
  config: LessorConfig,
  tenantId: string,
  row: typeof tenants.$inferSelect,
  host: DatabaseHost,
  password: string,
  knownReport: HostReport | null,
): Promise<number> {
  const poolSize = config.poolSizes.get(row.tier) ?? 1;
  const guardKey = await loginGuardKey(password);
  const keyId = await guardKeyId(guardKey);
  const { roleName, databaseName } = row;
  // The role, and its database created closed (owned by the admin, nobody else may connect).
  const report = await withAdminConnection(
    env,
    config,
    host,
    { purpose: "provision", knownReport },
    async (admin, current) => {
      requireFitHost(host, current);
      // Serialise the host's catalog edits: two provisionings granting and revoking on the same
      // pg_database row at once fail with "tuple concurrently updated". Released at close.
      await admin.query("SELECT pg_catalog.pg_advisory_lock(pg_catalog.hashtext('lessor:host-admin'))");
      await revokePublicConnect(admin);
      await ensureTenantRole(
        admin,
        roleName,
        { password, mode: current.verdict.passwordMode },
        roleLimits(config, poolSize),
        current.facts.tempFileLimit,
      );
      await createClosedDatabase(admin, databaseName);
      return current;
    },
  );
  await provisioningHooksForTests.onStep?.({ tenantId, step: "database_closed", databaseName });
  // Inside it: the guard and the auth functions first, then the tenant is let in.
  await withAdminConnection(
    env,
    config,
    host,
    { purpose: "provision", database: databaseName, knownReport: report },
    async (admin, current) => {
      await installLoginGuard(admin, keyId, guardKey, current.facts.eventTriggers);
      // auth.session() and friends: readable before JWT mode is on (they answer null until then).
      await installAuthFunctions(admin, keyId, hmacPads(await jwtClaimsKey(password)));
      await openTenantDatabase(admin, databaseName, roleName);
    },
  );
  await provisioningHooksForTests.onStep?.({ tenantId, step: "opened", databaseName });
  const credential = await tenantCredential(config, row, password);
  const run = await withTenantConnection(
    config,
    credential.target,
    {
      applicationName: tenantMaintenanceApplicationName(roleName, "migrate"),
      limits: migrationLimits(config),
      loginToken: credential.loginToken,
      extraSettings: migrationSettings,
    },
    (client) =>
      underDeadline(config, credential.target, client, adminDeadlineMs, () =>
        migrateTenantDatabase(client, tenantMigrations),
      ),
  );
  return run.toVersion;
}
