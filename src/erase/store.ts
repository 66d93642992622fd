/**
 * The erase job's durable state in the control plane (`tenant_erasures`), and the control-plane
 * half of its stages. Every write is guarded by the state it expects (`WHERE stage = …`,
 * `WHERE state = 'erasing'`), so a stage replayed after a kill changes nothing, and two runners
 * can never both advance the job.
 */
import { and, eq, gt, inArray, isNull, lte, or, sql } from "drizzle-orm";
import { writeAudit } from "../audit/index.ts";
import type { ControlPlane } from "../control-plane/index.ts";
import {
  adoptedDatabases,
  campaigns,
  campaignTenants,
  tenantErasures,
  tenantKeys,
  tenants,
} from "../control-plane/schema.ts";
import { type EraseLeftovers, type EraseStage, type RecheckVerdict, recheckVerdict } from "../core/erase.ts";
import { type ErasedTable, erasedTables, tablesErasedAt, tenantData } from "../core/tenant-data.ts";
import type { EraseStatus } from "../rpc/tenant.ts";

export type EraseJob = typeof tenantErasures.$inferSelect;

/** Campaign states in which a campaign still claims and migrates tenants. */
const activeCampaignStates = ["pending", "canary", "rollout"] as const;

export type OpenEraseOutcome =
  | { kind: "started"; job: EraseJob }
  | { kind: "running"; job: EraseJob }
  | { kind: "refused"; code: "tenant_in_campaign" | "tenant_moving" | "tenant_moved" }
  | { kind: "not_found" };

/**
 * Closes the gate in the control plane, in one transaction: the tenant's row is locked and marked
 * `erasing` (from then on no key is issued for it, no campaign enrolls or claims it, no catalog
 * read hands it to an object as a live tenant), and the job's first progress row is written. An
 * erase already running for the tenant is answered as it stands. Refused while a campaign holds a
 * live claim on the tenant.
 */
export function openErase(
  db: ControlPlane,
  input: { tenantId: string; actor: string; forced: boolean; claimTimeoutMs: number },
): Promise<OpenEraseOutcome> {
  return db.transaction(async (tx): Promise<OpenEraseOutcome> => {
    const [row] = await tx.select().from(tenants).where(eq(tenants.id, input.tenantId)).for("update");
    if (!row || row.status === "provisioning") return { kind: "not_found" };
    // A tenant moving away is the move's; one that moved is another region's to erase.
    if (row.status === "moving") return { kind: "refused", code: "tenant_moving" };
    if (row.status === "moved") return { kind: "refused", code: "tenant_moved" };
    if (row.status === "erasing") {
      const [job] = await tx
        .select()
        .from(tenantErasures)
        .where(and(eq(tenantErasures.ordinal, row.ordinal), eq(tenantErasures.state, "erasing")));
      if (job) return { kind: "running", job };
    }
    const [claim] = await tx
      .select({ campaignId: campaignTenants.campaignId })
      .from(campaignTenants)
      .innerJoin(campaigns, eq(campaigns.id, campaignTenants.campaignId))
      .where(
        and(
          eq(campaignTenants.tenantId, input.tenantId),
          eq(campaignTenants.state, "running"),
          inArray(campaigns.state, [...activeCampaignStates]),
          gt(campaignTenants.claimedAt, sql`now() - make_interval(secs => ${input.claimTimeoutMs / 1000})`),
        ),
      )
      .limit(1);
    if (claim) return { kind: "refused", code: "tenant_in_campaign" };
    const keys = await tx
      .select({ keyId: tenantKeys.keyId })
      .from(tenantKeys)
      .where(
        and(
          eq(tenantKeys.tenantId, input.tenantId),
          isNull(tenantKeys.revokedAt),
          or(isNull(tenantKeys.expiresAt), gt(tenantKeys.expiresAt, sql`now()`)),
        ),
      );
    // A customer's database is detached, never dropped: decided here, kept in the job and its tombstone.
    const [adopted] = await tx
      .select({ tenantId: adoptedDatabases.tenantId })
      .from(adoptedDatabases)
      .where(eq(adoptedDatabases.tenantId, row.id));
    const [job] = await tx
      .insert(tenantErasures)
      .values({
        detached: adopted !== undefined,
        ordinal: row.ordinal,
        tenantId: row.id,
        state: "erasing",
        stage: "keys",
        host: row.host,
        databaseName: row.databaseName,
        roleName: row.roleName,
        keyIds: keys.map((key) => key.keyId),
        actor: input.actor,
        forced: input.forced,
      })
      .onConflictDoNothing()
      .returning();
    await tx.update(tenants).set({ status: "erasing", updatedAt: sql`now()` }).where(eq(tenants.id, row.id));
    if (job) return { kind: "started", job };
    // The ordinal's row already existed (a gate whose status update was lost): adopt it.
    const [existing] = await tx.select().from(tenantErasures).where(eq(tenantErasures.ordinal, row.ordinal));
    return existing ? { kind: "running", job: existing } : { kind: "not_found" };
  });
}

