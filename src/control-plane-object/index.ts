/**
 * ControlPlaneObject: a few Durable Objects (shards) that hold Lessor's connections to the
 * control-plane database, so that a cold start, an outbox flush, a catalog lookup or a cron job
 * borrows a warm connection instead of paying a SCRAM handshake each
 * (docs/adr/010-control-plane-pool-and-maintenance-reserve.md).
 *
 * A caller opens a session (one pooled connection, checked out for it), runs statements on it by
 * RPC, and closes it; `withControlPlane` (src/control-plane/index.ts) does this around drizzle, so
 * callers use drizzle and transactions as before. A session whose caller vanished is reclaimed
 * after `sessionIdleMs` without a statement: rolled back, its locks released, its connection reset.
 */
import { DurableObject } from "cloudflare:workers";
import type { Pool, PoolClient } from "@neondatabase/serverless";
import { loadConfig } from "../config/index.ts";
import { postgresErrorBody } from "../core/neon-protocol.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { openControlPlanePool } from "../postgres/index.ts";
import type { RemoteQueryResult, RemoteSessionAnswer } from "../rpc/control-plane.ts";

/** A session with no statement for this long is presumed abandoned and reclaimed. */
const sessionIdleMs = 30_000;
/** Sessions one shard holds at once, at most (callers beyond wait in the pool's queue). */
const maxSessions = 64;

/** Every value stays text: the caller's drizzle parses types as it would on a direct connection. */
const rawTextTypes = { getTypeParser: () => (value: string) => value };

interface Session {
  client: PoolClient;
  reclaim: ReturnType<typeof setTimeout>;
}

/**
 * What a session's connection is reset with before it goes back to the pool. `BEGIN; ROLLBACK` ends
 * a transaction the session left open, and on an idle connection (nearly every session) writes
 * nothing to the server's log, where a bare `ROLLBACK` writes a WARNING (there is no transaction in
 * progress) for every session: one per warm pool's heartbeat flush. A session left in a failed
 * transaction makes `BEGIN` fail, and its connection is destroyed instead of returned.
 */
const resetSql = "BEGIN; ROLLBACK; SELECT pg_catalog.pg_advisory_unlock_all(); RESET ALL";

export class ControlPlaneObject extends DurableObject<Env> {
  private pool: Pool | null = null;
  /** The region whose control plane this shard's pool reaches (a shard serves one region). */
  private region: string | null = null;
  private readonly sessions = new Map<string, Session>();

  private getPool(region: string): Pool {
    if (this.pool === null) {
      const config = loadConfig(this.env);
      const url = config.regions.get(region)?.controlPlaneUrl;
      if (url === undefined) throw new Error(`control plane of unknown region ${region}`);
      this.region = region;
      this.pool = openControlPlanePool(config, url, (error) =>
        logEvent("warn", "control_plane_connection_error", { region, failure: describeFailure(error) }),
      );
    }
    return this.pool;
  }

  /**
   * Checks out a connection of `region`'s control plane for a new session, named `applicationName`
   * while it lasts; `control_plane_unavailable` if none can be had. A shard is named for its region
   * (src/core/placement.ts) and serves no other: asked for another, it refuses.
   */
  async open(applicationName: string, region: string): Promise<RemoteSessionAnswer<string>> {
    if (this.region !== null && this.region !== region) {
      return {
        ok: false,
        error: new LessorError("misconfigured", {
          internal: `a shard of region ${this.region} was asked for region ${region}`,
        }).toWire(),
      };
    }
    if (this.sessions.size >= maxSessions) {
      return {
        ok: false,
        error: new LessorError("control_plane_unavailable", { retryAfterSeconds: 1 }).toWire(),
      };
    }
    let client: PoolClient;
    try {
      client = await this.getPool(region).connect();
    } catch (error) {
      logEvent("warn", "control_plane_unreachable", { region, failure: describeFailure(error) });
      return {
        ok: false,
        error: new LessorError("control_plane_unavailable", { retryAfterSeconds: 2 }).toWire(),
      };
    }
    try {
      // The pool's connections are named lessor-control-plane; a job that wants to be seen as
      // itself renames its session (RESET ALL at close names it back).
      if (applicationName !== "lessor-control-plane") {
        await client.query("SELECT set_config('application_name', $1, false)", [applicationName]);
      }
    } catch (error) {
      client.release(error instanceof Error ? error : new Error("control-plane connection lost"));
      return {
        ok: false,
        error: new LessorError("control_plane_unavailable", { retryAfterSeconds: 1 }).toWire(),
      };
    }
    const id = crypto.randomUUID();
    this.sessions.set(id, { client, reclaim: setTimeout(() => this.reclaim(id), sessionIdleMs) });
    return { ok: true, value: id };
  }

