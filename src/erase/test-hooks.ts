/**
 * Test-only fault injection for the erase job. Nothing outside the test suite sets these; in
 * production `eraseHooksForTests.onStep` is undefined and costs one property read per step.
 *
 * A test installs `onStep` to watch the job (which stage ran, how often) and to kill it at a step:
 * throwing `InterruptedForTests` stops the runner there as if its isolate had died (no failure is
 * recorded, nothing is re-armed: the cron trigger or the object's alarm must resume it), and
 * `abortObject` resets the TenantObject itself, as a crash or a deploy does.
 */
import type { EraseStage } from "../core/erase.ts";

/**
 * Where the runner is: the gate just closed; a stage started, did its work, or was recorded; an
 * attempt failed (`stage` null: the job could not even be loaded).
 */
export type EraseStep =
  | { point: "gate"; stage: null }
  | { point: "started" | "worked" | "recorded"; stage: EraseStage }
  | { point: "failed"; stage: EraseStage | null; message: string };

export interface EraseStepEvent {
  tenantId: string;
  step: EraseStep;
  /** Resets the tenant's object (`ctx.abort`), as a crash does. */
  abortObject: (reason: string) => void;
}

export interface EraseHooksForTests {
  onStep?: (event: EraseStepEvent) => void | Promise<void>;
}

export const eraseHooksForTests: EraseHooksForTests = {};

/** Thrown by a test's hook to stop the runner as if it had been killed at that step. */
export class InterruptedForTests extends Error {
  override readonly name = "InterruptedForTests";
}
