/**
 * The one gate every RPC of the tenant object passes (docs/adr/026-tenant-object-kernel.md): the
 * RPC names its purpose, the table in src/core/tenant-gate.ts answers for the tenant's state, and
 * this turns the answer into the refusal a caller gets (`tenant_moved` naming the region) or the new
 * owner's stub to forward to. Nothing in the object checks the erase or the move gate by hand.
 */
import {
  type GateDecision,
  type GatePurpose,
  gateDecision,
  type TenantState,
  tenantStateOf,
} from "../../core/tenant-gate.ts";
import { LessorError, type WireError } from "../../errors/index.ts";
import { tenantObject } from "../../placement/index.ts";
import type { SqlOutcome } from "../../rpc/tenant.ts";
import { movedError, movingError } from "../move.ts";
import type { TenantRuntime } from "../runtime.ts";

export class TenantGate {
  constructor(private readonly rt: TenantRuntime) {}

  /** What the gate answers an RPC of `purpose` from a caller of `tenantId` (null: one that names none). */
  through(purpose: GatePurpose, tenantId: string | null): GateDecision {
    return gateDecision(purpose, this.stateFor(tenantId));
  }

  /** The tenant's state for a caller of `tenantId` (core/tenant-gate.ts `tenantStateOf`). */
  stateFor(tenantId: string | null): TenantState {
    return tenantStateOf(this.rt, tenantId);
  }

  /** The refusal for an RPC of `purpose`, as it travels in an RPC answer; null if it may proceed. */
  refusal(purpose: GatePurpose, tenantId: string | null): WireError | null {
    return gateError(this.rt, purpose, tenantId)?.toWire() ?? null;
  }

  /** For an RPC that answers no verdict: throws the refusal, if `purpose` may not proceed. */
  admit(purpose: GatePurpose, tenantId: string | null): void {
    const refusal = this.refusal(purpose, tenantId);
    if (refusal) throw LessorError.fromWire(refusal);
  }

  /** The tenant's new owner, if the gate forwards an RPC of `purpose` there; null otherwise. */
  forwardTo(purpose: GatePurpose) {
    const gate = this.rt.move;
    if (this.through(purpose, null).kind !== "forward" || gate === null) return null;
    return tenantObject(this.rt.env, gate.to, gate.tenantId);
  }
}

/**
 * The error an RPC of `purpose` from a caller of `tenantId` is refused with, or null if it may
 * proceed. For the rooms that take new work on their own (the pool's `acquire`, a wire connection's
 * next transaction): they ask the same table as the RPCs do.
 */
export function gateError(
  rt: TenantRuntime,
  purpose: GatePurpose,
  tenantId: string | null,
): LessorError | null {
  const decision = gateDecision(purpose, tenantStateOf(rt, tenantId));
  if (decision.kind !== "refuse") return null;
  switch (decision.code) {
    case "tenant_moved":
      return movedError(rt.move?.to ?? "");
    case "tenant_moving":
      return movingError();
    case "tenant_erasing":
    case "tenant_erased":
      return new LessorError(decision.code, { retryAfterSeconds: 5 });
  }
}

/** The gate's refusal as an RPC answer with `ok: false`. */
export function refusedVerdict(error: WireError): { ok: false; error: WireError } {
  return { ok: false, error };
}

/** The gate's refusal as a `/sql` answer (the caller was not authenticated). */
export function refusedSql(error: WireError): SqlOutcome {
  return { ok: false, error, authenticated: false };
}
