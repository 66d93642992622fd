/**
 * What a refused start means, decided once (issue 42): the host's budget answered a generation's
 * admission with no, or could not answer at all. The lifecycle records `reason`; the caller gets
 * `code` with its retry hint. Pure: src/tenant-object/pool/index.ts turns it into the event and the error.
 */
import type { TunnelFault } from "./tunnel.ts";

/** The budget's no, as `BudgetObject.admit` answers it (src/rpc/budget.ts), or no answer at all. */
export type AdmissionAnswer =
  | { kind: "unanswered" }
  | {
      kind: "refused";
      retryAfterMs: number;
      closed?: true;
      unfit?: string;
      tunnel?: TunnelFault;
    };

export type StartRefusal =
  /** The tenant is being erased: no pool of it is admitted. */
  | { reason: "tenant_erasing"; code: "tenant_erasing"; retryAfterSeconds: number }
  /** The host cannot run Lessor: `missing` is what its admin lacks. */
  | { reason: "host_unfit"; code: "host_unfit"; retryAfterSeconds: number; missing: string }
  /** The tenant's own tunnel is full, or its breaker is open: only tenants behind it see this. */
  | {
      reason: `tunnel_${TunnelFault}`;
      code: "tunnel_unavailable";
      retryAfterSeconds: number;
      fault: TunnelFault;
    }
  /** No room on the host in time, or the budget's object restarted mid-call. */
  | {
      reason: "capacity_saturated" | "budget_unavailable";
      code: "capacity_saturated";
      retryAfterSeconds: number;
    };

/** The one mapping of a refused admission to what the lifecycle records and the caller is told. */
export function startRefusal(answer: AdmissionAnswer): StartRefusal {
  if (answer.kind === "unanswered") {
    // Whatever the budget reserved is released by the caller (or reconciled): try again soon.
    return { reason: "budget_unavailable", code: "capacity_saturated", retryAfterSeconds: 1 };
  }
  const retryAfterSeconds = answer.retryAfterMs / 1000;
  // An erase's closed gate comes first: it is not a capacity problem, and it does not go away soon.
  if (answer.closed) return { reason: "tenant_erasing", code: "tenant_erasing", retryAfterSeconds: 5 };
  if (answer.unfit !== undefined)
    return { reason: "host_unfit", code: "host_unfit", retryAfterSeconds, missing: answer.unfit };
  if (answer.tunnel !== undefined) {
    return {
      reason: `tunnel_${answer.tunnel}`,
      code: "tunnel_unavailable",
      retryAfterSeconds,
      fault: answer.tunnel,
    };
  }
  return { reason: "capacity_saturated", code: "capacity_saturated", retryAfterSeconds };
}
