/**
 * The Worker side of maintenance: opens a control-plane connection for the fold and for the
 * operator's view of it. The logic lives in fold.ts, horizon.ts and status.ts (no runtime there).
 */
import type { LessorConfig } from "../config/index.ts";
import { LessorError } from "../errors/index.ts";
import { withConnection } from "../postgres/index.ts";
import { type FoldRun, type Queryable, runFold } from "./fold.ts";
import type { FoldOptions } from "./options.ts";

export type { FoldRun, Queryable } from "./fold.ts";
export { describeFoldOutcome, type FoldOutcome } from "./outcome.ts";

/**
 * Runs `work` on a fresh control-plane connection named `applicationName` (so the fold shows up
 * as itself in `pg_stat_activity`); a failed connect becomes `control_plane_unavailable`.
 */
export async function withControlPlaneClient<T>(
  config: LessorConfig,
  env: Env,
  applicationName: string,
  work: (client: Queryable) => Promise<T>,
): Promise<T> {
  let connected = false;
  try {
    return await withConnection(config, env.LESSOR_CONTROL_PLANE_URL, applicationName, (client) => {
      connected = true;
      return work(client);
    });
  } catch (error) {
    if (!connected && !(error instanceof LessorError)) {
      throw new LessorError("control_plane_unavailable", {
        internal: "control-plane connect failed",
        cause: error,
      });
    }
    throw error;
  }
}

/** One fold run on its own connection (`lessor-fold`). */
export function foldOnce(
  config: LessorConfig,
  env: Env,
  options: FoldOptions,
  scheduledAt: number | null,
): Promise<FoldRun> {
  return withControlPlaneClient(config, env, "lessor-fold", (client) =>
    runFold(client, options, { scheduledAt }),
  );
}
