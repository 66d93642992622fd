/**
 * Test-only fault injection for the move job, as for the erase (src/erase/test-hooks.ts). Nothing
 * outside the test suite sets these; in production `moveHooksForTests.onStep` is undefined.
 *
 * A hook that throws `InterruptedForTests` stops the runner there as if its isolate had died (no
 * failure is recorded, nothing is re-armed); `abortObject` resets the old region's object.
 */
import type { MoveStage } from "../core/move.ts";

/** Where the runner is: the fence just closed; a stage started, did its work, or was recorded. */
export type MoveStep =
  | { point: "fence"; stage: null }
  | { point: "started" | "worked" | "recorded"; stage: MoveStage }
  | { point: "failed"; stage: MoveStage | null; message: string };

export interface MoveStepEvent {
  tenantId: string;
  step: MoveStep;
  abortObject: (reason: string) => void;
}

export const moveHooksForTests: { onStep?: (event: MoveStepEvent) => void | Promise<void> } = {};
