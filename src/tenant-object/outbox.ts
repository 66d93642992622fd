/**
 * The object's two durable outboxes (lifecycle events, usage deltas) and their flush to the
 * control plane (docs/adr/005-object-outbox.md). Each append there is idempotent on
 * (tenant, seq), so a flush that dies after the append and before the local delete is harmless.
 */
import { appendLifecycleEvents, recordKeyUses, withControlPlane } from "../control-plane/index.ts";
import { appendUsageDeltas, isZeroUsage } from "../usage/index.ts";
import { writeCatalogSchemaVersion } from "./migrate.ts";
import type { TenantRuntime } from "./runtime.ts";
import { type FlushStep, tenantHooksForTests } from "./test-hooks.ts";

/** Appends both outboxes to the control plane in one connection, then forgets what was appended. */
export async function flushOutboxes(rt: TenantRuntime): Promise<void> {
  const record = rt.record;
  rt.stageUsage();
  const events = rt.storage.pendingEvents();
  const usage = rt.storage.pendingUsage();
  const keyUses = new Map(rt.keyUses);
  const catalogVersion = rt.storage.read("pendingCatalogSchemaVersion");
  if (
    !record ||
    (events.length === 0 && usage.length === 0 && keyUses.size === 0 && catalogVersion === null)
  ) {
    return;
  }
  await withControlPlane(rt.config, rt.env, rt.region, async (db) => {
    // From here on the rows may reach the control plane even if the flush fails before forgetting them.
    rt.storage.markAttempted(events.at(-1)?.seq ?? null, usage.at(-1)?.seq ?? null);
    await appendLifecycleEvents(db, record.tenantId, events);
    await flushStep(rt, record.tenantId, "events_appended");
    await appendUsageDeltas(db, record.tenantId, usage);
    await recordKeyUses(db, record.tenantId, keyUses);
    if (catalogVersion !== null) await writeCatalogSchemaVersion(db, record.tenantId, catalogVersion);
  });
  await flushStep(rt, record.tenantId, "appended");
  if (catalogVersion !== null && rt.storage.read("pendingCatalogSchemaVersion") === catalogVersion) {
    rt.storage.forget("pendingCatalogSchemaVersion");
  }
  // Forget only what was written: a use noted meanwhile (a later minute) waits for the next flush.
  for (const [keyId, minute] of keyUses) if (rt.keyUses.get(keyId) === minute) rt.keyUses.delete(keyId);
  const lastEvent = events.at(-1);
  if (lastEvent) rt.storage.forgetEvents(lastEvent.seq);
  const lastUsage = usage.at(-1);
  if (lastUsage) rt.storage.forgetUsage(lastUsage.seq);
}

/** A test's hook at a named step of the flush (test-hooks.ts); nothing in production. */
async function flushStep(rt: TenantRuntime, tenantId: string, step: FlushStep): Promise<void> {
  const hook = tenantHooksForTests.onFlushStep;
  if (hook) await hook({ tenantId, step, abortObject: (why) => rt.ctx.abort(why) });
}

/** Whether anything waits to be flushed (staged rows, or counters not yet staged). */
export function hasPendingOutbox(rt: TenantRuntime): boolean {
  return (
    rt.storage.pendingOutboxRows() > 0 ||
    !isZeroUsage(rt.usage) ||
    rt.keyUses.size > 0 ||
    rt.storage.read("pendingCatalogSchemaVersion") !== null
  );
}
