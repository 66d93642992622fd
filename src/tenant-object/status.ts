/** The object's runtime status for `GET /v1/tenants/:id` (no secrets). */
import type { TenantRuntimeStatus } from "../rpc/tenant.ts";
import type { TenantDrain } from "./drain.ts";
import type { TenantPool } from "./pool/index.ts";
import type { TenantRuntime } from "./runtime.ts";
import type { SessionLeases } from "./sessions.ts";

export function runtimeStatus(
  rt: TenantRuntime,
  rooms: { pool: TenantPool; sessions: SessionLeases; drains: TenantDrain },
): TenantRuntimeStatus {
  const { pool, sessions, drains } = rooms;
  const { lifecycle: lc, record, config } = rt;
  const now = Date.now();
  const iso = (at: number | null) => (at === null ? null : new Date(at).toISOString());
  const drain = drains.current;
  return {
    state: lc.state,
    generation: lc.generation,
    poolSize: record?.poolSize ?? null,
    leases: pool.leases,
    lastUsedAt: iso(pool.lastUsedAt),
    idleSince: iso(pool.idleSinceReady),
    failureReason: lc.state === "failed" ? lc.failureReason : null,
    retryAt: lc.state === "failed" ? iso(lc.retryAt) : null,
    pendingEvents: rt.storage.pendingOutboxRows(),
    sessions: sessions.size,
    pinned: rt.pinned,
    migrating: lc.migrating,
    schemaVersion: record?.schemaVersion ?? null,
    drain: drain
      ? {
          startedAt: new Date(drain.startedAt).toISOString(),
          overdue: now - drain.startedAt > config.maxDrainMs,
          heldLeases: sessions.all().map((s) => ({
            lease: s.tokenHash.slice(0, 12),
            ageMs: now - s.createdAt,
          })),
        }
      : null,
    reclaimedLeases: rt.reclaimedLeases,
    retiring: pool.generations.retiringStatus,
    rotatingTo: lc.rotatingTo,
    erasing: rt.erasing,
    move: rt.move ? { state: rt.move.state, to: rt.move.to } : null,
    storageRowsWritten: rt.storage.rowsWritten,
    pool: pool.sizing.status(),
  };
}
