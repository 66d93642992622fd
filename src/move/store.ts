/**
 * A tenant move's rows (docs/adr/023-regions.md): the job's progress in the region the tenant moves
 * from (`tenant_moves`), and the copy of the tenant's own rows from that region's control plane to
 * the new one's. Every function here takes the session of the control plane it acts on; the move's
 * runner (src/tenant-object/move.ts) is the one piece of Lessor that holds two regions' sessions,
 * one after the other, never one inside the other.
 */
import { and, desc, eq, inArray, lte, sql } from "drizzle-orm";
import { writeAudit } from "../audit/index.ts";
import type { ControlPlane } from "../control-plane/index.ts";
import {
  auditLog,
  generationLedger,
  lifecycleEvents,
  tenantMoves,
  tenants,
  usageDeltas,
  usageRollups,
} from "../control-plane/schema.ts";
import type { MoveStage } from "../core/move.ts";
import { type TenantDataTable, tablesMoved, tenantData } from "../core/tenant-data.ts";
import { LessorError } from "../errors/index.ts";
import type { MoveStatus } from "../rpc/tenant.ts";

export type MoveJob = typeof tenantMoves.$inferSelect;

export type OpenMoveOutcome =
  | { kind: "started"; job: MoveJob }
  | { kind: "running"; job: MoveJob }
  | { kind: "refused"; code: "tenant_not_found" | "tenant_erasing" | "tenant_moved" };

/**
 * Closes the gate in the old region's catalog, in one transaction: the tenant's row is locked and
 * marked `moving` (from then on no key is issued for it there, no campaign claims it, no catalog
 * read hands it to an object), and the job's first progress row is written. A move already running
 * is answered as it stands.
 */
export function openMove(
  db: ControlPlane,
  input: { tenantId: string; from: string; to: string; actor: string; generation: number },
): Promise<OpenMoveOutcome> {
  return db.transaction(async (tx): Promise<OpenMoveOutcome> => {
    const [row] = await tx.select().from(tenants).where(eq(tenants.id, input.tenantId)).for("update");
    if (!row || row.status === "provisioning") return { kind: "refused", code: "tenant_not_found" };
    if (row.status === "moving") {
      const [job] = await tx
        .select()
        .from(tenantMoves)
        .where(and(eq(tenantMoves.tenantId, input.tenantId), eq(tenantMoves.state, "moving")));
      if (job) return { kind: "running", job };
    }
    if (row.status === "erasing") return { kind: "refused", code: "tenant_erasing" };
    if (row.status === "moved") return { kind: "refused", code: "tenant_moved" };
    const tenantStatus = row.status === "disabled" ? "disabled" : "active";
    const [job] = await tx
      .insert(tenantMoves)
      .values({
        tenantId: row.id,
        fromRegion: input.from,
        toRegion: input.to,
        state: "moving",
        stage: "drain",
        tenantStatus,
        host: row.host,
        fencedGeneration: input.generation,
        actor: input.actor,
      })
      .returning();
    if (!job) throw new LessorError("internal", { internal: "move insert returned nothing" });
    await tx.update(tenants).set({ status: "moving", updatedAt: sql`now()` }).where(eq(tenants.id, row.id));
    return { kind: "started", job };
  });
}

/** The tenant id's running move in this region, else its latest one, else null. */
export async function loadMoveOf(db: ControlPlane, tenantId: string): Promise<MoveJob | null> {
  const [job] = await db
    .select()
    .from(tenantMoves)
    .where(eq(tenantMoves.tenantId, tenantId))
    .orderBy(sql`${tenantMoves.state} = 'moving' DESC`, desc(tenantMoves.id))
    .limit(1);
  return job ?? null;
}

