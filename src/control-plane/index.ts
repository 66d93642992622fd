/**
 * Control-plane access. Every call opens one connection, does its work and closes it: the stateless
 * Worker cannot hold a pool across requests, and none of this is on the hot path (a tenant's
 * queries never touch the control plane).
 */

import type { Client } from "@neondatabase/serverless";
import { and, eq, gt, isNull, max, or, sql } from "drizzle-orm";
import { drizzle, type NeonDatabase } from "drizzle-orm/neon-serverless";
import type { LessorConfig } from "../config/index.ts";
import {
  type JsonWebKeySetRecord,
  type JwtAlgorithm,
  jwtLoginRoleName,
  type TenantJwt,
} from "../core/jwt-config.ts";
import { LessorError } from "../errors/index.ts";
import { controlPlaneShard } from "../placement/index.ts";
import type { Queryable } from "../postgres/queryable.ts";
import type { AdoptedPlacement, TenantKeyRecord, TenantRecord } from "../rpc/tenant.ts";
import { answerError, RemoteClient } from "./remote-client.ts";
import {
  adoptedDatabases,
  controlPlaneSchema,
  generationLedger,
  lifecycleEvents,
  tenantCredentials,
  tenantJwt,
  tenantKeys,
  tenants,
} from "./schema.ts";

/**
 * Test-only fault injection at the control-plane boundary: while `active`, every
 * `withControlPlane` in this isolate fails as an unreachable control plane does. Nothing outside
 * the test suite sets it.
 */
export const controlPlaneOutageForTests = { active: false };

/** A control-plane session: drizzle over one pooled connection (`$client` for raw SQL). */
export type ControlPlane = NeonDatabase<typeof controlPlaneSchema> & { $client: Queryable };

/**
 * Control-plane sessions this isolate has opened, by application name, since it started: what
 * shows that an idle fleet's cron reads the control plane only for the jobs that must
 * (docs/adr/028-a-fleet-that-sleeps.md).
 */
const sessionsOpened = new Map<string, number>();
export function controlPlaneSessionsOpened(): ReadonlyMap<string, number> {
  return new Map(sessionsOpened);
}

/**
 * Runs `work` on a control-plane session of `region` (its own control-plane database: a tenant's
 * catalog is only in its region's, docs/adr/023-regions.md): one warm connection of one of the
 * region's ControlPlaneObject shards,
 * checked out for `work` and returned after it (reset), with drizzle over it exactly as over a
 * direct connection, transactions included. No handshake happens here: the shard keeps its
 * connections open (docs/adr/010-control-plane-pool-and-maintenance-reserve.md). `applicationName`
 * names the session in `pg_stat_activity` while it lasts. If no connection can be had, this throws
 * `control_plane_unavailable`. Raw SQL work uses `db.$client`.
 */
export async function withControlPlane<T>(
  config: LessorConfig,
  env: Env,
  region: string,
  work: (db: ControlPlane) => Promise<T>,
  applicationName = "lessor-control-plane",
): Promise<T> {
  if (!config.regions.has(region)) {
    throw new LessorError("misconfigured", { internal: `control plane of unknown region ${region}` });
  }
  if (controlPlaneOutageForTests.active) {
    throw new LessorError("control_plane_unavailable", {
      internal: "control plane down (test fault injection)",
      retryAfterSeconds: 1,
    });
  }
  sessionsOpened.set(applicationName, (sessionsOpened.get(applicationName) ?? 0) + 1);
  const shard = controlPlaneShard(env, region, Math.floor(Math.random() * config.controlPlaneShards));
  let opened: Awaited<ReturnType<typeof shard.open>>;
  try {
    opened = await shard.open(applicationName, region);
  } catch (error) {
    throw new LessorError("control_plane_unavailable", {
      internal: "control-plane object unreachable",
      cause: error,
      retryAfterSeconds: 1,
    });
  }
  if (!opened.ok) throw answerError(opened);
  const client = new RemoteClient(shard, opened.value);
  try {
    return await work(
      drizzle({ client: client as unknown as Client, schema: controlPlaneSchema }) as ControlPlane,
    );
  } finally {
    await shard.close(opened.value).catch(() => undefined);
  }
}

/** Whether a catalog row is a tenant its region serves now (not provisioning, erasing, moving or moved). */
export function isServable(status: string): status is "active" | "disabled" {
  return status === "active" || status === "disabled";
}

/**
 * The catalog record a TenantObject needs, or null if the tenant does not exist, is not provisioned
 * yet, is being erased (its object learns why from the erase's row: `erasuresOf`), or is moving to
 * or has moved to another region (docs/adr/023-regions.md).
 */