  /** Runs one statement on the session's connection; values come back as Postgres text. */
  async query(
    sessionId: string,
    text: string,
    values: unknown[],
  ): Promise<RemoteSessionAnswer<RemoteQueryResult>> {
    const session = this.sessions.get(sessionId);
    if (!session) {
      return {
        ok: false,
        error: new LessorError("control_plane_unavailable", { retryAfterSeconds: 1 }).toWire(),
      };
    }
    clearTimeout(session.reclaim);
    session.reclaim = setTimeout(() => this.reclaim(sessionId), sessionIdleMs);
    try {
      const raw = (await session.client.query({
        text,
        values: values.length > 0 ? values : undefined,
        rowMode: "array",
        types: rawTextTypes,
      })) as unknown as RawResult | RawResult[];
      const results = Array.isArray(raw) ? raw : [raw];
      const last = results.at(-1);
      return {
        ok: true,
        value: {
          command: last?.command ?? "",
          rowCount: last?.rowCount ?? null,
          fields: (last?.fields ?? []).map((field) => ({ name: field.name, dataTypeID: field.dataTypeID })),
          rows: last?.rows ?? [],
        },
      };
    } catch (error) {
      const postgres = postgresErrorBody(error);
      if (postgres) return { ok: false, postgres };
      // The connection died under the statement: the session cannot go on.
      this.end(sessionId, error instanceof Error ? error : new Error("control-plane connection lost"));
      return {
        ok: false,
        error: new LessorError("control_plane_unavailable", {
          internal: "control-plane connection lost",
          retryAfterSeconds: 1,
        }).toWire(),
      };
    }
  }

  /** Ends a session: its connection is reset and returned (or destroyed, if it cannot be reset). */
  async close(sessionId: string): Promise<void> {
    const session = this.sessions.get(sessionId);
    if (!session) return;
    this.sessions.delete(sessionId);
    clearTimeout(session.reclaim);
    const failed = await session.client.query(resetSql).then(
      () => undefined,
      (error: unknown) => (error instanceof Error ? error : new Error("reset failed")),
    );
    session.client.release(failed);
  }

  /** How many sessions are open, and how many connections the pool holds (for tests and status). */
  async stats(): Promise<{ sessions: number; connections: number; idle: number; waiting: number }> {
    const pool = this.pool;
    return {
      sessions: this.sessions.size,
      connections: pool?.totalCount ?? 0,
      idle: pool?.idleCount ?? 0,
      waiting: pool?.waitingCount ?? 0,
    };
  }

  private reclaim(sessionId: string): void {
    logEvent("warn", "control_plane_session_reclaimed", { idleMs: sessionIdleMs });
    this.ctx.waitUntil(this.close(sessionId));
  }

  private end(sessionId: string, error: Error): void {
    const session = this.sessions.get(sessionId);
    if (!session) return;
    this.sessions.delete(sessionId);
    clearTimeout(session.reclaim);
    session.client.release(error);
  }
}

interface RawResult {
  command: string;
  rowCount: number | null;
  fields: { name: string; dataTypeID: number }[];
  rows: (string | null)[][];
}