/** The tenant id's erase that is running, else its most recent tombstone, else null. */
export async function loadEraseOf(db: ControlPlane, tenantId: string): Promise<EraseJob | null> {
  const [job] = await db
    .select()
    .from(tenantErasures)
    .where(eq(tenantErasures.tenantId, tenantId))
    .orderBy(sql`${tenantErasures.state} = 'erasing' DESC`, sql`${tenantErasures.ordinal} DESC`)
    .limit(1);
  return job ?? null;
}

/** Every erase of a tenant id (running and tombstones): the key ids whose holders are told why. */
export function erasuresOf(
  db: ControlPlane,
  tenantId: string,
): Promise<Pick<EraseJob, "state" | "keyIds" | "erasedAt">[]> {
  return db
    .select({ state: tenantErasures.state, keyIds: tenantErasures.keyIds, erasedAt: tenantErasures.erasedAt })
    .from(tenantErasures)
    .where(eq(tenantErasures.tenantId, tenantId));
}

/** Running erases the cron trigger should resume: their next attempt is due. */
export function dueErases(
  db: ControlPlane,
  limit: number,
): Promise<Pick<EraseJob, "tenantId" | "ordinal">[]> {
  return db
    .select({ tenantId: tenantErasures.tenantId, ordinal: tenantErasures.ordinal })
    .from(tenantErasures)
    .where(and(eq(tenantErasures.state, "erasing"), lte(tenantErasures.nextAttemptAt, sql`now()`)))
    .orderBy(tenantErasures.nextAttemptAt)
    .limit(limit);
}

/**
 * Records that `from` is done (its counts) and that `to` runs next, if the job is still at `from`
 * (compare-and-swap). Clears the last error: the job moved on. Returns the updated job, or null if
 * another runner moved it first.
 */
export async function advanceErase(
  db: ControlPlane,
  ordinal: number,
  from: EraseStage,
  to: EraseStage,
  counts: Record<string, number>,
): Promise<EraseJob | null> {
  const [job] = await db
    .update(tenantErasures)
    .set({
      stage: to,
      counts: sql`${tenantErasures.counts} || jsonb_build_object(${from}::text, ${JSON.stringify(counts)}::jsonb)`,
      lastError: null,
      updatedAt: sql`now()`,
    })
    .where(
      and(
        eq(tenantErasures.ordinal, ordinal),
        eq(tenantErasures.state, "erasing"),
        eq(tenantErasures.stage, from),
      ),
    )
    .returning();
  return job ?? null;
}

/** Records a failed attempt: why (secret-free), and when the cron trigger may try again. */
export async function recordEraseFailure(
  db: ControlPlane,
  ordinal: number,
  failures: number,
  message: string,
  retryInMs: number,
): Promise<void> {
  await db
    .update(tenantErasures)
    .set({
      attempts: sql`${tenantErasures.attempts} + ${failures}`,
      lastError: message.slice(0, 500),
      nextAttemptAt: sql`now() + make_interval(secs => ${retryInMs / 1000})`,
      updatedAt: sql`now()`,
    })
    .where(and(eq(tenantErasures.ordinal, ordinal), eq(tenantErasures.state, "erasing")));
}

