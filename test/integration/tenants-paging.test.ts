/** `GET /v1/tenants` is paged with a cursor and a bounded page size; nothing lists every tenant at once. */
import { describe, expect, it } from "vitest";
import { admin, createTenant, mapConcurrent, uniqueTenantId } from "./harness.ts";

interface Page {
  tenants: { id: string; status: string; tier: string }[];
  nextCursor: string | null;
}

async function page(query: string): Promise<Page> {
  const response = await admin(`/v1/tenants${query}`);
  expect(response.status).toBe(200);
  return response.json<Page>();
}

describe("tenant listing", () => {
  it("walks every tenant with limit and cursor, without duplicates", async () => {
    const prefix = uniqueTenantId("page");
    const mine = Array.from({ length: 7 }, (_, i) => `${prefix}-${i}`);
    await mapConcurrent(mine, 3, (id) => createTenant(id, { tier: "free" }));

    const seen: string[] = [];
    let cursor: string | null = null;
    let pages = 0;
    // Other test files create tenants too; the walk is bounded all the same.
    for (; pages < 500; pages++) {
      const current: Page = await page(
        cursor === null ? "?limit=3" : `?limit=3&cursor=${encodeURIComponent(cursor)}`,
      );
      expect(current.tenants.length).toBeLessThanOrEqual(3);
      seen.push(...current.tenants.map((tenant) => tenant.id));
      if (current.nextCursor === null) break;
      // A full page hands out a cursor; the cursor is the last id of the page.
      expect(current.tenants).toHaveLength(3);
      expect(current.nextCursor).toBe(current.tenants.at(-1)?.id);
      cursor = current.nextCursor;
    }
    expect(pages).toBeLessThan(500);
    expect(pages).toBeGreaterThanOrEqual(2);
    expect(seen.length).toBe(new Set(seen).size);
    for (const id of mine) expect(seen).toContain(id);
  });

  it("a single bounded page of my tenants matches the walk", async () => {
    const prefix = uniqueTenantId("pg2");
    const mine = Array.from({ length: 4 }, (_, i) => `${prefix}-${i}`);
    await mapConcurrent(mine, 2, (id) => createTenant(id, { tier: "free" }));
    // Starting just before the prefix, the next four tenants in id order are exactly these.
    const first = await page(`?limit=2&cursor=${prefix}`);
    const second = await page(`?limit=2&cursor=${first.nextCursor ?? ""}`);
    expect([...first.tenants, ...second.tenants].map((tenant) => tenant.id)).toEqual(mine);
    expect(first.tenants[0]).toMatchObject({ status: "active", tier: "free" });
    expect(first.tenants[0]).not.toHaveProperty("keyHash");
  });

  it("defaults to a bounded page and accepts the largest one", async () => {
    expect((await page("")).tenants.length).toBeLessThanOrEqual(50);
    expect((await page("?limit=200")).tenants.length).toBeLessThanOrEqual(200);
    expect((await page("?limit=1")).tenants.length).toBeLessThanOrEqual(1);
  });

  it.each(["201", "1000", "0", "-1", "1.5", "abc", ""])("refuses limit=%j with 400", async (limit) => {
    const response = await admin(`/v1/tenants?limit=${limit}`);
    expect(response.status).toBe(400);
    expect(await response.json()).toMatchObject({ code: "invalid_request" });
  });

  it.each(["Not-A-Cursor", "-x", "a".repeat(41)])("refuses the cursor %j with 400", async (cursor) => {
    const response = await admin(`/v1/tenants?cursor=${encodeURIComponent(cursor)}`);
    expect(response.status).toBe(400);
    expect(await response.json()).toMatchObject({ code: "invalid_request" });
  });
});
