/**
 * Cron job: the scheduled credential rotation (issue 14, docs/adr/013). With
 * `LESSOR_CREDENTIAL_ROTATION_DAYS` set, each tick rotates at most `LESSOR_CREDENTIAL_ROTATION_BATCH`
 * active tenants whose credential is older than that, oldest first, two at a time, through the same
 * path as `POST /v1/tenants/:id/rotate-credentials`. A rotation refused now (no room in the rotation
 * reserve, a busy tenant) leaves the credential's age unchanged, so the next tick tries it again:
 * progress is the catalog's `sealed_at`, and the job is safe to run twice or to be cut short.
 */
import { and, asc, eq, lt, sql } from "drizzle-orm";
import { type LessorConfig, loadConfig } from "../../config/index.ts";
import { type ControlPlane, withControlPlane } from "../../control-plane/index.ts";
import { adoptedDatabases, tenantCredentials, tenants } from "../../control-plane/schema.ts";
import { describeFailure } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { tenantObject } from "../../placement/index.ts";
import type { CronJob } from "../fan-out.ts";

/**
 * A tenant whose credential Lessor may change: every tenant on Lessor's hosts, and an adopted one
 * whose customer let Lessor manage its role's password (`credentials: "lessor"`). A customer-managed
 * credential changes only when its customer supplies a new one.
 */
const lessorManaged = sql`NOT EXISTS (SELECT 1 FROM ${adoptedDatabases} a WHERE a.tenant_id = ${tenants.id} AND a.credential_policy = 'customer')`;

/** Active tenants whose credential Lessor manages and is older than the policy, oldest first. */
export function dueForRotation(db: ControlPlane, days: number, limit: number): Promise<{ id: string }[]> {
  return db
    .select({ id: tenants.id })
    .from(tenants)
    .innerJoin(tenantCredentials, eq(tenantCredentials.tenantId, tenants.id))
    .where(
      and(
        eq(tenants.status, "active"),
        lt(tenantCredentials.sealedAt, sql`now() - make_interval(days => ${days})`),
        lessorManaged,
      ),
    )
    .orderBy(asc(tenantCredentials.sealedAt))
    .limit(limit);
}

/** The fleet's rotation progress: how many active tenants the policy says are due now. */
export async function rotationProgress(
  db: ControlPlane,
  config: LessorConfig,
): Promise<{ policyDays: number | null; due: number }> {
  const days = config.credentialRotationDays;
  if (days === null) return { policyDays: null, due: 0 };
  const [row] = await db
    .select({ due: sql<number>`count(*)::int` })
    .from(tenants)
    .innerJoin(tenantCredentials, eq(tenantCredentials.tenantId, tenants.id))
    .where(
      and(
        eq(tenants.status, "active"),
        lt(tenantCredentials.sealedAt, sql`now() - make_interval(days => ${days})`),
        lessorManaged,
      ),
    );
  return { policyDays: days, due: Number(row?.due ?? 0) };
}

export const credentialRotationJob: CronJob = {
  name: "credential-rotation",
  timeoutMs: 50_000,
  async run(env, tick) {
    const config = loadConfig(env);
    const days = config.credentialRotationDays;
    if (days === null) {
      return {
        summary: "no rotation policy (LESSOR_CREDENTIAL_ROTATION_DAYS unset)",
        fields: {},
        level: "info",
        changed: false,
      };
    }
    const due = await withControlPlane(config, env, tick.region, (db) =>
      dueForRotation(db, days, config.credentialRotationBatch),
    );
    let rotated = 0;
    let deferred = 0;
    const queue = [...due];
    const worker = async () => {
      for (let next = queue.shift(); next; next = queue.shift()) {
        try {
          const outcome = await tenantObject(env, tick.region, next.id).rotateCredentials(next.id);
          if (outcome.ok) rotated++;
          else deferred++;
        } catch (error) {
          deferred++;
          logEvent("warn", "scheduled_rotation_failed", { tenant: next.id, failure: describeFailure(error) });
        }
      }
    };
    await Promise.all([worker(), worker()]);
    return {
      summary: `rotated ${rotated} of ${due.length} due credentials (older than ${days} days); ${deferred} deferred to the next tick`,
      fields: { due: due.length, rotated, deferred },
      level: deferred > 0 ? "warn" : "info",
      changed: due.length > 0,
    };
  },
};