export async function loadTenantRecord(
  db: ControlPlane,
  config: LessorConfig,
  tenantId: string,
): Promise<TenantRecord | null> {
  const [row] = await db.select().from(tenants).where(eq(tenants.id, tenantId)).limit(1);
  if (!row || !isServable(row.status)) return null;
  return tenantRecordFromRow(
    row,
    await loadUsableKeys(db, tenantId),
    config,
    await loadTenantJwt(db, row),
    await loadAdoptedPlacement(db, tenantId),
  );
}

/** Where a tenant's adopted database is (docs/adr/018); null for a database Lessor created. */
export async function loadAdoptedPlacement(
  db: ControlPlane,
  tenantId: string,
): Promise<AdoptedPlacement | null> {
  const [row] = await db
    .select({
      tunnel: adoptedDatabases.tunnel,
      hostname: adoptedDatabases.hostname,
      port: adoptedDatabases.port,
      credentials: adoptedDatabases.credentialPolicy,
    })
    .from(adoptedDatabases)
    .where(eq(adoptedDatabases.tenantId, tenantId))
    .limit(1);
  return row ?? null;
}

/** A tenant's end-user JWT configuration, with the login role derived from its role; null if none. */
export async function loadTenantJwt(
  db: ControlPlane,
  tenant: { id: string; roleName: string },
): Promise<TenantJwt | null> {
  const [row] = await db.select().from(tenantJwt).where(eq(tenantJwt.tenantId, tenant.id)).limit(1);
  if (!row) return null;
  return {
    issuer: row.issuer,
    audiences: row.audiences,
    jwks: (row.jwks as JsonWebKeySetRecord | null) ?? null,
    jwksUrl: row.jwksUrl,
    role: row.role,
    algorithms: row.algorithms as JwtAlgorithm[],
    clockSkewSeconds: row.clockSkewSeconds,
    loginRole: jwtLoginRoleName(tenant.roleName),
  };
}

/** A tenant's keys that still work: not revoked, not expired. */
export async function loadUsableKeys(db: ControlPlane, tenantId: string): Promise<TenantKeyRecord[]> {
  const rows = await db
    .select({
      keyId: tenantKeys.keyId,
      hash: tenantKeys.keyHash,
      expiresAt: tenantKeys.expiresAt,
      scope: tenantKeys.scope,
    })
    .from(tenantKeys)
    .where(
      and(
        eq(tenantKeys.tenantId, tenantId),
        isNull(tenantKeys.revokedAt),
        or(isNull(tenantKeys.expiresAt), gt(tenantKeys.expiresAt, sql`now()`)),
      ),
    )
    .orderBy(tenantKeys.createdAt);
  return rows.map((row) => ({
    keyId: row.keyId,
    hash: row.hash,
    expiresAt: row.expiresAt?.getTime() ?? null,
    scope: row.scope,
  }));
}

/**
 * A tier's pool size (its maximum) as this deployment configures it; the default tier's for a tier
 * it no longer names. Read when a tenant's record is made and each time its object loads the
 * record, never kept: a tier changed by a deploy reaches the pools started after it.
 */
export function tierPoolSize(config: LessorConfig, tier: string): number {
  return config.poolSizes.get(tier) ?? config.poolSizes.get(config.defaultTier) ?? 1;
}

/** The TenantObject's view of a catalog row and its usable keys. */
export function tenantRecordFromRow(
  row: typeof tenants.$inferSelect,
  keys: TenantKeyRecord[],
  config: LessorConfig,
  jwt: TenantJwt | null = null,
  adopted: AdoptedPlacement | null = null,
): TenantRecord | null {
  if (!isServable(row.status)) return null;
  return {
    tenantId: row.id,
    status: row.status,
    keys,
    tier: row.tier,
    poolSize: tierPoolSize(config, row.tier),
    host: row.host,
    databaseName: row.databaseName,
    roleName: row.roleName,
    schemaVersion: row.schemaVersion,
    jwt,
    adopted,
  };
}

export async function loadSealedPassword(db: ControlPlane, tenantId: string): Promise<string | null> {
  const [row] = await db
    .select({ sealed: tenantCredentials.sealedPassword })
    .from(tenantCredentials)
    .where(eq(tenantCredentials.tenantId, tenantId))
    .limit(1);
  return row?.sealed ?? null;
}

/** Replaces a tenant's sealed password (a rotation); `sealed_at` is when its credential last changed. */
export async function resealCredential(db: ControlPlane, tenantId: string, sealed: string): Promise<void> {
  await db
    .update(tenantCredentials)
    .set({ sealedPassword: sealed, sealedAt: sql`now()` })
    .where(eq(tenantCredentials.tenantId, tenantId));
}

/** When a tenant's credential was last set (provisioned or rotated); null for an unknown tenant. */
export async function credentialSetAt(db: ControlPlane, tenantId: string): Promise<Date | null> {
  const [row] = await db
    .select({ at: tenantCredentials.sealedAt })
    .from(tenantCredentials)
    .where(eq(tenantCredentials.tenantId, tenantId))
    .limit(1);
  return row?.at ?? null;
}

