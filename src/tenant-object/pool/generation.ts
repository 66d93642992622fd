/**
 * One generation's connections: the driver pool of the tenant role, the end users' pool (JWT mode,
 * docs/adr/012-end-user-jwts.md, opened on first use), and the checkout of the two kinds sharing the
 * generation's one maximum. core/shared-capacity.ts decides what a checkout or a give-back does;
 * this applies it. The tenant's pool (index.ts) holds the current generation and the one a rotation
 * replaced; a lease carries the generation it was taken on, so a checkout never asks which one.
 *
 * A driver pool hands an idle connection over on its next tick: until then the connection is
 * claimed (`idleClaims`), so two checkouts never count on the same idle one. A connection closed to
 * make room for the other kind counts (`closingForRoom`) until its backend has exited, so the two
 * kinds never hold more than the maximum and the budget never gets back a place Postgres counts.
 */
import type { Pool, PoolClient } from "@neondatabase/serverless";
import { poolApplicationName } from "../../core/names.ts";
import {
  checkoutStep,
  giveBackAmount,
  giveBackFrom,
  keptAfterGiveBack,
  type SideCounts,
} from "../../core/shared-capacity.ts";
import { describeFailure, LessorError } from "../../errors/index.ts";
import { logEventSampled } from "../../log/index.ts";
import { type ConnectionTarget, endPool, openPool, terminateAndWait } from "../../postgres/index.ts";
import { driverPoolMax, setDriverPoolMax } from "../../postgres/internals.ts";
import { sessionLimits } from "../../tenant-db/connect.ts";
import type { TenantRuntime } from "../runtime.ts";
import { markEndedOnPurpose, trackTransactionStatus, wasEndedOnPurpose } from "./connection-state.ts";
import type { JwtCredential, TenantCredentials } from "./credentials.ts";
import { type GenerationOpener, ownBackendsFenceSql } from "./open.ts";
import type { PoolSizing } from "./sizing.ts";

/** Who a connection is logged in as: the tenant role, or the tenant's end-user login role. */
export type ConnectionKind = "tenant" | "jwt";

/** A bound on the passes of a give-back beyond the connections it gives back. */
const maxPoolSizeBound = 8;

/** How long a checkout waits for a connection of the shared capacity (the driver pool's own bound). */
const checkoutWaitMs = 10_000;

/** What a generation needs of the pool that holds it. */
export interface GenerationHost {
  readonly rt: TenantRuntime;
  readonly sizing: PoolSizing;
  readonly credentials: TenantCredentials;
  readonly opener: GenerationOpener;
  /** A credential change in progress, if one is. */
  credentialChange(): Promise<unknown> | null;
  /** The generation new leases go to, if one is open. */
  current(): Generation | null;
  /** The generation a rotation replaced, while it still serves its leases. */
  retiring(): Generation | null;
  /** A connection of `generation` failed on its own (not ended on purpose). */
  onPoolError(generation: number, error: Error): void;
}

/** A generation's parts as its start or a rotation's preparation opened them. */
export interface GenerationParts {
  pool: Pool;
  target: ConnectionTarget;
  jwtCredential: JwtCredential;
  /** Connections it was admitted with, both kinds together (its allowance once it serves). */
  size: number;
}

/** A checkout refused because a rotation moved the credential: retry on the current generation. */
export class CredentialMoved extends Error {
  constructor() {
    super("the credential moved to a new generation during checkout");
  }
}

export class Generation {
  readonly pool: Pool;
  readonly target: ConnectionTarget;
  private readonly jwtCredential: JwtCredential;
  /** Connections the generation may hold, both kinds together. */
  private max: number;
  /** The end-user pool, opened on first use. */
  private jwtPool: Pool | null = null;
  /** Whether the end-user pool's first connection has ended what a dead generation left. */
  private jwtFenced = false;
  /** Checkouts waiting for an idle connection the driver pool hands over on its next tick. */
  private readonly idleClaims = new WeakMap<Pool, number>();
  /** Connections closed to make room whose close has not completed. */
  private closingForRoom = 0;
  /** Checkouts waiting for a connection of either kind to come back. */
  private readonly capacityWaiters: (() => void)[] = [];

