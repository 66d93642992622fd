/**
 * Test-only fault injection and configuration for the TenantObject, as src/erase/test-hooks.ts is
 * for the erase. Nothing outside the test suite sets these; in production every field is undefined
 * and each costs one property read where it is consulted.
 *
 * A test installs a step hook to watch a rotation or an outbox flush and to kill it at a named step:
 * `abortObject` resets the object as a crash or a deploy does, and a hook that then never returns
 * leaves nothing of the dead instance running after that step. `config` gives one tenant's object
 * settings of its own (a longer statement bound, a longer erase wait) instead of a wall-clock margin.
 */
import type { LessorConfig } from "../config/index.ts";

/**
 * The steps of a credential rotation with an overlap (rotation.ts), each reached once its work is
 * done: the new generation admitted by the budget, the role's password changed, the password
 * resealed in the control plane, the new generation's pool opened and proved, the switch made.
 */
export type RotationStep = "admitted" | "password_changed" | "resealed" | "prepared" | "switched";

/**
 * The steps of an outbox flush (outbox.ts): the lifecycle events appended to the control plane (the
 * usage not yet), and everything appended but not yet forgotten locally.
 */
export type FlushStep = "events_appended" | "appended";

/**
 * The steps of an adaptive pool's growth (sizing.ts): the host's BudgetObject granted it (the
 * ledger holds more), and the driver pool was let open more.
 */
export type GrowStep = "granted" | "applied";

export interface TenantStepEvent<Step> {
  tenantId: string;
  step: Step;
  /** Resets the tenant's object (`ctx.abort`), as a crash does. */
  abortObject: (reason: string) => void;
}

export interface TenantHooksForTests {
  onRotationStep?: (event: TenantStepEvent<RotationStep>) => void | Promise<void>;
  onFlushStep?: (event: TenantStepEvent<FlushStep>) => void | Promise<void>;
  onGrowStep?: (event: TenantStepEvent<GrowStep>) => void | Promise<void>;
  /** The usage counted so far (`queries` of it) was saved to the object's storage (runtime.ts `saveUsage`). */
  onUsageSaved?: (tenantId: string, queries: number) => void;
  /**
   * A `/sql` request answered and ended its lease; its connection (`client`) is about to be
   * returned to the pool, once its reset (pipelined in the statement's flight, or sent now) has
   * run. A test holds it here to land a fault in that window.
   */
  beforeReturn?: (tenantId: string, client: object) => Promise<void>;
  /**
   * While it answers true for a tenant, the heartbeat's review of that tenant's adaptive pool gives
   * nothing back (sizing.ts `review`; the review still runs and re-arms): the pool shrinks only when
   * its host asks (`shrinkIdle`), however long a slow machine takes between two steps of a test.
   */
  holdReview?: (tenantId: string) => boolean;
  /** Settings that replace the configuration's for one tenant's object, read at each use. */
  config?: (tenantId: string) => Partial<LessorConfig> | undefined;
}

export const tenantHooksForTests: TenantHooksForTests = {};
