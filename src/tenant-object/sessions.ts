/**
 * Session leases: one pinned connection of the current generation across requests (an
 * interactive transaction). A lease's TTL restarts at every use, but never past its absolute
 * lifetime (`LESSOR_LEASE_MAX_LIFETIME_MS`), so renewing it cannot keep a connection forever; the
 * alarm reclaims a lease whose owner went away (reset, return the connection). Each statement runs
 * within the same bounds as `/sql` (watchdog.ts). Only the token's hash is kept, in memory and in
 * storage, so a restarted object can tell a stale or expired lease from one that never existed.
 */
import type { PoolClient } from "@neondatabase/serverless";
import type { Statement } from "../core/neon-protocol.ts";
import { encodeResult, type OutputMode } from "../core/result-shape.ts";
import { randomHex } from "../crypto/encoding.ts";
import { hashKey } from "../crypto/keys.ts";
import { LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import type { ConnectionTarget } from "../postgres/index.ts";
import {
  type KeyProof,
  type SessionOpened,
  type SqlOutcome,
  sessionTokenPrefix,
  type TenantRecord,
  type Verdict,
} from "../rpc/tenant.ts";
import { requireTenantScope, withTenantScope } from "../tenant-context/index.ts";
import { asLessorError, sqlFailure } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { ResponseBudget, runStatement } from "./execute.ts";
import { admitHolder } from "./kernel/access.ts";
import { isConnectionFatal, markEndedOnPurpose, resetConnection } from "./pool/connection-state.ts";
import type { LiveLease, TenantPool } from "./pool/index.ts";
import type { TenantRuntime } from "./runtime.ts";
import { StatementWatchdog } from "./watchdog.ts";

/** A token of a dead lease is still recognised this long after it expired. */
const tokenMemoryMs = 24 * 3600_000;

export interface Session {
  tokenHash: string;
  /** The key the lease was opened with: revoking it ends the lease. */
  keyId: string;
  client: PoolClient;
  /** The pool's lease this session holds (released once, when the session ends). */
  lease: LiveLease;
  generation: number;
  target: ConnectionTarget;
  ttlMs: number;
  expiresAt: number;
  /** The lease ends at this instant whatever its use. */
  endsAt: number;
  createdAt: number;
  busy: boolean;
  /** Leaves the holder registry (kernel/holders.ts). */
  leave: () => void;
}

export class SessionLeases {
  private readonly sessions = new Map<string, Session>();
  /** Opens in flight: counted against the limit before their awaits, so concurrent opens cannot overshoot. */
  private opening = 0;
  /** Wire connections in session mode (src/tenant-object/wire.ts): session leases of their own kind. */
  private wireHeld = 0;

  constructor(
    private readonly rt: TenantRuntime,
    private readonly auth: TenantAuth,
    private readonly pool: TenantPool,
  ) {
    // The alarm reclaims a lease whose TTL passed (the heartbeat's `reclaimExpired`).
    rt.alarms.register("session_ttl", () => {
      let next: number | null = null;
      for (const session of this.sessions.values()) {
        if (next === null || session.expiresAt < next) next = session.expiresAt;
      }
      return next;
    });
  }

  get size(): number {
    return this.sessions.size;
  }

  /** Every open session (for drain reports and the alarm). */
  all(): Session[] {
    return [...this.sessions.values()];
  }

  /** Opens a session lease: one connection of the current generation, pinned until released or expired. */
  async open(tenantId: string, proof: KeyProof, ttlMs: number): Promise<SessionOpened> {
    let counted = false;
    try {
      const record = await this.auth.authenticate(tenantId, proof);
      const ttl = Math.min(Math.max(1_000, Math.floor(ttlMs)), this.rt.config.leaseMaxTtlMs);
      // Checked and counted with no await in between: the limit holds under concurrency. The limit
      // is the most connections the pool may hold: its tier's maximum on an adaptive host (it grows
      // to hold them), its size on a fixed one.
      if (this.sessions.size + this.opening + this.wireHeld >= this.pool.sizing.bounds(record).max) {
        throw new LessorError("lease_limit", { retryAfterSeconds: 1 });
      }
      this.opening++;
      counted = true;
      const lease = await this.pool.acquire(record, "session");
      let client: PoolClient;
      try {
        this.auth.refuseIfDisabled();
        client = await this.pool.checkout(lease);
      } catch (error) {
        this.pool.release(lease);
        throw error;
      }
      const token = `${sessionTokenPrefix}${tenantId}_${randomHex(24)}`;
      const tokenHash = await hashKey(token);
      const now = Date.now();
      const endsAt = now + this.rt.config.leaseMaxLifetimeMs;
      const session: Session = {
        tokenHash,
        keyId: proof.keyId,
        client,
        lease,
        generation: lease.generation,
        target: lease.target,
        ttlMs: ttl,
        expiresAt: Math.min(now + ttl, endsAt),
        endsAt,
        createdAt: now,
        busy: false,
        leave: () => undefined,
      };
      try {
        // Admitted with its access checked again now: the key may have expired while it waited.
        session.leave = admitHolder(this.rt, {
          kind: "session_lease",
          keyId: proof.keyId,
          leased: () => true,
          end: (error) => this.end(session, error, error.code === "stale_generation" ? "stale" : "lost"),
        });
      } catch (error) {
        client.release();
        this.pool.release(lease);
        throw error;
      }
      this.sessions.set(tokenHash, session);
      // Reclaimed as overdue (its alarm never ended it): the session ends as a lost one.
      this.pool.onAbandon(lease, () => this.end(session, new Error("lease reclaimed"), "lost"));
      this.rt.storage.rememberSessionToken(tokenHash, lease.generation, session.expiresAt);
      await this.rt.alarms.wakeBy(session.expiresAt);
      return {
        ok: true,
        lease: token,
        generation: lease.generation,
        expiresAt: new Date(session.expiresAt).toISOString(),
      };
    } catch (error) {
      return { ok: false, error: asLessorError(this.rt.tenantId, error).toWire() };
    } finally {
      if (counted) this.opening--;
    }
  }

  /**
   * Counts a session-mode wire connection against the same limit as session leases (the most
   * connections the pool may hold), or refuses it with `lease_limit`; `releaseForWire` gives the slot back.
   */
  holdForWire(record: TenantRecord): void {
    if (this.sessions.size + this.opening + this.wireHeld >= this.pool.sizing.bounds(record).max) {
      throw new LessorError("lease_limit", { retryAfterSeconds: 1 });
    }
    this.wireHeld++;
  }

  releaseForWire(): void {
    this.wireHeld = Math.max(0, this.wireHeld - 1);
  }

  /** Runs one statement on a session lease's pinned connection, extending its TTL. */
  async sql(
    tenantId: string,
    proof: KeyProof,
    token: string,
    statement: Statement,
    output: OutputMode,
  ): Promise<SqlOutcome> {
    let authenticated = false;
    try {
      const record = await this.auth.authenticate(tenantId, proof, "lease");
      authenticated = true;
      const session = await this.find(token);
      if (session.busy) {
        throw new LessorError("invalid_request", {
          publicMessage: "This lease is already running a statement.",
        });
      }
      session.busy = true;
      this.pool.markUsed();
      try {
        const result = await this.run(record, session, statement, output);
        this.rt.usage.queries++;
        this.rt.usage.rowsReturned += result.rows.length;
        return { ok: true, json: encodeResult(result) };
      } finally {
        session.busy = false;
        if (this.sessions.has(session.tokenHash)) {
          session.expiresAt = Math.min(Date.now() + session.ttlMs, session.endsAt);
          await this.rt.alarms.wakeBy(session.expiresAt);
        }
      }
    } catch (error) {
      return sqlFailure(this.rt.tenantId, error, authenticated);
    }
  }

  private async run(record: TenantRecord, session: Session, statement: Statement, output: OutputMode) {
    const watchdog = new StatementWatchdog(
      this.rt,
      this.pool.credentials,
      record,
      session.target,
      session.client,
    );
    watchdog.arm();
    try {
      return await withTenantScope(
        {
          tenantId: record.tenantId,
          generation: session.generation,
          leaseId: session.tokenHash.slice(0, 12),
        },
        () => {
          requireTenantScope(record.tenantId);
          return runStatement(
            session.client,
            statement,
            new ResponseBudget(this.rt.config.maxResponseBytes, output),
            watchdog.onOverrun,
          );
        },
      );
    } catch (error) {
      this.rt.usage.queries++;
      this.rt.usage.errors++;
      const stopped = watchdog.connectionSuspect;
      if (stopped || (!(error instanceof LessorError) && isConnectionFatal(error))) {
        // The connection is gone (or may be hit by a late cancel): so is the transaction.
        this.end(session, error instanceof Error ? error : new Error("connection lost"), "lost");
        throw (
          watchdog.refusal(error) ??
          (error instanceof LessorError
            ? error
            : new LessorError("connection_lost", { internal: "session connection failed", cause: error }))
        );
      }
      throw error;
    } finally {
      watchdog.disarm();
    }
  }

  /** Releases a session lease: rolls back anything open and returns the connection clean. */
  async close(tenantId: string, proof: KeyProof, token: string): Promise<Verdict> {
    try {
      await this.auth.authenticate(tenantId, proof, "lease");
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
      // The current generation's, or a retiring one's: a rotation lets a lease finish where it began.
      if (!this.pool.generations.serves(session.generation)) {
        this.end(session, new Error("stale generation"), "stale");
        throw new LessorError("stale_generation", { retryAfterSeconds: 1 });
      }
      if (Date.now() >= session.endsAt) {
        await this.resetAndEnd(session, "lifetime", "expired");
        throw new LessorError("lease_expired");
      }
      return session;
    }
    const known = this.rt.storage.findSessionToken(tokenHash);
    if (known) {
      if (known.ended === "lost") throw new LessorError("lease_lost");
      if (known.ended === "expired") throw new LessorError("lease_expired");
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
    session.leave();
    if (remember === "lost") this.rt.storage.markSessionToken(session.tokenHash, "lost");
    markEndedOnPurpose(session.client);
    session.client.release(destroyWith);
    this.pool.release(session.lease);
  }

  /**
   * Ends a session politely: reset the connection (rolls back anything open) and return it. A
   * released lease is forgotten; a reclaimed one is remembered as expired, so its owner learns why.
   */
  private async resetAndEnd(session: Session, why: string, remember?: "expired"): Promise<void> {
    if (!this.sessions.delete(session.tokenHash)) return;
    session.leave();
    if (remember) this.rt.storage.markSessionToken(session.tokenHash, remember);
    else this.rt.storage.forgetSessionToken(session.tokenHash);
    const broken = await withTenantScope(
      {
        tenantId: this.rt.tenantId,
        generation: session.generation,
        leaseId: `${why}:${session.tokenHash.slice(0, 12)}`,
      },
      () => resetConnection(session.client),
    );
    session.client.release(broken);
    this.pool.release(session.lease);
  }

  /** Reclaims session leases whose owner stopped using them (the TTL passed) or that reached their lifetime. */
  async reclaimExpired(now: number): Promise<void> {
    for (const session of this.all()) {
      if (session.busy || session.expiresAt > now) continue;
      this.rt.reclaimedLeases++;
      logEvent("warn", "lease_reclaimed", {
        tenant: this.rt.tenantId,
        generation: session.generation,
        lease: session.tokenHash.slice(0, 12),
        heldMs: now - session.createdAt,
        reason: now >= session.endsAt ? "lifetime" : "ttl",
      });
      await this.resetAndEnd(session, "reclaim", "expired");
    }
    this.rt.storage.trimSessionTokens(now - tokenMemoryMs);
  }
}
