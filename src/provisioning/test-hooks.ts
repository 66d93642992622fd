/**
 * Test-only observation of provisioning: nothing outside the test suite sets these; in production
 * `provisioningHooksForTests.onStep` is undefined and costs one property read per step.
 */

/** Where a provisioning is: the tenant's database exists, closed; the guard is in; the tenant is let in. */
export type ProvisioningStep = "database_closed" | "opened";

export interface ProvisioningHooksForTests {
  onStep?: (event: {
    tenantId: string;
    step: ProvisioningStep;
    databaseName: string;
  }) => void | Promise<void>;
}

export const provisioningHooksForTests: ProvisioningHooksForTests = {};