/** Running moves the cron trigger should resume: their next attempt is due. */
export function dueMoves(db: ControlPlane, limit: number): Promise<Pick<MoveJob, "tenantId" | "id">[]> {
  return db
    .select({ tenantId: tenantMoves.tenantId, id: tenantMoves.id })
    .from(tenantMoves)
    .where(and(eq(tenantMoves.state, "moving"), lte(tenantMoves.nextAttemptAt, sql`now()`)))
    .orderBy(tenantMoves.nextAttemptAt)
    .limit(limit);
}

/**
 * Records that `from` is done (its counts) and that `to` runs next, if the job is still at `from`
 * (compare-and-swap); the cron looks again in a minute. Returns the updated job, or null if another
 * runner moved it first.
 */
export async function advanceMove(
  db: ControlPlane,
  id: number,
  from: MoveStage,
  to: MoveStage,
  counts: Record<string, number>,
): Promise<MoveJob | null> {
  const [job] = await db
    .update(tenantMoves)
    .set({
      stage: to,
      counts: sql`${tenantMoves.counts} || jsonb_build_object(${from}::text, ${JSON.stringify(counts)}::jsonb)`,
      lastError: null,
      nextAttemptAt: sql`now() + interval '1 minute'`,
      updatedAt: sql`now()`,
    })
    .where(and(eq(tenantMoves.id, id), eq(tenantMoves.stage, from), eq(tenantMoves.state, "moving")))
    .returning();
  return job ?? null;
}

/** Records a failed attempt: how many, why (secret-free), and when the cron may try again. */
export async function recordMoveFailure(
  db: ControlPlane,
  id: number,
  failures: number,
  message: string,
  delayMs: number,
): Promise<void> {
  await db
    .update(tenantMoves)
    .set({
      attempts: sql`${tenantMoves.attempts} + ${failures}`,
      lastError: message.slice(0, 500),
      nextAttemptAt: sql`now() + make_interval(secs => ${delayMs / 1000})`,
      updatedAt: sql`now()`,
    })
    .where(and(eq(tenantMoves.id, id), eq(tenantMoves.state, "moving")));
}

/**
 * Everything the old region's control plane holds of the tenant that a move carries (what `copy`
 * writes, `cleanup` removes), table by table as core/tenant-data.ts declares them: the catalog row
 * (`stub`), the rows of every `copy` table (as JSON, so a table added to the declaration is carried
 * with no code here), and the audit rows (`append`).
 */
export interface TenantRows {
  tenant: typeof tenants.$inferSelect;
  copied: Partial<Record<TenantDataTable, unknown[]>>;
  audit: (typeof auditLog.$inferSelect)[];
}

const name = (identifier: string) => sql.identifier(identifier);

/** Reads the tenant's rows from the old region's control plane (in one snapshot). */
export function readTenantRows(db: ControlPlane, tenantId: string): Promise<TenantRows> {
  return db.transaction(async (tx) => {
    await tx.execute(sql`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`);
    const [tenant] = await tx.select().from(tenants).where(eq(tenants.id, tenantId));
    if (!tenant) throw new LessorError("tenant_not_found");
    const copied: TenantRows["copied"] = {};
    for (const kind of tablesMoved("copy")) {
      const { table, column } = tenantData[kind];
      const { rows } = await tx.execute<{ rows: unknown[] }>(
        sql`SELECT coalesce(json_agg(t), '[]'::json) AS rows FROM ${name(table)} t WHERE ${name(column)} = ${tenantId}`,
      );
      copied[kind] = rows[0]?.rows ?? [];
    }
    const audit = await tx
      .select()
      .from(auditLog)
      .where(eq(auditLog.tenantId, tenantId))
      .orderBy(auditLog.id);
    return { tenant, copied, audit };
  });
}

/**
 * The first placement rule a tenant's rows break, if any (core/tenant-data.ts `refuse`): an
 * attached tenant's adoption points at a tunnel of this region, so the tenant does not move.
 */
