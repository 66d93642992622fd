import { describe, expect, it } from "vitest";
import { createTenant, sqlFor, uniqueTenantId } from "./harness.ts";

describe("smoke", () => {
  it("provisions a tenant and runs a query through the official client", async () => {
    const tenant = await createTenant(uniqueTenantId("smoke"));
    const sql = sqlFor(tenant);
    const rows = await sql`SELECT current_database() AS db, ${41}::int + 1 AS answer`;
    expect(rows).toEqual([{ db: tenant.database, answer: 42 }]);
  });
});
