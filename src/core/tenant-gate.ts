/**
 * The tenant object's one gate (docs/adr/026-tenant-object-kernel.md): the tenant's state as the
 * object holds it, and what each RPC may do in it, declared once. Every RPC of the object names its
 * purpose (src/tenant-object/index.ts) and passes through `gateDecision` before anything else runs;
 * no RPC checks the erase or the move on its own.
 *
 * The state is the object's, for the tenant id the caller names: `serving`; `erasing` while an
 * erase's gate is closed and `erased` once it committed (until the id is created again); `moving`
 * while a move's fence holds and `moved` once this object is a pointer to the new region.
 */

export const tenantStates = ["serving", "erasing", "erased", "moving", "moved"] as const;
export type TenantState = (typeof tenantStates)[number];

/** What an RPC is for. */
export const gatePurposes = [
  /** A `/sql` request, a new session lease, a new wire connection, a key check for a REST route. */
  "query",
  /** A statement or release on a session lease opened before (it finishes until its holder ends). */
  "lease",
  /** A pooled connection taken for new work: a flight's, a wire transaction's, a new session's. */
  "acquire",
  /** A credential rotation, or a customer-supplied credential. */
  "rotate",
  /** A schema migration (a campaign's). */
  "migrate",
  /** An erase request. */
  "erase",
  /** A move request. */
  "move",
  /** Pin or unpin. */
  "pin",
  /** A catalog record installed (provisioning, disable, keys). */
  "configure",
  /** The budget's and the reaper's questions about generations and slots. */
  "budget",
  /** A staged job's runner resumed (erase, move: the cron, the alarm); the job decides from its row. */
  "resume",
  /** The new region's object taking a moved tenant in (a move's `start` stage). */
  "move_in",
  /** An operator drain. */
  "drain",
  /** The runtime status, and a wire CancelRequest (which only ever ends work sooner). */
  "observe",
] as const;
export type GatePurpose = (typeof gatePurposes)[number];

export type GateDecision =
  | { kind: "proceed" }
  /** Answer the refusal: `tenant_moved` carries the region the tenant went to. */
  | { kind: "refuse"; code: "tenant_erasing" | "tenant_erased" | "tenant_moving" | "tenant_moved" }
  /** Ask the tenant's new owner instead (this object is a pointer). */
  | { kind: "forward" }
  /** Do nothing, and say so without an error (a late refresh, a pin, a campaign's migration). */
  | { kind: "skip" };

const proceed = { kind: "proceed" } as const;
const forward = { kind: "forward" } as const;
const skip = { kind: "skip" } as const;
const refuse = (code: "tenant_erasing" | "tenant_erased" | "tenant_moving" | "tenant_moved") =>
  ({ kind: "refuse", code }) as const;

/**
 * Purpose × state. The key check (tenant-object/auth.ts) still decides, for a key, between
 * `tenant_erasing`, `tenant_erased` and "no such key" while erasing, so that a key the tenant never
 * had learns nothing: a `query` proceeds to it.
 */
export const gateTable: { readonly [P in GatePurpose]: { readonly [S in TenantState]: GateDecision } } = {
  query: {
    serving: proceed,
    erasing: proceed,
    erased: proceed,
    moving: refuse("tenant_moving"),
    moved: refuse("tenant_moved"),
  },
  lease: {
    serving: proceed,
    erasing: proceed,
    erased: proceed,
    moving: proceed,
    moved: refuse("tenant_moved"),
  },
  acquire: {
    serving: proceed,
    erasing: refuse("tenant_erasing"),
    erased: refuse("tenant_erased"),
    moving: refuse("tenant_moving"),
    moved: refuse("tenant_moved"),
  },
  rotate: {
    serving: proceed,
    erasing: refuse("tenant_erasing"),
    erased: refuse("tenant_erased"),
    moving: refuse("tenant_moving"),
    moved: refuse("tenant_moved"),
  },
  // An erase closed the gate: a campaign skips the tenant (its rows go with the erase).
  migrate: { serving: proceed, erasing: skip, erased: proceed, moving: skip, moved: skip },
  erase: {
    serving: proceed,
    erasing: proceed,
    erased: proceed,
    moving: refuse("tenant_moving"),
    moved: refuse("tenant_moved"),
  },
  move: {
    serving: proceed,
    erasing: refuse("tenant_erasing"),
    erased: refuse("tenant_erased"),
    moving: proceed,
    moved: refuse("tenant_moved"),
  },
  pin: { serving: proceed, erasing: skip, erased: proceed, moving: skip, moved: skip },
  // A late refresh must not bring an erased tenant's keys back, nor a moved tenant's.
  configure: { serving: proceed, erasing: skip, erased: proceed, moving: skip, moved: skip },
  budget: { serving: proceed, erasing: proceed, erased: proceed, moving: proceed, moved: forward },
  resume: { serving: proceed, erasing: proceed, erased: proceed, moving: proceed, moved: proceed },
  // A tenant that lived here and moved away comes back to a pointer (dropped); an id re-created
  // after an erase is new. Never into an erase or a move out that is running.
  move_in: {
    serving: proceed,
    erasing: refuse("tenant_erasing"),
    erased: proceed,
    moving: refuse("tenant_moving"),
    moved: proceed,
  },
  // The erase's and the move's own stages stop the pool; an operator drain then has nothing to do.
  drain: { serving: proceed, erasing: skip, erased: skip, moving: skip, moved: skip },
  observe: { serving: proceed, erasing: proceed, erased: proceed, moving: proceed, moved: proceed },
};

/** Why a campaign's migration was skipped, from the state the gate skipped it in. */
export function migrationSkipReason(
  state: TenantState,
): "tenant_erasing" | "tenant_moving" | "tenant_unknown" {
  if (state === "erasing") return "tenant_erasing";
  if (state === "moving") return "tenant_moving";
  return "tenant_unknown";
}

/** What the gate answers an RPC of `purpose` in `state`. */
export function gateDecision(purpose: GatePurpose, state: TenantState): GateDecision {
  return gateTable[purpose][state];
}

/** The object's state for a caller of `tenantId` (null: a caller that names none, as the budget). */
export function tenantStateOf(
  gates: {
    move: { tenantId: string; state: "moving" | "moved" } | null;
    erase: { tenantId: string; state: "erasing" | "erased" } | null;
  },
  tenantId: string | null,
): TenantState {
  const { move, erase } = gates;
  if (move !== null && (tenantId === null || move.tenantId === tenantId)) return move.state;
  if (erase !== null) return erase.state;
  return "serving";
}
