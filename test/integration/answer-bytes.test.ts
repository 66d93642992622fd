/**
 * Issue 30: an answer is bounded by the bytes that travel (the JSON's UTF-8, its escapes, and in
 * object mode every row's column names), not by the length of the values as JavaScript holds them.
 * LESSOR_MAX_RESPONSE_BYTES is 10 MiB here (the default, Neon's own HTTP limit).
 */
import { describe, expect, it } from "vitest";
import { createTenant, lessor, uniqueTenantId } from "./harness.ts";

function sql(
  connectionString: string,
  query: string,
  mode: { arrays: boolean; raw: boolean },
): Promise<Response> {
  return lessor("/sql", {
    method: "POST",
    headers: {
      "Neon-Connection-String": connectionString,
      "Neon-Raw-Text-Output": String(mode.raw),
      "Neon-Array-Mode": String(mode.arrays),
      "content-type": "application/json",
    },
    body: JSON.stringify({ query, params: [] }),
  });
}

describe("answers are counted in the bytes that travel", () => {
  it("multibyte text: 3.7 million characters are 11 MB of UTF-8, over the limit", async () => {
    const tenant = await createTenant(uniqueTenantId("bytes-mb"), { tier: "solo" });
    // Under the limit in characters (3.7 M < 10.5 M), over it in bytes (11.1 MB).
    const over = await sql(tenant.connectionString, "SELECT repeat('漢', 3700000) AS t", {
      arrays: true,
      raw: true,
    });
    expect(over.status).toBe(507);
    expect(await over.json()).toMatchObject({ code: "response_too_large" });
    // The same characters, a third as many: 3.7 MB of UTF-8 pass, whole.
    const under = await sql(tenant.connectionString, "SELECT repeat('漢', 1200000) AS t", {
      arrays: true,
      raw: true,
    });
    expect(under.status).toBe(200);
    const text = await under.text();
    expect(new TextEncoder().encode(text).byteLength).toBeGreaterThan(3_600_000);
  });

  it("object mode repeats each column's name in every row, and that is counted", async () => {
    const tenant = await createTenant(uniqueTenantId("bytes-obj"), { tier: "solo" });
    const name = "n".repeat(60);
    // 200,000 rows of `{"nnn…":1}`: 65 bytes a row in objects (13 MB), 4 in arrays (0.8 MB).
    const query = `SELECT 1 AS "${name}" FROM generate_series(1, 200000)`;
    const objects = await sql(tenant.connectionString, query, { arrays: false, raw: false });
    expect(objects.status).toBe(507);
    expect(await objects.json()).toMatchObject({ code: "response_too_large" });
    const arrays = await sql(tenant.connectionString, query, { arrays: true, raw: true });
    expect(arrays.status).toBe(200);
    expect((await arrays.json<{ rows: unknown[] }>()).rows).toHaveLength(200_000);
    // The connection was drained, not cut: the next answer comes at once.
    const next = await sql(tenant.connectionString, "SELECT 'fine' AS t", { arrays: false, raw: false });
    expect(await next.json()).toMatchObject({ rows: [{ t: "fine" }] });
  });
});
