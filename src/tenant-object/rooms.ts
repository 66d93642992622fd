/**
 * The tenant object's capabilities, each installed once (src/tenant-object/index.ts is the RPC
 * front over them; docs/architecture.md lists what each room owns, docs/adr/026 why the kernel):
 *
 *     kernel/   the gate, the holder registry, access re-checks, the one alarm, the start
 *     runtime   shared state; the one place the lifecycle changes (decided by the core)
 *     auth      the tenant record and the key check
 *     pool      admission, single-flight start, generation ledger, leases, stop (sizing: adaptive size)
 *     queries   `/sql` on a pooled connection      sessions  session leases, TTL, reclaim
 *     wire      Postgres wire protocol connections drains    operator drain and budget eviction
 *     migration schema migrations                  rotation  credentials through overlapping generations
 *     erasure   the staged erase                   moves     the staged move to another region
 */
import { TenantAuth } from "./auth.ts";
import { TenantDrain } from "./drain.ts";
import { TenantErase } from "./erase.ts";
import { installAccess } from "./kernel/access.ts";
import { TenantGate } from "./kernel/gate.ts";
import { SchemaMigration } from "./migrate.ts";
import { TenantMove } from "./move.ts";
import { TenantPool } from "./pool/index.ts";
import { TenantQueries } from "./query.ts";
import { CredentialRotation } from "./rotation.ts";
import { TenantRuntime } from "./runtime.ts";
import { SessionLeases } from "./sessions.ts";
import { WireConnections } from "./wire.ts";

export interface TenantRooms {
  rt: TenantRuntime;
  gate: TenantGate;
  auth: TenantAuth;
  pool: TenantPool;
  queries: TenantQueries;
  sessions: SessionLeases;
  wire: WireConnections;
  drains: TenantDrain;
  migration: SchemaMigration;
  rotation: CredentialRotation;
  erasure: TenantErase;
  moves: TenantMove;
}

/** Builds every room of one tenant object, wired to each other once. */
export function installRooms(ctx: DurableObjectState, env: Env): TenantRooms {
  const rt = new TenantRuntime(ctx, env);
  installAccess(rt);
  const auth = new TenantAuth(rt);
  const rooms: Partial<TenantRooms> = {};
  const pool = new TenantPool(rt, {
    migrationDone: () => rooms.migration?.done ?? null,
    onIdle: () => {
      if (rt.lifecycle.state === "draining") void rooms.drains?.finishIfIdle();
    },
    credentialChange: () => rooms.rotation?.inProgress ?? null,
    onRetired: (generation) => rooms.rotation?.retired(generation),
    onRepair: (repair, count) => {
      const host = rt.record?.host;
      if (host)
        ctx.waitUntil(
          rt
            .budget(host)
            .recordRepairs(repair, count)
            .catch(() => undefined),
        );
    },
  });
  rt.holders.onLeave = () => pool.holderLeft();
  const sessions = new SessionLeases(rt, auth, pool);
  const built: TenantRooms = {
    rt,
    gate: new TenantGate(rt),
    auth,
    pool,
    queries: new TenantQueries(rt, auth, pool),
    sessions,
    wire: new WireConnections(rt, auth, pool, sessions),
    drains: new TenantDrain(rt, pool),
    migration: new SchemaMigration(rt, auth, pool),
    rotation: new CredentialRotation(rt, auth, pool),
    erasure: new TenantErase(rt, auth, pool),
    moves: new TenantMove(rt, auth, pool),
  };
  Object.assign(rooms, built);
  return built;
}