  constructor(
    private readonly host: GenerationHost,
    readonly number: number,
    parts: GenerationParts,
  ) {
    this.pool = parts.pool;
    this.target = parts.target;
    this.jwtCredential = parts.jwtCredential;
    this.max = parts.size;
  }

  /** Connections the generation may hold, both kinds together: what its ledger row holds. */
  get allowance(): number {
    return this.max;
  }

  private get isCurrent(): boolean {
    return this.host.current() === this;
  }

  private get isRetiring(): boolean {
    return this.host.retiring() === this;
  }

  /** Checkouts waiting now because every connection of the generation is in use. */
  waitingCheckouts(): number {
    return this.pool.waitingCount + (this.jwtPool?.waitingCount ?? 0) + this.capacityWaiters.length;
  }

  /** The host admitted `by` more connections: the driver pools may open them now. */
  raiseAllowance(by: number): void {
    if (by <= 0) return;
    this.setMax(this.max + by);
    this.wakeCapacityWaiters();
  }

  private setMax(max: number): void {
    this.max = max;
    setDriverPoolMax(this.pool, max);
    if (this.jwtPool) setDriverPoolMax(this.jwtPool, max);
  }

  /**
   * Lowers the allowance by up to `want` (never below `lowest`) and closes idle connections until
   * the generation holds no more than it; resolves with how many connections of allowance it gave
   * back. Only idle connections are closed, each one's backend gone before this resolves, so the
   * budget never gives away a connection that still exists: a connection checked out meanwhile
   * stays, and is not given back. Relative to the allowance on purpose: a growth admitted while
   * this runs adds up with it in either order.
   */
  async giveBackIdle(want: number, lowest: number): Promise<number> {
    if (this.waitingCheckouts() > 0) return 0;
    const lowered = giveBackAmount(want, this.max, lowest);
    if (lowered <= 0) return 0;
    this.setMax(this.max - lowered);
    const open = () => this.pool.totalCount + (this.jwtPool?.totalCount ?? 0) + this.closingForRoom;
    // Bounded: each pass closes one idle connection, or stops.
    for (let pass = 0; pass < lowered + maxPoolSizeBound && open() > this.max; pass++) {
      const jwtPool = this.jwtPool;
      const side = giveBackFrom(this.countsOf(this.pool), jwtPool ? this.countsOf(jwtPool) : null);
      const from = side === "tenant" ? this.pool : side === "jwt" ? jwtPool : null;
      if (!from) break;
      await this.closeIdle(from, "given back to the host's budget");
    }
    // The generation stopped meanwhile: its whole allocation goes with it, nothing to give back here.
    if (!this.isCurrent) return 0;
    // Connections checked out while this ran are still open: the allowance keeps them.
    const kept = keptAfterGiveBack(lowered, open(), this.max);
    if (kept > 0) this.setMax(this.max + kept);
    return lowered - kept;
  }

  /**
   * A connection of `kind`, tracked so it is never returned inside a transaction. While the
   * generation has no end-user pool, this is the driver pool's own checkout.
   */
  async checkout(kind: ConnectionKind): Promise<PoolClient> {
    // A retiring generation's lease (a rotation) uses its own pool as it is.
    if (kind === "tenant" && (!this.jwtPool || !this.isCurrent)) return this.checkoutFrom(this.pool);
    const jwtPool = this.endUserPool();
    const own = kind === "jwt" ? jwtPool : this.pool;
    const other = kind === "jwt" ? this.pool : jwtPool;
    const deadline = Date.now() + checkoutWaitMs;
    // Bounded: every pass takes a connection, closes one, or waits until the deadline.
    for (;;) {
      const step = checkoutStep(this.countsOf(own), this.countsOf(other), this.closingForRoom, this.max);
      if (step === "take") {
        const client = await this.claiming(own, () => this.checkoutFrom(own)).catch((error: unknown) =>
          this.repairJwt(kind, own, error),
        );
        // Only the current generation's first end-user connection fences. A rotation may have
        // switched generations while this checkout waited: this generation then still serves the
        // lease, and the new one fences on its own first use.
        if (kind === "jwt" && this.isCurrent && !this.jwtFenced) await this.fenceJwt(client);
        return client;
      }
      if (step === "close_other") {
        await this.closeIdle(other, "closed to make room for the other kind");
        continue;
      }
      const returned = this.capacityReturned(deadline);
      // Queued now: the pool's growth sees this checkout waiting.
      this.host.sizing.onQueued();
      if (!(await returned)) {
        this.host.sizing.onRefusal();
        throw new LessorError("lease_timeout", {
          internal: "no connection of the shared capacity came back",
        });
      }
    }
  }

