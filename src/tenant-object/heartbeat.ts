/**
 * The object's one alarm, a heartbeat while the pool is warm: reclaims abandoned session leases
 * and any lease held past its bound (pool.ts `reclaimOverdueLeases`), reports an overdue drain, drains an idle pool (core/lifecycle.ts decides), tells the budget how
 * the pool is used, reviews an adaptive pool's size (sizing.ts), flushes the outboxes, and re-arms for the next thing due. Every step is safe to
 * run twice or to be cut short: a restarted object re-arms from what storage holds.
 */
import { idleDecision } from "../core/lifecycle.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { detached } from "../tenant-context/index.ts";
import type { TenantDrain } from "./drain.ts";
import type { TenantErase } from "./erase.ts";
import type { TenantMove } from "./move.ts";
import { flushOutboxes, hasPendingOutbox } from "./outbox.ts";
import type { TenantPool } from "./pool/index.ts";
import { heartbeatMs, type TenantRuntime } from "./runtime.ts";
import type { SessionLeases } from "./sessions.ts";

export async function heartbeat(
  rt: TenantRuntime,
  rooms: {
    pool: TenantPool;
    sessions: SessionLeases;
    drain: TenantDrain;
    erase: TenantErase;
    move: TenantMove;
  },
): Promise<void> {
  const { pool, sessions, drain } = rooms;
  const now = Date.now();
  if (rt.erase) {
    // An erase owns the object: it ends the leases and the pool in its own stages, flushes nothing
    // (what the outboxes hold is the tenant's, and goes with the object's storage), and arms the
    // alarm itself.
    await rooms.erase.tick();
    return;
  }
  if (rt.move) {
    // A move owns the object: its drain ends the leases and the pool, flushes the outboxes, and
    // arms the alarm itself; once moved, the object is a pointer with nothing to look after.
    await rooms.move.tick();
    return;
  }
  await detached(() => sessions.reclaimExpired(now));
  pool.reclaimOverdueLeases(now);
  drain.reportOverdue(now);
  const decision = idleDecision({
    state: rt.lifecycle.state,
    leases: pool.leases,
    idleSince: pool.idleSinceReady,
    now,
    idleTimeoutMs: rt.config.idleTimeoutMs,
    heartbeatMs,
  });
  let nextReview: number | null = null;
  if (decision.kind === "drain" && !rt.lifecycle.migrating) await pool.stop("idle_timeout");
  else {
    await pool.reportToBudget().catch(() => undefined);
    // Adaptive hosts: give back what sat idle (sizing.ts; the policy is core/adaptive.ts).
    nextReview = await pool.sizing.review(now).catch((error: unknown) => {
      logEvent("warn", "pool_review_failed", { tenant: rt.tenantId, failure: describeFailure(error) });
      return null;
    });
  }
  pool.persistLastUsed();
  await flushOutboxes(rt).catch((error: unknown) =>
    logEvent("warn", "outbox_flush_failed", { tenant: rt.tenantId, failure: describeFailure(error) }),
  );
  const wakeups = [
    decision.kind === "rearm" ? decision.at : null,
    nextReview,
    rt.lifecycle.state === "draining" ? now + heartbeatMs : null,
    hasPendingOutbox(rt) ? now + heartbeatMs : null,
  ].filter((t): t is number => t !== null);
  // Session TTLs and the holders' key expiries are the alarm's registered wakers (kernel/alarm.ts).
  await rt.alarms.rearm(wakeups.length > 0 ? Math.min(...wakeups) : null, now + 100);
}
