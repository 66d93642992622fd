/**
 * The audit log (control-plane table `audit_log`): who did what to which tenant or campaign, and
 * when. Operator actions write a row (tenant create, disable, enable, drain, pin, unpin, erase;
 * campaign create, pause, resume, cancel; each reseal batch that moved credentials); `GET /v1/audit` reads them, newest first, paged; the
 * `audit-retention` cron job ages them out after `LESSOR_AUDIT_RETENTION_DAYS`.
 *
 * A row never holds a secret or tenant data: the actor is a fingerprint of the admin key (the
 * first 12 hex digits of its SHA-256, enough to tell keys apart, useless to recover one), and the
 * detail holds counts and names.
 */
import { and, desc, eq, inArray, lt, sql } from "drizzle-orm";
import type { ControlPlane } from "../control-plane/index.ts";
import { auditLog } from "../control-plane/schema.ts";
import { toHex } from "../crypto/encoding.ts";

/** Every action Lessor audits. */
export const auditActions = [
  "tenant.create",
  "tenant.disable",
  "tenant.enable",
  "tenant.drain",
  "tenant.pin",
  "tenant.unpin",
  "tenant.erase",
  "tenant.attach",
  "tenant.detach",
  "tenant.credentials",
  "tenant.move",
  "campaign.create",
  "campaign.pause",
  "campaign.resume",
  "campaign.cancel",
  "credentials.reseal",
] as const;

export type AuditAction = (typeof auditActions)[number];

export interface AuditEntry {
  actor: string;
  action: AuditAction;
  tenantId: string | null;
  detail: Record<string, unknown>;
}

/** The actor an admin key stands for: `admin:` and the first 12 hex digits of the key's SHA-256. */
export async function adminActor(adminKey: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(adminKey));
  return `admin:${toHex(new Uint8Array(digest)).slice(0, 12)}`;
}

/** Appends one row. Call it inside the transaction of the action it records, where there is one. */
export async function writeAudit(db: Pick<ControlPlane, "insert">, entry: AuditEntry): Promise<void> {
  await db.insert(auditLog).values({
    actor: entry.actor,
    action: entry.action,
    tenantId: entry.tenantId,
    detail: entry.detail,
  });
}

export type AuditRow = typeof auditLog.$inferSelect;

/** Newest-first page of the log, optionally for one tenant and some actions; the cursor is the last id. */
export function listAudit(
  db: ControlPlane,
  options: {
    tenantId: string | null;
    actions: readonly string[] | null;
    before: number | null;
    limit: number;
  },
): Promise<AuditRow[]> {
  return db
    .select()
    .from(auditLog)
    .where(
      and(
        options.tenantId === null ? undefined : eq(auditLog.tenantId, options.tenantId),
        options.actions === null ? undefined : inArray(auditLog.action, [...options.actions]),
        options.before === null ? undefined : lt(auditLog.id, options.before),
      ),
    )
    .orderBy(desc(auditLog.id))
    .limit(options.limit);
}

/** The public view of a row. */
export function publicAuditRow(row: AuditRow) {
  return {
    id: row.id,
    at: row.at.toISOString(),
    actor: row.actor,
    action: row.action,
    tenant: row.tenantId,
    detail: row.detail,
  };
}

/**
 * Deletes rows older than `before`, at most `batch` of them (oldest first), and says how many. A
 * backlog bigger than one batch goes over the next ticks.
 */
export async function trimAudit(db: ControlPlane, before: Date, batch: number): Promise<number> {
  const { rows } = await db.execute<{ n: number }>(sql`
    WITH old AS (
      SELECT id FROM ${auditLog} WHERE ${auditLog.at} < ${before.toISOString()}::timestamptz
      ORDER BY ${auditLog.at} LIMIT ${batch}
    ), gone AS (
      DELETE FROM ${auditLog} WHERE id IN (SELECT id FROM old) RETURNING 1
    )
    SELECT count(*)::int AS n FROM gone`);
  return Number(rows[0]?.n ?? 0);
}
