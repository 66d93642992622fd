/** The secret canary over `npm test`'s output (test/output-canary.ts) finds what it must. */
import { describe, expect, it } from "vitest";
import { reportable, secretsIn } from "../output-canary.ts";
import { testPgPassword, testSecrets } from "../secrets.ts";

describe("the output canary", () => {
  it("finds a test secret as written and URL-encoded, and credential shapes, but not ordinary lines", () => {
    expect(
      secretsIn(`connectionString: 'postgres://lessor_admin:${testPgPassword}@127.0.0.1/x'`, testSecrets),
    ).not.toEqual([]);
    expect(secretsIn(`pw=${encodeURIComponent(`${testPgPassword}/`)}`, [`${testPgPassword}/`])).not.toEqual(
      [],
    );
    expect(secretsIn("postgres://acme:lsk_0123456789abcdef@127.0.0.1:8787/acme", testSecrets)).not.toEqual(
      [],
    );
    expect(secretsIn("sealed v1.AAAAAAAAAAAAAAAAAAAAAA.BBBBBBBBBBBBBBBBBBBBBBBB", testSecrets)).not.toEqual(
      [],
    );
    expect(secretsIn("[a]  ✓ test/integration/smoke.test.ts (1 test) 650ms", testSecrets)).toEqual([]);
    expect(secretsIn("postgres://acme:[redacted]@127.0.0.1/acme", testSecrets)).toEqual([]);
  });

  it("reports a line without the secret it found", () => {
    const line = reportable(`password ${testPgPassword} here`, testSecrets);
    expect(line).not.toContain(testPgPassword);
  });
});
