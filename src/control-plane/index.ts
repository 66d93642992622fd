/**
 * Control-plane access. Every call opens one connection, does its work and closes it: the stateless
 * Worker cannot hold a pool across requests, and none of this is on the hot path (a tenant's
 * queries never touch the control plane).
 */

import type { Client } from "@neondatabase/serverless";
import { and, eq, max, sql } from "drizzle-orm";
import { drizzle, type NeonDatabase } from "drizzle-orm/neon-serverless";
import type { LessorConfig } from "../config/index.ts";
import { LessorError } from "../errors/index.ts";
import { withConnection } from "../postgres/index.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import {
  controlPlaneSchema,
  generationLedger,
  lifecycleEvents,
  tenantCredentials,
  tenants,
} from "./schema.ts";

/** A control-plane session: drizzle over one connection (`$client` for raw SQL). */
export type ControlPlane = NeonDatabase<typeof controlPlaneSchema> & { $client: Client };

/**
 * Runs `work` with a control-plane connection named `applicationName` (so each job shows up as
 * itself in `pg_stat_activity`); a failed connect becomes `control_plane_unavailable`. Raw SQL work
 * uses `db.$client`.
 */
export async function withControlPlane<T>(
  config: LessorConfig,
  env: Env,
  work: (db: ControlPlane) => Promise<T>,
  applicationName = "lessor-control-plane",
): Promise<T> {
  let connected = false;
  try {
    return await withConnection(config, env.LESSOR_CONTROL_PLANE_URL, applicationName, (client) => {
      connected = true;
      return work(drizzle({ client, schema: controlPlaneSchema }));
    });
  } catch (error) {
    if (!connected && !(error instanceof LessorError)) {
      throw new LessorError("control_plane_unavailable", {
        internal: "control-plane connect failed",
        cause: error,
      });
    }
    throw error;
  }
}

/** The catalog record a TenantObject needs, or null if the tenant does not exist or is not provisioned. */
export async function loadTenantRecord(
  db: ControlPlane,
  config: LessorConfig,
  tenantId: string,
): Promise<TenantRecord | null> {
  const [row] = await db.select().from(tenants).where(eq(tenants.id, tenantId)).limit(1);
  return row ? tenantRecordFromRow(row, config) : null;
}

/** The TenantObject's view of a catalog row; null while the tenant is still being provisioned. */
export function tenantRecordFromRow(
  row: typeof tenants.$inferSelect,
  config: LessorConfig,
): TenantRecord | null {
  if (row.status === "provisioning" || !row.keyHash) return null;
  return {
    tenantId: row.id,
    status: row.status,
    keyHash: row.keyHash,
    tier: row.tier,
    poolSize: config.poolSizes.get(row.tier) ?? config.poolSizes.get(config.defaultTier) ?? 1,
    host: row.host,
    databaseName: row.databaseName,
    roleName: row.roleName,
    schemaVersion: row.schemaVersion,
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

/** Appends events; replays of the same (tenant, seq) are ignored, so a flush can run twice. */
export async function appendLifecycleEvents(
  db: ControlPlane,
  tenantId: string,
  events: readonly LifecycleEventRow[],
): Promise<void> {
  if (events.length === 0) return;
  await db
    .insert(lifecycleEvents)
    .values(events.map((event) => ({ ...event, tenantId, at: new Date(event.at) })))
    .onConflictDoNothing();
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
