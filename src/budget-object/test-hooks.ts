/**
 * Test-only settings for the BudgetObject, as src/erase/test-hooks.ts is for the erase. Nothing
 * outside the test suite sets them; in production each is undefined and costs one property read
 * where it is consulted.
 */
export interface BudgetHooksForTests {
  /** A host's admission wait instead of `LESSOR_ADMISSION_WAIT_MS` (a test longer than a slow machine). */
  admissionWaitMs?: (host: string) => number | undefined;
  /** A maintenance slot's holder renewed it (`renewed`: false if the slot had already expired). */
  onMaintenanceRenewed?: (leaseId: string, renewed: boolean, purpose: string | null) => void;
  /**
   * A start's `confirm` has arrived (`reached`), or has been recorded and whatever reclaim it kicked
   * is on its way (`recorded`); the confirm does not answer until the hook's promise settles. A test
   * holds it here to order a waiting start, or an eviction, against the confirming pool's first lease.
   * It should wait on timers of its own (polling a flag): a promise the test made, awaited here,
   * leaves the object a reference that a later `evictDurableObject` of it waits on until it times out.
   */
  onConfirm?: (tenantId: string, generation: number, step: "reached" | "recorded") => Promise<void> | void;
  /** A host's alarm ran its sweep (src/budget-object/sweep.ts): what it did, and its next alarm. */
  onSweep?: (run: import("./sweep.ts").SweepRun) => void;
  /**
   * `off`: no host's alarm is set for its sweep and an alarm that fires does nothing. The workers
   * test projects start with it off (test/integration/setup.ts), so that a file's own reconcile,
   * reaper or hygiene call is the only one; the files that test the sweep turn it on.
   */
  sweep?: "off";
}

export const budgetHooksForTests: BudgetHooksForTests = {};
