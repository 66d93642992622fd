/**
 * Restart truth on a database host: the budget ledger says which pools Lessor holds; the host's
 * `pg_stat_activity` says which backends really exist. A pooled backend is named
 * `lessor:<role>:<generation>`; if no TenantObject confirms that generation (its object was killed,
 * its tenant is gone), the backend is an orphan: it holds a connection of the budget that nothing
 * will ever use or close, so it is terminated.
 */
import { inArray } from "drizzle-orm";
import type { DatabaseHost, LessorConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { tenants } from "../control-plane/schema.ts";
import { generationOfApplicationName } from "../core/names.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { tenantObjectOnHost } from "../placement/index.ts";
import { withHostAdmin } from "./maintenance.ts";

/** Backends younger than this are left alone: their generation may still be starting. */
export const orphanMinAgeMs = 30_000;

export interface OrphanReport {
  /** Pooled Lessor backends looked at. */
  checked: number;
  /** Of those, terminated because no object confirms their generation. */
  terminated: number;
}

interface Backend {
  pid: number;
  role: string;
  generation: number;
}

/** Finds and terminates the orphaned pooled backends of `host`. Idempotent; safe at any time. */
export async function reapOrphanBackends(
  env: Env,
  config: LessorConfig,
  host: DatabaseHost,
  minAgeMs: number = orphanMinAgeMs,
): Promise<OrphanReport> {
  return withHostAdmin(env, config, host, { purpose: "reconcile", tenantId: null }, async (admin) => {
    const { rows } = await admin.query(
      `SELECT a.pid, a.usename, a.application_name FROM pg_catalog.pg_stat_activity a
        WHERE a.application_name OPERATOR(pg_catalog.~) '^lessor:(t_[0-9a-f]{16}|tenant_[a-z0-9-]{1,40}):[0-9]+$'
          AND a.backend_start OPERATOR(pg_catalog.<)
              (pg_catalog.now() OPERATOR(pg_catalog.-)
               pg_catalog.make_interval(secs => $1::pg_catalog.float8 OPERATOR(pg_catalog./) 1000))`,
      [minAgeMs],
    );
    const backends: Backend[] = [];
    for (const row of rows as { pid: number; usename: string; application_name: string }[]) {
      const generation = generationOfApplicationName(row.usename, row.application_name);
      if (generation !== null) backends.push({ pid: Number(row.pid), role: row.usename, generation });
    }
    if (backends.length === 0) return { checked: 0, terminated: 0 };
    const roles = [...new Set(backends.map((b) => b.role))];
    // The host's tenants are in its region's catalog, and only there.
    const owners = await withControlPlane(config, env, host.region, (db) =>
      db
        .select({ id: tenants.id, role: tenants.roleName })
        .from(tenants)
        .where(inArray(tenants.roleName, roles)),
    );
    const tenantOfRole = new Map(owners.map((o) => [o.role, o.id]));
    const verdicts = new Map<string, boolean>();
    const orphans: number[] = [];
    for (const backend of backends) {
      const key = `${backend.role}:${backend.generation}`;
      let live = verdicts.get(key);
      if (live === undefined) {
        const tenantId = tenantOfRole.get(backend.role);
        try {
          live = tenantId
            ? await tenantObjectOnHost(env, host.name, tenantId).holdsGeneration(backend.generation)
            : false;
        } catch (error) {
          // Not knowing is not evidence: leave it for the next run.
          logEvent("warn", "orphan_probe_failed", { host: host.name, failure: describeFailure(error) });
          live = true;
        }
        verdicts.set(key, live);
      }
      if (!live) orphans.push(backend.pid);
    }
    if (orphans.length === 0) return { checked: backends.length, terminated: 0 };
    const { rows: ended } = await admin.query(
      `SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(o.pid, 5000))::pg_catalog.int4 AS n
         FROM pg_catalog.unnest($1::pg_catalog.int4[]) AS o(pid)`,
      [orphans],
    );
    const terminated = Number((ended[0] as { n: number } | undefined)?.n ?? 0);
    logEvent("warn", "orphan_backends_terminated", { host: host.name, terminated });
    return { checked: backends.length, terminated };
  });
}
