/**
 * Test-only settings for the BudgetObject, as src/erase/test-hooks.ts is for the erase. Nothing
 * outside the test suite sets them; in production each is undefined and costs one property read
 * where it is consulted.
 */
export interface BudgetHooksForTests {
  /** A host's admission wait instead of `LESSOR_ADMISSION_WAIT_MS` (a test longer than a slow machine). */
  admissionWaitMs?: (host: string) => number | undefined;
}

export const budgetHooksForTests: BudgetHooksForTests = {};
