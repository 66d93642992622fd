/**
 * Every secret the test stacks are given, in one place: vitest.config.ts hands them to the Worker,
 * the global setups to Postgres, and `npm test`'s runner (test/run.ts) searches every line of the
 * run's output for each of them (the secret canary, docs/invariants.md invariant 19). A secret
 * added to the tests anywhere else is a secret the canary does not look for.
 */

/** `LESSOR_SEAL_KEY` of the tests: 32 bytes, base64. */
export const testSealKey = "dGVzdC1zZWFsLWtleS0zMi1ieXRlcy1sb25nLi4uLi4="; // 32 bytes
/** `LESSOR_KEY_MAC_KEYS` of the tests: 32 bytes, base64. */
export const testKeyMacKey = "dGVzdC1rZXktbWFjLWtleS0zMi1ieXRlcy1sb25nLi4="; // 32 bytes
/** `LESSOR_ADMIN_KEY` of the tests. */
export const testAdminKey = "test-admin-key";
/** The password of every test host's admin roles and of the stacks' superuser. */
export const testPgPassword = "lessor-test-password";
/** The superuser password of the customer's server behind a tunnel (test/customer-server.ts). */
export const testCustomerPgPassword = "customer-test-password";

/** What the canary searches for. */
export const testSecrets: readonly string[] = [
  testSealKey,
  testKeyMacKey,
  testAdminKey,
  testPgPassword,
  testCustomerPgPassword,
];
