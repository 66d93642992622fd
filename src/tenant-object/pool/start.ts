/**
 * The start of a generation, step by step (single flight is the pool's: index.ts `acquire`): the
 * control-plane claim of the generation number, the jitter after a restart, the budget's admission,
 * the credential, the driver pool and its proof, the budget's confirmation and the alarm. Each
 * refusal is decided once (src/core/start-refusal.ts) and each failure classified once
 * (src/core/lifecycle.ts `classifyStartFailure`); a start that did not come up releases its
 * allocation and closes what it opened before it answers.
 */
import type { Pool } from "@neondatabase/serverless";
import {
  beginStart,
  classifyStartFailure,
  type FailureReason,
  startFailed,
  startRefused,
  startSucceeded,
} from "../../core/lifecycle.ts";
import { restartJitterMs } from "../../core/placement.ts";
import { type StartRefusal, startRefusal } from "../../core/start-refusal.ts";
import { tunnelFaultOf } from "../../core/tunnel.ts";
import { describeFailure, LessorError } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { type ConnectionTarget, endPool } from "../../postgres/index.ts";
import type { AdmitResult, PoolReport } from "../../rpc/budget.ts";
import type { TenantRecord } from "../../rpc/tenant.ts";
import { tunnelUnavailable } from "../../tenant-db/customer.ts";
import { heartbeatMs, type TenantRuntime } from "../runtime.ts";
import type { JwtCredential, TenantCredentials } from "./credentials.ts";
import type { GenerationOpener } from "./open.ts";
import type { PoolSizing } from "./sizing.ts";

/** A generation that came up: what the pool serves from once it is installed. */
export interface StartedGeneration {
  pool: Pool;
  generation: number;
  target: ConnectionTarget;
  /** Connections it may hold, both kinds together (its ledger row's size). */
  size: number;
  jwtCredential: JwtCredential;
}

/** What a start needs of the pool: its parts, and the one place a started generation is installed. */
export interface StartingPool {
  readonly credentials: TenantCredentials;
  readonly opener: GenerationOpener;
  readonly sizing: PoolSizing;
  /** Makes the started generation the one leases go to (same turn as the lifecycle's `startSucceeded`). */
  install(started: StartedGeneration): void;
  report(): PoolReport;
}

export class GenerationStart {
  constructor(
    private readonly rt: TenantRuntime,
    private readonly pool: StartingPool,
  ) {}

  async start(record: TenantRecord): Promise<void> {
    const rt = this.rt;
    rt.apply(beginStart(rt.lifecycle), rt.lifecycle.state === "failed" ? "retry" : "demand");
    // The control-plane work comes before the budget admission, so a start never holds a share of
    // the host's budget while it waits for a control-plane session: in a storm of cold starts the
    // budget goes to starts that are ready to connect. A start the budget then refuses leaves its
    // generation number claimed in the ledger, unused (numbers only need to be unique).
    let sealed: string;
    try {
      sealed = await this.pool.opener.claimGeneration(record);
    } catch (error) {
      throw await this.startFailed(error);
    }
    const generation = rt.lifecycle.generation;
    const budget = rt.budget(record.host);
    // After a restart (a deploy restarts every object), pools come back spread over a moment
    // rather than all in the same one (src/core/placement.ts).
    if (rt.fencePending) await sleep(restartJitterMs(Math.random(), rt.config.admissionWaitMs));
    // A fixed pool reserves its tier's size; an adaptive one its start size, and says its floor.
    const bounds = this.pool.sizing.bounds(record);
    let admitted: AdmitResult;
    try {
      admitted = await budget.admit(
        record.host,
        record.tenantId,
        generation,
        bounds.start,
        bounds.adaptive ? bounds.floor : null,
      );
    } catch (error) {
      // The budget object restarted mid-call. Whatever it reserved is released (or reconciled).
      logEvent("warn", "budget_unavailable", {
        tenant: record.tenantId,
        generation,
        failure: describeFailure(error),
      });
      await budget.release(record.host, record.tenantId, generation).catch(() => undefined);
      throw this.refused(startRefusal({ kind: "unanswered" }));
    }
    if (!admitted.granted) throw this.refused(startRefusal({ kind: "refused", ...admitted }));
    let pool: Pool | null = null;
    try {
      const credential = await this.pool.credentials.open(record, sealed);
      const jwtCredential = await this.pool.credentials.openJwt(record, credential);
      pool = this.pool.opener.open(record, generation, credential, bounds.start);
      // One connection proves the credentials and the database before the pool is declared ready.
      pool = await this.pool.opener.prove(pool, record, generation, credential, bounds.start);
      this.pool.install({ pool, generation, target: credential.target, size: bounds.start, jwtCredential });
      rt.usage.poolStarts++;
      rt.apply(startSucceeded(rt.lifecycle), "pool_ready");
      // The tunnel carried a start: its breaker closes.
      if (record.adopted) await budget.recordTunnelOutcome(record.host, "ok").catch(() => undefined);
      await budget.confirm(record.host, record.tenantId, generation, this.pool.report());
      await rt.alarms.wakeBy(Date.now() + Math.min(heartbeatMs, rt.config.idleTimeoutMs));
      // An adaptive pool above its floor is reviewed once a window has passed (sizing.ts).
      const review = this.pool.sizing.nextReviewAt();
      if (review !== null) await rt.alarms.wakeBy(review);
    } catch (error) {
      if (pool) await endPool(pool);
      await budget.release(record.host, record.tenantId, generation).catch(() => undefined);
      throw await this.startFailed(error);
    }
  }