// ── The control-plane stages ─────────────────────────────────────────────────────────────────────

type Transaction = Parameters<Parameters<ControlPlane["transaction"]>[0]>[0];

/** The rows a stage deleted, per declared table: only the columns some stage's `alongside` reads. */
type Deleted = Partial<Record<ErasedTable, Record<string, unknown>[]>>;

/** The columns a table's deleted rows are returned with (the tenant column for the others). */
const returned: Partial<Record<ErasedTable, string[]>> = {
  campaignTenants: ["campaign_id"],
  adoptedDatabases: ["tunnel"],
};

/**
 * What a stage does beside deleting its declared rows, in the same transaction. Nothing here
 * deletes: which rows go is the declaration's alone (core/tenant-data.ts).
 */
const alongside: { [S in EraseStage]?: (tx: Transaction, job: EraseJob, deleted: Deleted) => Promise<void> } =
  {
    // The first-format key hash the catalog row may still hold goes with the keys.
    keys: async (tx, job) => {
      await tx.update(tenants).set({ keyHash: null }).where(eq(tenants.id, job.tenantId));
    },
    // Each campaign's `erased_tenants` is raised by as many rows as went, so its counts still add up
    // to what it enrolled.
    campaigns: async (tx, _job, deleted) => {
      const perCampaign = new Map<string, number>();
      for (const row of deleted.campaignTenants ?? []) {
        const id = String(row.campaign_id);
        perCampaign.set(id, (perCampaign.get(id) ?? 0) + 1);
      }
      for (const [campaignId, n] of perCampaign) {
        await tx
          .update(campaigns)
          .set({ erasedTenants: sql`${campaigns.erasedTenants} + ${n}`, updatedAt: sql`now()` })
          .where(eq(campaigns.id, campaignId));
      }
    },
    // A customer's database is detached: one `tenant.detach` audit row with the row that went, so
    // exactly once, whatever re-runs. Nothing runs on the customer's server.
    database: async (tx, job, deleted) => {
      const gone = deleted.adoptedDatabases?.[0];
      if (!gone) return;
      await writeAudit(tx, {
        actor: job.actor,
        action: "tenant.detach",
        tenantId: job.tenantId,
        detail: {
          ordinal: job.ordinal,
          tunnel: String(gone.tunnel),
          database: job.databaseName,
          role: job.roleName,
          dropped: false,
        },
      });
    },
  };

/**
 * The control-plane half of an erase stage, in one transaction: every table the declaration says
 * the stage deletes from (core/tenant-data.ts, in its order: usage deltas before the rollup, so a
 * fold that drained deltas at the same moment has committed its rollup by the time it is read),
 * then what the stage does alongside. Returns how many rows went, per table. A table declared for
 * a stage is deleted by it with no code here: the declaration drives the erase.
 */
export function eraseStageRows(
  db: ControlPlane,
  job: EraseJob,
  stage: EraseStage,
): Promise<Record<string, number>> {
  return db.transaction(async (tx) => {
    const deleted: Deleted = {};
    for (const name of tablesErasedAt(stage)) {
      const { table, column } = tenantData[name];
      const columns = sql.join(
        (returned[name] ?? [column]).map((c) => sql.identifier(c)),
        sql`, `,
      );
      const { rows } = await tx.execute<Record<string, unknown>>(
        sql`DELETE FROM ${sql.identifier(table)} WHERE ${sql.identifier(column)} = ${job.tenantId} RETURNING ${columns}`,
      );
      deleted[name] = rows;
    }
    await alongside[stage]?.(tx, job, deleted);
    return Object.fromEntries(Object.entries(deleted).map(([name, rows]) => [name, rows.length]));
  });
}