/**
 * Appends a generation to the insert-only ledger. Returns false if the generation was already
 * taken (a lost race), in which case `highestGeneration` tells the loser where to move. A generation
 * at or below the ledger's highest is refused too: the fold trims old rows but always keeps each
 * tenant's highest, so a trimmed number can never be taken a second time.
 */
export async function appendGeneration(
  db: ControlPlane,
  tenantId: string,
  generation: number,
  poolSize: number,
): Promise<boolean> {
  const { rows } = await db.execute<{ generation: number }>(sql`
    INSERT INTO ${generationLedger} (tenant_id, generation, pool_size)
    SELECT ${tenantId}, ${generation}, ${poolSize}
    WHERE NOT EXISTS (
      SELECT 1 FROM ${generationLedger} WHERE tenant_id = ${tenantId} AND generation >= ${generation}
    )
    ON CONFLICT DO NOTHING
    RETURNING generation`);
  return rows.length === 1;
}

export async function highestGeneration(db: ControlPlane, tenantId: string): Promise<number> {
  const [row] = await db
    .select({ value: max(generationLedger.generation) })
    .from(generationLedger)
    .where(eq(generationLedger.tenantId, tenantId));
  return row?.value ?? 0;
}

export interface LifecycleEventRow {
  seq: number;
  generation: number;
  fromState: string;
  toState: string;
  reason: string;
  at: number;
}

/**
 * Appends events. A (tenant, seq) already held is either a replay of the same event (a flush that
 * ran twice: ignored) or another event under the same number: an instance whose flush sent an
 * event and whose own record of it was then lost (killed before its write was durable), so the next
 * instance numbered a new event the same. That one is appended after the newest, never dropped.
 */
export async function appendLifecycleEvents(
  db: ControlPlane,
  tenantId: string,
  events: readonly LifecycleEventRow[],
): Promise<void> {
  if (events.length === 0) return;
  const rows = events.map((event) => ({ ...event, tenantId, at: new Date(event.at) }));
  const landed = await db
    .insert(lifecycleEvents)
    .values(rows)
    .onConflictDoNothing()
    .returning({ seq: lifecycleEvents.seq });
  if (landed.length === rows.length) return;
  const seqs = new Set(landed.map((row) => row.seq));
  for (const row of rows) {
    if (seqs.has(row.seq)) continue;
    const [same] = await db
      .select({ seq: lifecycleEvents.seq })
      .from(lifecycleEvents)
      .where(
        and(
          eq(lifecycleEvents.tenantId, tenantId),
          eq(lifecycleEvents.generation, row.generation),
          eq(lifecycleEvents.fromState, row.fromState),
          eq(lifecycleEvents.toState, row.toState),
          eq(lifecycleEvents.reason, row.reason),
          eq(lifecycleEvents.at, row.at),
        ),
      )
      .limit(1);
    if (same) continue;
    // Renumbered past the newest; a concurrent append taking that number is retried.
    for (let tries = 0; tries < 5; tries++) {
      const renumbered = await db
        .insert(lifecycleEvents)
        .values({
          ...row,
          seq: sql`(SELECT coalesce(max(seq), 0) + 1 FROM lifecycle_events WHERE tenant_id = ${tenantId})`,
        })
        .onConflictDoNothing()
        .returning({ seq: lifecycleEvents.seq });
      if (renumbered.length > 0) break;
    }
  }
}

/** Newest-first page of a tenant's lifecycle events. */
export async function listLifecycleEvents(
  db: ControlPlane,
  tenantId: string,
  options: { before: number | null; limit: number },
) {
  return db
    .select()
    .from(lifecycleEvents)
    .where(
      and(
        eq(lifecycleEvents.tenantId, tenantId),
        options.before === null ? undefined : sql`${lifecycleEvents.seq} < ${options.before}`,
      ),
    )
    .orderBy(sql`${lifecycleEvents.seq} DESC`)
    .limit(options.limit);
}

/**
 * Records when keys were last used, to the minute. At most one UPDATE per key per flush, and
 * only forwards: a flush that arrives late never moves a newer time back.
 */
export async function recordKeyUses(
  db: ControlPlane,
  tenantId: string,
  uses: ReadonlyMap<string, number>,
): Promise<void> {
  for (const [keyId, minute] of uses) {
    const at = new Date(minute);
    await db
      .update(tenantKeys)
      .set({ lastUsedAt: at })
      .where(
        and(
          eq(tenantKeys.tenantId, tenantId),
          eq(tenantKeys.keyId, keyId),
          or(isNull(tenantKeys.lastUsedAt), sql`${tenantKeys.lastUsedAt} < ${at}`),
        ),
      );
  }
}
