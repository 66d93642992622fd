/**
 * Cron job: age the audit log out after `LESSOR_AUDIT_RETENTION_DAYS` (oldest first, a bounded
 * batch per tick). Idempotent.
 */
import { trimAudit } from "../../audit/index.ts";
import { loadConfig } from "../../config/index.ts";
import { withControlPlane } from "../../control-plane/index.ts";
import type { CronJob } from "../fan-out.ts";

/** Rows one tick deletes at most; a bigger backlog goes over the next ticks. */
const batch = 5_000;

export const auditRetentionJob: CronJob = {
  name: "audit-retention",
  // Once per fleet sweep (docs/adr/028-a-fleet-that-sleeps.md): never urgent, and it reads the control plane.
  slow: true,
  timeoutMs: 30_000,
  async run(env, tick) {
    const config = loadConfig(env);
    const before = new Date(tick.scheduledTime - config.auditRetentionDays * 86_400_000);
    const trimmed = await withControlPlane(config, env, tick.region, (db) => trimAudit(db, before, batch));
    return {
      summary: `aged out ${trimmed} audit row(s) older than ${config.auditRetentionDays} days`,
      fields: { trimmed, retentionDays: config.auditRetentionDays },
      changed: trimmed > 0,
    };
  },
};
