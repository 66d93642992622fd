/**
 * The hard bounds on a tenant's statement, which its SQL cannot lift (`SET statement_timeout = 0`
 * changes only Postgres's own, soft limit):
 *
 * - past the deadline Lessor sends a CancelRequest; if the statement has not stopped a grace
 *   period later (a PL/pgSQL handler can catch a cancel), the connection is cut and its backend
 *   terminated through the host's admin role;
 * - an answer past its byte budget is drained and dropped (execute.ts); one that floods the wire
 *   gets its connection cut at once.
 *
 * A connection that needed a cancel is never reused: a cancel that arrives after its statement ended
 * could stop the next one.
 */
import type { PoolClient } from "@neondatabase/serverless";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent, logEventSampled } from "../log/index.ts";
import { backendPid, type ConnectionTarget, cutConnection, sendCancel } from "../postgres/index.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import type { Overrun } from "./execute.ts";
import { isConnectionFatal, markEndedOnPurpose } from "./pool/connection-state.ts";
import type { TenantCredentials } from "./pool/credentials.ts";
import type { TenantRuntime } from "./runtime.ts";

/** How long a cancelled statement gets to stop before its connection is cut. */
const cancelGraceMs = 2_000;

export class StatementWatchdog {
  private timedOut = false;
  private suspect = false;
  private unwatch: (() => void) | null = null;
  private grace: ReturnType<typeof setTimeout> | undefined;

  /**
   * @param relayed the connection's traffic is relayed by the wire endpoint (src/tenant-object/wire.ts),
   *   not run by the driver: a cancel goes to whatever its backend runs, and `onTimeout` is told
   */
  constructor(
    private readonly rt: TenantRuntime,
    private readonly credentials: TenantCredentials,
    private readonly record: TenantRecord,
    private readonly target: ConnectionTarget,
    private readonly client: PoolClient,
    private readonly relayed: { onTimeout: () => void } | null = null,
  ) {}

  /** What the statement runner calls when an answer overruns its budget. */
  readonly onOverrun = (why: Overrun): void => {
    if (why === "too_large") {
      logEventSampled("warn", "response_too_large", this.record.tenantId, {
        tenant: this.record.tenantId,
        limitBytes: this.rt.config.maxResponseBytes,
      });
      return;
    }
    if (!this.suspect) this.cut();
  };

  /** Starts the clock: the statement (or the whole `/sql` transaction) must end within the bound. */
  arm(): void {
    this.unwatch?.();
    this.unwatch = this.rt.deadlines.watch(Date.now() + this.rt.config.statementTimeoutMs, () =>
      this.timeout(),
    );
  }

  private timeout(): void {
    if (this.suspect) return;
    this.timedOut = true;
    logEventSampled("warn", "statement_timeout", this.record.tenantId, {
      tenant: this.record.tenantId,
      limitMs: this.rt.config.statementTimeoutMs,
    });
    this.cancel();
    this.relayed?.onTimeout();
  }

  /**
   * Asks the backend to stop what it runs, and cuts the connection if it has not stopped a grace
   * period later. The connection is suspect from now on: it is never reused.
   */
  cancel(): void {
    if (this.suspect) return;
    this.suspect = true;
    this.pause();
    sendCancel(this.rt.config, this.target, this.client, this.relayed !== null);
    this.grace = setTimeout(() => this.cut(), cancelGraceMs);
  }

  /** Stops the statement clock (the statement ended); the grace after a cancel too. */
  disarm(): void {
    this.unwatch?.();
    this.unwatch = null;
    if (this.grace !== undefined) clearTimeout(this.grace);
  }

  /** Stops the statement clock only: a cancel already sent still gets cut at the end of its grace. */
  pause(): void {
    this.unwatch?.();
    this.unwatch = null;
  }

  /** Whether the connection must be destroyed rather than returned (a cancel was sent at it). */
  get connectionSuspect(): boolean {
    return this.suspect;
  }

  /**
   * The refusal to answer instead of whatever the stopped statement raised (`error`). Only Postgres's
   * own word (an error it sent: the cancel's 57014, or the statement's own) proves the statement did
   * not commit. A connection cut before Postgres answered (a statement that swallowed its cancel, or
   * an answer stuck in a stalled network after its commit) leaves the outcome unknown: that is
   * `connection_lost`, as for any connection that died mid-statement, never "did not commit".
   */
  refusal(error: unknown): LessorError | null {
    if (!this.timedOut) return null;
    const bound = `${this.rt.config.statementTimeoutMs} ms (LESSOR_STATEMENT_TIMEOUT_MS)`;
    if (!(error instanceof LessorError) && !isConnectionFatal(error)) {
      return new LessorError("statement_timeout", {
        publicMessage: `The statement ran longer than ${bound} and was stopped; its transaction did not commit.`,
      });
    }
    return new LessorError("connection_lost", {
      publicMessage: `The statement ran longer than ${bound}; its connection was cut before Postgres confirmed that it stopped, so it may or may not have committed.`,
      internal: "statement bound reached; connection cut before Postgres answered",
      cause: error,
    });
  }

  /** The cancel did not stop it (or the answer flooded): cut the connection and end the backend through the admin role. */
  cut(): void {
    this.pause();
    clearTimeout(this.grace);
    this.suspect = true;
    const pid = backendPid(this.client);
    markEndedOnPurpose(this.client);
    cutConnection(this.client);
    if (pid === null) return;
    this.rt.ctx.waitUntil(this.terminateUntilSettled(pid));
  }

  /**
   * Asks the admin role to end the backend until it is known to be gone. A check that could not run
   * (no maintenance slot free, the host unreachable) or a backend still there after its wait does not
   * count as done: it is asked again, backing off, for as long as `terminateRetryDelaysMs` lasts.
   */
  private async terminateUntilSettled(pid: number): Promise<void> {
    const tenant = this.record.tenantId;
    for (const [attempt, delayMs] of [0, ...terminateRetryDelaysMs].entries()) {
      if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
      try {
        const outcome = await this.credentials.terminate(this.record, pid, this.target);
        if (outcome !== "still_running") {
          logEvent("warn", "statement_terminated", { tenant, outcome, attempts: attempt + 1 });
          return;
        }
      } catch (error) {
        logEvent("warn", "statement_terminate_retry", {
          tenant,
          attempt: attempt + 1,
          failure: describeFailure(error),
        });
      }
    }
    logEvent("error", "statement_terminate_unsettled", {
      tenant,
      attempts: terminateRetryDelaysMs.length + 1,
    });
  }
}

/** Waits between the tries to end a cut statement's backend: about two minutes in all. */
export const terminateRetryDelaysMs: readonly number[] = [
  500, 1_000, 2_000, 4_000, 8_000, 15_000, 30_000, 60_000,
];
