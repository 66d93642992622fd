/**
 * The Worker side of the folds: one fold run on a control-plane connection of its own, named
 * `lessor-fold` so it shows up as itself in `pg_stat_activity`. The logic lives in fold.ts,
 * horizon.ts and status.ts (no runtime there).
 */
import type { LessorConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { type FoldRun, runFold } from "./fold.ts";
import type { FoldOptions } from "./options.ts";

export type { FoldRun } from "./fold.ts";
export { describeFoldOutcome, type FoldOutcome } from "./outcome.ts";

/** One fold run of `region`'s control plane, on its own connection (`lessor-fold`). */
export function foldOnce(
  config: LessorConfig,
  env: Env,
  region: string,
  options: FoldOptions,
  scheduledAt: number | null,
): Promise<FoldRun> {
  return withControlPlane(
    config,
    env,
    region,
    (db) => runFold(db.$client, options, { scheduledAt }),
    "lessor-fold",
  );
}
