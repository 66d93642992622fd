/**
 * The object's start: what storage holds comes back (record, gates, lifecycle, usage), a restart's
 * dead generations are released and fenced, and the alarm is armed for what a killed instance left
 * running. An object that never served a tenant has nothing (and creates nothing).
 */
import { recoverAfterRestart } from "../../core/lifecycle.ts";
import type { TenantAuth } from "../auth.ts";
import type { TenantPool } from "../pool/index.ts";
import type { TenantRuntime } from "../runtime.ts";

export async function restoreObject(rt: TenantRuntime, auth: TenantAuth, pool: TenantPool): Promise<void> {
  if (!rt.storage.hasTables()) return;
  await rt.storage.open();
  auth.restoreRecord();
  rt.pinned = rt.storage.read("pinned") ?? false;
  rt.fencePending = rt.storage.read("fence") ?? false;
  rt.erase = rt.storage.read("erase");
  rt.move = rt.storage.read("move");
  rt.lifecycle = { ...rt.lifecycle, ...(rt.storage.read("lifecycle") ?? {}) };
  pool.restoreLastUsed();
  const { lifecycle, deadGenerations } = recoverAfterRestart(rt.lifecycle);
  if (deadGenerations.length > 0 || lifecycle.migrating !== rt.lifecycle.migrating) {
    // No pool survives a restart: the persisted generations are dead, whatever they claimed (a
    // rotation's old and new generation included: neither is left running).
    rt.apply(lifecycle, "object_restarted");
  }
  if (deadGenerations.length > 0) rt.requireFence();
  // Usage a killed instance answered for but did not stage: the heartbeat flushes it.
  const unstagedUsage = rt.restoreUsage();
  if (rt.record) {
    const { host, tenantId } = rt.record;
    for (const dead of deadGenerations) {
      rt.ctx.waitUntil(
        rt
          .budget(host)
          .release(host, tenantId, dead)
          .catch(() => undefined),
      );
    }
  }
  // A move not committed yet resumes from the alarm (a killed instance's runner is gone).
  const moveRunning = rt.move !== null && rt.move.committed !== true;
  if (rt.storage.pendingOutboxRows() > 0 || unstagedUsage || rt.erasing || moveRunning) {
    await rt.alarms.wakeBy(Date.now() + 1_000);
  }
}
