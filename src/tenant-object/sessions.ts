/**
 * Session leases: one pinned connection of the current generation across requests (an
 * interactive transaction). A lease's TTL restarts at every use, up to the configured maximum; the
 * alarm reclaims a lease whose owner went away (rollback, discard, return the connection). Only
 * the token's hash is kept, in memory and in storage, so a restarted object can tell a stale lease
 * from one that never existed.
 */
import type { PoolClient } from "@neondatabase/serverless";
import { postgresErrorBody, type Statement } from "../core/neon-protocol.ts";
import { randomHex } from "../crypto/encoding.ts";
import { hashKey } from "../crypto/keys.ts";
import { LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { type SessionOpened, type SqlOutcome, sessionTokenPrefix, type Verdict } from "../rpc/tenant.ts";
import { requireTenantScope, withTenantScope } from "../tenant-context/index.ts";
import { asLessorError, sqlFailure } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { isConnectionFatal, resetConnection } from "./connection-state.ts";
import { runStatement } from "./execute.ts";
import type { TenantPool } from "./pool.ts";
import type { TenantRuntime } from "./runtime.ts";

/** A token of a dead lease is still recognised this long after it expired. */
const tokenMemoryMs = 24 * 3600_000;

export interface Session {
  tokenHash: string;
  client: PoolClient;
  generation: number;
  ttlMs: number;
  expiresAt: number;
  createdAt: number;
  busy: boolean;
}

export class SessionLeases {
  private readonly sessions = new Map<string, Session>();

  constructor(
    private readonly rt: TenantRuntime,
    private readonly auth: TenantAuth,
    private readonly pool: TenantPool,
  ) {}

  get size(): number {
    return this.sessions.size;
  }

  /** Every open session (for drain reports and the alarm). */
  all(): Session[] {
    return [...this.sessions.values()];
  }

  /** Opens a session lease: one connection of the current generation, pinned until released or expired. */
  async open(tenantId: string, keyHash: string, ttlMs: number): Promise<SessionOpened> {
    try {
      const record = await this.auth.authenticate(tenantId, keyHash);
      const ttl = Math.min(Math.max(1_000, Math.floor(ttlMs)), this.rt.config.leaseMaxTtlMs);
      if (this.sessions.size >= record.poolSize) {
        throw new LessorError("lease_limit", { retryAfterSeconds: 1 });
      }
      const lease = await this.pool.acquire(record);
      let client: PoolClient;
      try {
        this.auth.refuseIfDisabled();
        client = await this.pool.checkout(lease.pool);
      } catch (error) {
        this.pool.release();
        throw error;
      }
      const token = `${sessionTokenPrefix}${tenantId}_${randomHex(24)}`;
      const tokenHash = await hashKey(token);
      const now = Date.now();
      const session: Session = {
        tokenHash,
        client,
        generation: lease.generation,
        ttlMs: ttl,
        expiresAt: now + ttl,
        createdAt: now,
        busy: false,
      };
      this.sessions.set(tokenHash, session);
      this.rt.storage.rememberSessionToken(tokenHash, lease.generation, session.expiresAt);
      await this.rt.ensureAlarm(session.expiresAt);
      return {
        ok: true,
        lease: token,
        generation: lease.generation,
        expiresAt: new Date(session.expiresAt).toISOString(),
      };
    } catch (error) {
      return { ok: false, error: asLessorError(this.rt.tenantId, error).toWire() };
    }
  }

  /** Runs one statement on a session lease's pinned connection, extending its TTL. */
  async sql(tenantId: string, keyHash: string, token: string, statement: Statement): Promise<SqlOutcome> {
    try {
      await this.auth.authenticate(tenantId, keyHash);
      const session = await this.find(token);
      if (session.busy) {
        throw new LessorError("invalid_request", {
          publicMessage: "This lease is already running a statement.",
        });
      }
      session.busy = true;
      this.pool.markUsed();
      try {
        const body = await withTenantScope(
          { tenantId, generation: session.generation, leaseId: session.tokenHash.slice(0, 12) },
          () => {
            requireTenantScope(tenantId);
            return runStatement(session.client, statement);
          },
        );
        this.rt.usage.queries++;
        this.rt.usage.rowsReturned += body.rows.length;
        return { ok: true, json: JSON.stringify(body) };
      } catch (error) {
        this.rt.usage.queries++;
        this.rt.usage.errors++;
        if (postgresErrorBody(error) && !isConnectionFatal(error)) throw error;
        // The connection is gone: so is the transaction. End the lease and say so.
        this.end(session, error instanceof Error ? error : new Error("connection lost"), "lost");
        throw new LessorError("connection_lost", { internal: "session connection failed", cause: error });
      } finally {
        session.busy = false;
        if (this.sessions.has(session.tokenHash)) {
          session.expiresAt = Date.now() + session.ttlMs;
          await this.rt.ensureAlarm(session.expiresAt);
        }
      }
    } catch (error) {
      return sqlFailure(this.rt.tenantId, error);
    }
  }

  /** Releases a session lease: rolls back anything open and returns the connection clean. */
  async close(tenantId: string, keyHash: string, token: string): Promise<Verdict> {
    try {
      await this.auth.authenticate(tenantId, keyHash);
      const session = await this.find(token);
      if (session.busy) {
        throw new LessorError("invalid_request", { publicMessage: "This lease is running a statement." });
      }
      await this.resetAndEnd(session, "released");
      return { ok: true };
    } catch (error) {
      return { ok: false, error: asLessorError(this.rt.tenantId, error).toWire() };
    }
  }

  private async find(token: string): Promise<Session> {
    const tokenHash = await hashKey(token);
    const session = this.sessions.get(tokenHash);
    if (session) {
      if (session.generation !== this.rt.lifecycle.generation || !this.pool.isOpen) {
        this.end(session, new Error("stale generation"), "stale");
        throw new LessorError("stale_generation", { retryAfterSeconds: 1 });
      }
      return session;
    }
    const known = this.rt.storage.findSessionToken(tokenHash);
    if (known) {
      if (known.lost) throw new LessorError("lease_lost");
      // Known, but not live in this object: its generation died with a restart or a stop.
      throw new LessorError("stale_generation", { retryAfterSeconds: 1 });
    }
    throw new LessorError("lease_not_found");
  }

  /**
   * Ends a session at once, destroying its connection (used when the connection is suspect). The
   * token stays known, so its owner learns why (`lease_lost` when the connection died,
   * `stale_generation` when its generation ended) rather than that the lease never existed.
   */
  end(session: Session, destroyWith: Error, remember: "lost" | "stale"): void {
    if (!this.sessions.delete(session.tokenHash)) return;
    if (remember === "lost") this.rt.storage.markSessionTokenLost(session.tokenHash);
    session.client.release(destroyWith);
    this.pool.release();
  }

  /** Ends a session politely: roll back, discard session state, and return the connection. */
  private async resetAndEnd(session: Session, why: string): Promise<void> {
    if (!this.sessions.delete(session.tokenHash)) return;
    this.rt.storage.forgetSessionToken(session.tokenHash);
    const broken = await withTenantScope(
      {
        tenantId: this.rt.tenantId,
        generation: session.generation,
        leaseId: `${why}:${session.tokenHash.slice(0, 12)}`,
      },
      () => resetConnection(session.client, true),
    );
    session.client.release(broken);
    this.pool.release();
  }

  /** Reclaims session leases whose owner stopped using them (the TTL passed). */
  async reclaimExpired(now: number): Promise<void> {
    for (const session of this.all()) {
      if (session.busy || session.expiresAt > now) continue;
      this.rt.reclaimedLeases++;
      logEvent("warn", "lease_reclaimed", {
        tenant: this.rt.tenantId,
        generation: session.generation,
        lease: session.tokenHash.slice(0, 12),
        heldMs: now - session.createdAt,
      });
      await this.resetAndEnd(session, "reclaim");
    }
    this.rt.storage.trimSessionTokens(now - tokenMemoryMs);
  }
}