export async function placementRefusal(
  db: ControlPlane,
  tenantId: string,
): Promise<"tenant_attached" | null> {
  for (const kind of tablesMoved("refuse")) {
    const declared = tenantData[kind];
    const { rows } = await db.execute<{ n: number }>(
      sql`SELECT count(*)::int AS n FROM ${name(declared.table)} WHERE ${name(declared.column)} = ${tenantId}`,
    );
    if (Number(rows[0]?.n ?? 0) > 0 && declared.move.do === "refuse") return declared.move.code;
  }
  return null;
}

/**
 * `copy`: writes the tenant's rows into the new region's control plane, in one transaction, its
 * catalog row marked `moving` (nothing serves it yet). Idempotent: what an earlier attempt wrote is
 * replaced (the new region keeps a row of its own for the tenant only if the tenant lived there
 * before and moved away: that stub is taken over). Audit rows are added once each.
 */
export function writeTenantRows(db: ControlPlane, rows: TenantRows): Promise<Record<string, number>> {
  const id = rows.tenant.id;
  return db.transaction(async (tx) => {
    const [existing] = await tx.select().from(tenants).where(eq(tenants.id, id)).for("update");
    if (existing && existing.status !== "moving" && existing.status !== "moved") {
      throw new LessorError("tenant_exists", {
        publicMessage: "The target region already has a tenant of this id.",
      });
    }
    const placement = {
      status: "moving" as const,
      tier: rows.tenant.tier,
      host: rows.tenant.host,
      databaseName: rows.tenant.databaseName,
      roleName: rows.tenant.roleName,
      schemaVersion: rows.tenant.schemaVersion,
      createdAt: rows.tenant.createdAt,
      updatedAt: sql`now()`,
    };
    if (existing) await tx.update(tenants).set(placement).where(eq(tenants.id, id));
    // The new region gives the tenant an ordinal of its own (ordinals are a region's, never reused).
    else await tx.insert(tenants).values({ id, ...placement });
    const counts: Record<string, number> = {};
    for (const kind of tablesMoved("copy")) {
      const { table, column } = tenantData[kind];
      const copied = rows.copied[kind] ?? [];
      await tx.execute(sql`DELETE FROM ${name(table)} WHERE ${name(column)} = ${id}`);
      if (copied.length > 0) {
        await tx.execute(
          sql`INSERT INTO ${name(table)} SELECT * FROM json_populate_recordset(NULL::${name(table)}, ${JSON.stringify(copied)}::json)`,
        );
      }
      counts[kind] = copied.length;
    }
    let audit = 0;
    for (const row of rows.audit) {
      const { rowCount } = await tx.execute(sql`
        INSERT INTO ${auditLog} (at, actor, action, tenant_id, detail)
        SELECT ${row.at}, ${row.actor}, ${row.action}, ${row.tenantId}, ${JSON.stringify(row.detail)}::jsonb
        WHERE NOT EXISTS (
          SELECT 1 FROM ${auditLog}
          WHERE tenant_id = ${row.tenantId} AND at = ${row.at} AND action = ${row.action} AND actor = ${row.actor}
        )`);
      audit += rowCount ?? 0;
    }
    return { ...counts, auditLog: audit };
  });
}

/** `switch`, in the new region: the tenant's row takes its status back, and is served from now on. */
export async function switchTarget(
  db: ControlPlane,
  tenantId: string,
  status: "active" | "disabled",
): Promise<number> {
  const rows = await db
    .update(tenants)
    .set({ status, updatedAt: sql`now()` })
    .where(and(eq(tenants.id, tenantId), eq(tenants.status, "moving")))
    .returning({ id: tenants.id });
  return rows.length;
}

/** `switch`, in the old region: the row becomes the stub that says the tenant moved. */
export async function markMoved(db: ControlPlane, tenantId: string): Promise<number> {
  const rows = await db
    .update(tenants)
    .set({ status: "moved", updatedAt: sql`now()` })
    .where(and(eq(tenants.id, tenantId), inArray(tenants.status, ["moving"])))
    .returning({ id: tenants.id });
  return rows.length;
}

