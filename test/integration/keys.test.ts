// hashesEqual needs crypto.subtle.timingSafeEqual, which only workerd has: tested here, not in unit.
import { describe, expect, it } from "vitest";
import { generateDatabasePassword, hashesEqual, hashKey, secretMatches } from "../../src/crypto/keys.ts";

describe("key comparison in workerd", () => {
  it("hashesEqual tells equal hashes from different ones", async () => {
    const a = await hashKey("key-a");
    const b = await hashKey("key-b");
    expect(hashesEqual(a, a)).toBe(true);
    expect(hashesEqual(a, `${a}`)).toBe(true);
    expect(hashesEqual(a, b)).toBe(false);
    // One character apart, at the end.
    expect(hashesEqual(a, `${a.slice(0, -1)}${a.endsWith("0") ? "1" : "0"}`)).toBe(false);
  });

  it("hashesEqual refuses hashes of different lengths instead of throwing", async () => {
    const a = await hashKey("key-a");
    expect(hashesEqual(a, a.slice(0, -1))).toBe(false);
    expect(hashesEqual(a, "")).toBe(false);
    expect(hashesEqual("", a)).toBe(false);
  });

  it("secretMatches accepts only the same secret", async () => {
    const key = generateDatabasePassword();
    expect(await secretMatches(key, key)).toBe(true);
    expect(await secretMatches(`${key}x`, key)).toBe(false);
    expect(await secretMatches(key.slice(0, -1), key)).toBe(false);
    expect(await secretMatches("", key)).toBe(false);
  });
});
