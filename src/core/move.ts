/**
 * A tenant's move between regions (docs/adr/023-regions.md) as pure decisions: the stage order,
 * what a move request may do, and where the object it reaches sends a caller.
 *
 * The fence is not a stage: the request closes it in the old region's object (and marks the
 * catalog row `moving`) before it answers. Then, each stage recorded before the next:
 *
 *     drain → copy → switch → start → cleanup → commit
 *
 * `drain` ends the old object's leases and stops its pool (its budget released, its outboxes
 * flushed to the old control plane); `copy` writes the tenant's rows into the new region's control
 * plane, marked `moving` (nothing serves them yet); `switch` gives the new region's row its status
 * back, marks the old one `moved` and turns the old object into a pointer to the new region;
 * `start` hands the new region's object its record (its first pool start takes a generation above
 * every one the old region used: the ledger came with the copy); `cleanup` removes the tenant's
 * rows from the old control plane and the old object's storage, all but the pointer; `commit`
 * records the move done, with its audit row in the new region.
 */

export const moveStages = ["drain", "copy", "switch", "start", "cleanup", "commit"] as const;
export type MoveStage = (typeof moveStages)[number];

/** The stage after `stage`; null after the last. */
export function moveStageAfter(stage: MoveStage): MoveStage | null {
  return moveStages[moveStages.indexOf(stage) + 1] ?? null;
}

/** Whether the old region's object still serves nothing and forwards nothing (the fence holds) at `stage`. */
export function fencedAt(stage: MoveStage): boolean {
  return moveStages.indexOf(stage) <= moveStages.indexOf("switch");
}

/** What decides whether a move may start. */
export interface MoveRequestFacts {
  from: string;
  to: string;
  /** The target region is configured. */
  targetKnown: boolean;
  /** The old region's catalog status of the tenant (null: no such tenant). */
  status: string | null;
  /** The target region's catalog already holds a tenant of this id (not one this move is copying). */
  takenInTarget: boolean;
  pinned: boolean;
  migrating: boolean;
  force: boolean;
  /**
   * The tenant's database is a customer's, behind a tunnel (docs/adr/018): tunnels and their
   * adoptions belong to the default region, so an attached tenant does not move (ADR 026).
   */
  attached?: boolean;
}

export type MoveRequestDecision =
  | { kind: "start" }
  | { kind: "running" }
  | {
      kind: "refuse";
      code:
        | "region_unknown"
        | "move_same_region"
        | "tenant_not_found"
        | "tenant_erasing"
        | "tenant_moved"
        | "tenant_exists"
        | "tenant_pinned"
        | "tenant_migrating"
        | "tenant_attached";
    };

/**
 * Whether a move may start. A pinned tenant moves only with `force` (its pool is drained like any
 * other); a migrating one waits (retry once its migration ends).
 */
export function moveRequestDecision(facts: MoveRequestFacts): MoveRequestDecision {
  if (!facts.targetKnown) return { kind: "refuse", code: "region_unknown" };
  if (facts.from === facts.to) return { kind: "refuse", code: "move_same_region" };
  if (facts.status === null || facts.status === "provisioning")
    return { kind: "refuse", code: "tenant_not_found" };
  if (facts.status === "moving") return { kind: "running" };
  if (facts.status === "erasing") return { kind: "refuse", code: "tenant_erasing" };
  if (facts.status === "moved") return { kind: "refuse", code: "tenant_moved" };
  if (facts.takenInTarget) return { kind: "refuse", code: "tenant_exists" };
  // Placement holds in every operation that changes it, not only at create (invariant 20).
  if (facts.attached === true) return { kind: "refuse", code: "tenant_attached" };
  if (facts.pinned && !facts.force) return { kind: "refuse", code: "tenant_pinned" };
  if (facts.migrating) return { kind: "refuse", code: "tenant_migrating" };
  return { kind: "start" };
}

/** Backoff between failed attempts of a stage: doubling from 1 s to 5 min, with full jitter. */
export function moveRetryDelay(attempts: number, random: number): number {
  const cap = Math.min(300_000, 1_000 * 2 ** Math.max(0, attempts - 1));
  return Math.max(500, Math.floor(Math.max(0, Math.min(1, random)) * cap));
}

/** The most hops a caller follows from region to region before it gives up (moves chain: A → B → C). */
export const maxMoveHops = 4;