  /** Signs claims for the backend `pid` of an end-user connection (src/crypto/jwt-claims.ts). */
  signClaims(pid: number, claims: string): Promise<string> {
    return this.jwtCredential.signClaims(pid, claims);
  }

  /** Ends both driver pools, bounded (`endPool`); says whether a connection had to be cut. */
  async close(): Promise<"ended" | "forced"> {
    const outcomes = await Promise.all([endPool(this.pool), this.jwtPool ? endPool(this.jwtPool) : "ended"]);
    return outcomes.includes("forced") ? "forced" : "ended";
  }

  /** Closes one idle connection of `pool` (claimed, so no checkout counts on it meanwhile). */
  private async closeIdle(pool: Pool, why: string): Promise<void> {
    const idle = await this.claiming(pool, () => pool.connect());
    markEndedOnPurpose(idle);
    this.closingForRoom++;
    try {
      await terminateAndWait(idle);
    } finally {
      this.closingForRoom--;
      idle.release(new Error(why));
    }
  }

  private claimsOn(pool: Pool): number {
    return this.idleClaims.get(pool) ?? 0;
  }

  /** A driver pool's counts for the capacity decisions (core/shared-capacity.ts). */
  private countsOf(pool: Pool): SideCounts {
    return { total: pool.totalCount, idle: pool.idleCount, claimed: this.claimsOn(pool) };
  }

  /** Runs a checkout from `pool` counted as a claim on one of its idle connections until it settles. */
  private async claiming<T>(pool: Pool, checkout: () => Promise<T>): Promise<T> {
    const claimsIdle = pool.idleCount > 0;
    if (claimsIdle) this.idleClaims.set(pool, this.claimsOn(pool) + 1);
    try {
      return await checkout();
    } finally {
      if (claimsIdle) this.idleClaims.set(pool, this.claimsOn(pool) - 1);
    }
  }

  private async checkoutFrom(pool: Pool): Promise<PoolClient> {
    const { rt, sizing } = this.host;
    const current = this.isCurrent;
    const queuedAt = Date.now();
    try {
      const connecting = pool.connect();
      // connect() has queued the checkout or opened a connection, synchronously: more checkouts now
      // wait than idle connections and room for new ones can serve, so this one waits for a release,
      // and the pool may grow.
      const queued =
        current && pool.waitingCount > pool.idleCount + Math.max(0, driverPoolMax(pool) - pool.totalCount);
      if (queued) sizing.onQueued();
      const client = await connecting;
      if (queued) sizing.onWait(Date.now() - queuedAt);
      trackTransactionStatus(client, (error) => this.host.onPoolError(this.number, error));
      return client;
    } catch (error) {
      const code = (error as { code?: unknown }).code;
      const change = this.host.credentialChange();
      logEventSampled("warn", "pool_checkout_failed", rt.tenantId, {
        tenant: rt.tenantId,
        current,
        rotating: change !== null,
        code: typeof code === "string" ? code : null,
        failure: describeFailure(error),
      });
      // A login refused while the credential changes (or on a generation it replaced) is the
      // rotation's doing, not drift: the request moves to the new generation, nothing is repaired.
      const movable = (current && change !== null) || this.isRetiring;
      if ((code === "28P01" || code === "28000") && movable) {
        if (change) await Promise.race([change.catch(() => undefined), sleep(rt.config.admissionWaitMs)]);
        const now = this.host.current();
        if (now !== null && now !== this) throw new CredentialMoved();
      }
      const timedOut = /timeout/i.test(String(error));
      if (timedOut && current) sizing.onRefusal();
      throw new LessorError(timedOut ? "lease_timeout" : "connection_lost", {
        internal: "pool checkout failed",
        cause: error,
      });
    }
  }