  /** A start the budget refused (core/start-refusal.ts): the lifecycle records why, the caller is told. */
  private refused(refusal: StartRefusal): LessorError {
    this.rt.apply(startRefused(this.rt.lifecycle), refusal.reason);
    const { retryAfterSeconds } = refusal;
    switch (refusal.code) {
      case "tunnel_unavailable":
        return tunnelUnavailable(refusal.fault, retryAfterSeconds);
      case "host_unfit":
        return new LessorError("host_unfit", { internal: refusal.missing, retryAfterSeconds });
      default:
        return new LessorError(refusal.code, { retryAfterSeconds });
    }
  }

  /**
   * Settles a start that did not come up: the lifecycle learns why, and the error to answer with is
   * returned. A refusal (no budget, no control plane) opened no connection and needs no backoff; a
   * failure of the tenant's database backs off (`startFailed`).
   */
  private async startFailed(error: unknown): Promise<LessorError> {
    const rt = this.rt;
    if (
      error instanceof LessorError &&
      (error.code === "capacity_saturated" || error.code === "control_plane_unavailable")
    ) {
      rt.apply(startRefused(rt.lifecycle), error.code);
      return error;
    }
    const record = rt.record;
    const reason: FailureReason = adoptedFailure(record, error, classifyStartFailure(error));
    logEvent(
      reason === "misconfigured" || reason === "credential_revoked" ? "error" : "warn",
      "pool_start_failed",
      {
        tenant: record?.tenantId,
        generation: rt.lifecycle.generation,
        reason,
        failure: describeFailure(error),
      },
    );
    // A customer's tunnel learns what the start found out about it (core/tunnel.ts).
    const fault = tunnelFaultOf(reason);
    if (record?.adopted) {
      await rt
        .budget(record.host)
        .recordTunnelOutcome(record.host, fault ?? "ok")
        .catch(() => undefined);
    }
    rt.apply(startFailed(rt.lifecycle, reason, Date.now(), Math.random()), reason);
    await rt.alarms.wakeBy(Date.now() + 1_000);
    const retryAt = rt.lifecycle.retryAt ?? Date.now() + 1_000;
    // Retrying will not help until the operator fixes the configuration: say so.
    if (reason === "misconfigured" && error instanceof LessorError) return error;
    return startFailureError(record, reason, (retryAt - Date.now()) / 1000);
  }
}

/**
 * What a failed start of a customer's database says, beyond the driver's error: a credential the
 * server refused is one its customer revoked or changed (Lessor owns no role there to repair), and
 * a lost `CONNECT` likewise. Any other tenant's reason stays as classified.
 */
function adoptedFailure(record: TenantRecord | null, error: unknown, reason: FailureReason): FailureReason {
  if (!record?.adopted) return reason;
  const code = (error as { code?: unknown }).code;
  if (reason === "auth_failed" || code === "42501") return "credential_revoked";
  return reason;
}

/**
 * The answer to a start that failed (or is backing off after one): on a customer's database a
 * refused credential (`credential_revoked`) and a tunnel that is slow or down (`tunnel_unavailable`)
 * are told apart from everything else (`tenant_starting_failed`).
 */
export function startFailureError(
  record: TenantRecord | null,
  reason: FailureReason,
  retryAfterSeconds: number,
): LessorError {
  if (record?.adopted) {
    if (reason === "credential_revoked") {
      return new LessorError("credential_revoked", {
        internal: "the customer's database refused the credential",
        retryAfterSeconds,
      });
    }
    const fault = tunnelFaultOf(reason);
    if (fault) return tunnelUnavailable(fault, retryAfterSeconds);
  }
  // The host's transport was refused (docs/adr/027): say which, so the operator knows what to fix.
  if (reason === "tls_refused" || reason === "auth_method_refused") {
    return new LessorError(reason === "tls_refused" ? "host_tls_refused" : "host_auth_refused", {
      internal: `start failed (${reason})`,
      retryAfterSeconds,
    });
  }
  return new LessorError("tenant_starting_failed", {
    internal: `start failed (${reason})`,
    retryAfterSeconds,
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