/** Rows that still name the tenant, in every table an earlier stage emptied (core/tenant-data.ts). */
async function leftovers(db: Pick<ControlPlane, "execute">, tenantId: string): Promise<EraseLeftovers> {
  const counts = sql.join(
    erasedTables.map((name) => {
      const { table, column } = tenantData[name];
      return sql`(SELECT count(*) FROM ${sql.identifier(table)} WHERE ${sql.identifier(column)} = ${tenantId})::int AS ${sql.identifier(name)}`;
    }),
    sql`, `,
  );
  const { rows } = await db.execute<Record<ErasedTable, number>>(sql`SELECT ${counts}`);
  const row = rows[0];
  return Object.fromEntries(erasedTables.map((name) => [name, Number(row?.[name] ?? 0)])) as EraseLeftovers;
}

export type CommitOutcome =
  | { kind: "committed"; erasedAt: Date }
  | { kind: "already"; erasedAt: Date }
  | { kind: "recheck_failed"; verdict: Extract<RecheckVerdict, { ok: false }> }
  | { kind: "moved" };

/**
 * `commit`: one transaction. The tenant's catalog row is locked first (a key issue waits behind
 * it, then finds no tenant), the re-check runs, and only if nothing was written for the tenant
 * during the erase: the catalog row goes (its ordinal stays retired: identities never go back),
 * the job row becomes the tombstone, and the one `tenant.erase` audit row is written. If the
 * re-check finds rows, the job goes back to the earliest stage that removes them.
 */
export function commitErase(db: ControlPlane, job: EraseJob): Promise<CommitOutcome> {
  return db.transaction(async (tx): Promise<CommitOutcome> => {
    await tx.select({ id: tenants.id }).from(tenants).where(eq(tenants.id, job.tenantId)).for("update");
    const [current] = await tx
      .select()
      .from(tenantErasures)
      .where(eq(tenantErasures.ordinal, job.ordinal))
      .for("update");
    if (!current) return { kind: "moved" };
    if (current.state === "erased") return { kind: "already", erasedAt: current.erasedAt ?? new Date() };
    if (current.stage !== "commit") return { kind: "moved" };
    const verdict = recheckVerdict(await leftovers(tx, job.tenantId));
    if (!verdict.ok) {
      await tx
        .update(tenantErasures)
        .set({ stage: verdict.resumeAt, lastError: verdict.summary, updatedAt: sql`now()` })
        .where(eq(tenantErasures.ordinal, job.ordinal));
      return { kind: "recheck_failed", verdict };
    }
    await tx.delete(tenants).where(and(eq(tenants.id, job.tenantId), eq(tenants.ordinal, job.ordinal)));
    const [tomb] = await tx
      .update(tenantErasures)
      .set({
        state: "erased",
        erasedAt: sql`now()`,
        updatedAt: sql`now()`,
        lastError: null,
        databaseName: null,
        roleName: null,
      })
      .where(eq(tenantErasures.ordinal, job.ordinal))
      .returning();
    const erasedAt = tomb?.erasedAt ?? new Date();
    await writeAudit(tx, {
      actor: current.actor,
      action: "tenant.erase",
      tenantId: job.tenantId,
      detail: {
        ordinal: job.ordinal,
        requestedAt: current.startedAt.toISOString(),
        erasedAt: erasedAt.toISOString(),
        forced: current.forced,
        // A customer's database was detached, never dropped.
        database: current.detached ? "detached" : "dropped",
        attempts: current.attempts,
        stages: current.counts,
      },
    });
    return { kind: "committed", erasedAt };
  });
}

/** The job's status as an erase request or resume answers it. */
export function eraseStatusOf(job: EraseJob): EraseStatus {
  if (job.state === "erased") {
    return {
      state: "erased",
      erasedAt: (job.erasedAt ?? job.updatedAt).toISOString(),
      ...(job.detached ? { database: "detached" as const } : {}),
    };
  }
  return {
    state: "erasing",
    stage: job.stage,
    startedAt: job.startedAt.toISOString(),
    attempts: job.attempts,
    lastError: job.lastError,
  };
}