  /** Resolves true when a connection of either kind comes back (or closes), false at the deadline. */
  private capacityReturned(deadline: number): Promise<boolean> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => resolve(false), Math.max(0, deadline - Date.now()));
      this.capacityWaiters.push(() => {
        clearTimeout(timer);
        resolve(true);
      });
    });
  }

  private wakeCapacityWaiters = (): void => {
    for (const wake of this.capacityWaiters.splice(0)) wake();
  };

  /**
   * An end-user connection that could not log in for a reason Lessor cures itself, once: the login
   * role drifted (an end user ran `ALTER ROLE CURRENT_USER …` after `RESET ROLE`: 28P01; its CONNECT
   * went: 42501), or the role is at its connection limit with backends a dead generation left (53300).
   */
  private async repairJwt(kind: ConnectionKind, pool: Pool, error: unknown): Promise<PoolClient> {
    const code = (error as { cause?: { code?: unknown } }).cause?.code;
    const record = this.host.rt.record;
    if (kind !== "jwt" || !record || (code !== "28P01" && code !== "42501" && code !== "53300")) throw error;
    // Never while a credential changes (the role's password is moving on purpose), nor while a
    // replaced generation still serves: its end-user connections are live, not a dead generation's.
    if (this.host.credentialChange() !== null || this.host.retiring() !== null) throw error;
    const credentials = this.host.credentials;
    if (code === "28P01" || code === "42501") await credentials.repairJwt(record, this.jwtCredential);
    else
      await credentials.fenceRole(
        record,
        this.jwtCredential.target.user,
        "end-user role connection limit reached",
      );
    return this.checkoutFrom(pool);
  }

  /** The end-user pool, opened on first use; only the current generation opens one. */
  private endUserPool(): Pool {
    // A rotation switched generations after this lease was taken: nothing ran on it yet, so the
    // request runs once on the new generation (its end-user pool has the new credential).
    if (this.isRetiring) throw new CredentialMoved();
    const record = this.host.rt.record;
    if (!record || !this.isCurrent) throw new LessorError("stale_generation", { retryAfterSeconds: 1 });
    if (this.jwtPool) return this.jwtPool;
    const { rt, opener } = this.host;
    const jwtPool = openPool(rt.config, this.jwtCredential.target, {
      max: this.max,
      // The generation's name: the budget's pg_stat_activity count sees both kinds.
      applicationName: poolApplicationName(record.roleName, this.number),
      limits: sessionLimits(rt.config),
      loginToken: this.jwtCredential.loginToken,
      openingGate: opener.openingGate,
      onError: (error, client) => {
        if (!wasEndedOnPurpose(client)) this.host.onPoolError(this.number, error);
      },
    });
    for (const pool of [this.pool, jwtPool]) {
      pool.on("release", this.wakeCapacityWaiters);
      pool.on("remove", this.wakeCapacityWaiters);
    }
    this.jwtPool = jwtPool;
    this.jwtFenced = false;
    return jwtPool;
  }

  /**
   * The end-user pool's first connection ends the login role's other backends (a dead generation's,
   * after a restart): the role may end its own. Only the generations this object holds are live: the
   * current one, and one a rotation replaced that still finishes its leases.
   */
  private async fenceJwt(client: PoolClient): Promise<void> {
    const record = this.host.rt.record;
    if (!record) return;
    try {
      const retiring = this.host.retiring();
      const live = retiring ? [this.number, retiring.number] : [this.number];
      await client.query(ownBackendsFenceSql, [live.map((g) => poolApplicationName(record.roleName, g))]);
      this.jwtFenced = true;
    } catch (error) {
      client.release(error instanceof Error ? error : new Error("fence failed"));
      throw new LessorError("connection_lost", { internal: "end-user pool fence failed", cause: error });
    }
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