/**
 * `cleanup`, in the old region: every row of the tenant a move carried goes (core/tenant-data.ts
 * `copy` and `append`), but its `moved` stub (its database is still on this region's host: the stub
 * names it, so host hygiene and the orphan reaper know whose it is) and what stays (`leave`: the
 * move's own row, tombstones, campaign rows). Idempotent.
 */
export function cleanupSource(db: ControlPlane, tenantId: string): Promise<Record<string, number>> {
  return db.transaction(async (tx) => {
    const counts: Record<string, number> = {};
    for (const kind of [...tablesMoved("copy"), ...tablesMoved("append")]) {
      const { table, column } = tenantData[kind];
      const { rowCount } = await tx.execute(
        sql`DELETE FROM ${name(table)} WHERE ${name(column)} = ${tenantId}`,
      );
      counts[kind] = rowCount ?? 0;
    }
    return counts;
  });
}

/** The highest outbox sequence numbers the new region holds of the tenant: its object counts on from there. */
export async function sequenceFloors(
  db: ControlPlane,
  tenantId: string,
): Promise<{ events: number; usage: number; generation: number }> {
  const { rows } = await db.execute<{
    events: string | null;
    usage: string | null;
    folded: string | null;
    generation: string | null;
  }>(sql`
    SELECT
      (SELECT max(seq) FROM ${lifecycleEvents} WHERE tenant_id = ${tenantId}) AS events,
      (SELECT max(seq) FROM ${usageDeltas} WHERE tenant_id = ${tenantId}) AS usage,
      (SELECT folded_seq FROM ${usageRollups} WHERE tenant_id = ${tenantId}) AS folded,
      (SELECT max(generation) FROM ${generationLedger} WHERE tenant_id = ${tenantId}) AS generation`);
  const row = rows[0];
  return {
    events: Number(row?.events ?? 0),
    usage: Math.max(Number(row?.usage ?? 0), Number(row?.folded ?? 0)),
    generation: Number(row?.generation ?? 0),
  };
}

/**
 * `commit`: the job is done (its row is the record of where the tenant went), and the new region's
 * audit log gets the one `tenant.move` row.
 */
export async function commitMoveSource(db: ControlPlane, id: number): Promise<MoveJob | null> {
  const [job] = await db
    .update(tenantMoves)
    .set({ state: "moved", movedAt: sql`now()`, updatedAt: sql`now()`, lastError: null })
    .where(and(eq(tenantMoves.id, id), eq(tenantMoves.state, "moving")))
    .returning();
  return job ?? null;
}

/** The `tenant.move` audit row, in the tenant's new region (once: a replayed commit finds it). */
export async function auditMove(db: ControlPlane, job: MoveJob): Promise<void> {
  const startedAt = job.startedAt.toISOString();
  const { rows } = await db.execute<{ n: number }>(sql`
    SELECT count(*)::int AS n FROM ${auditLog}
    WHERE tenant_id = ${job.tenantId} AND action = 'tenant.move' AND detail->>'startedAt' = ${startedAt}`);
  if (Number(rows[0]?.n ?? 0) > 0) return;
  await writeAudit(db, {
    actor: job.actor,
    action: "tenant.move",
    tenantId: job.tenantId,
    detail: {
      from: job.fromRegion,
      to: job.toRegion,
      startedAt,
      fencedGeneration: job.fencedGeneration,
      attempts: job.attempts,
      stages: job.counts,
    },
  });
}

/** The job's status as a move request or resume answers it. */
export function moveStatusOf(job: MoveJob): MoveStatus {
  if (job.state === "moved") {
    return {
      state: "moved",
      from: job.fromRegion,
      to: job.toRegion,
      startedAt: job.startedAt.toISOString(),
      movedAt: (job.movedAt ?? job.updatedAt).toISOString(),
    };
  }
  return {
    state: "moving",
    from: job.fromRegion,
    to: job.toRegion,
    stage: job.stage,
    startedAt: job.startedAt.toISOString(),
    attempts: job.attempts,
    lastError: job.lastError,
  };
}
