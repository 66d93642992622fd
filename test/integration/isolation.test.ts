/**
 * Invariant 1: no request ever reads or writes a database other than its authenticated tenant's.
 * 20 tenants, each with a sentinel row, then 500 interleaved queries at concurrency 50.
 */
import { describe, expect, it } from "vitest";
import { type CreatedTenant, createTenant, mapConcurrent, sqlFor, uniqueTenantId } from "./harness.ts";

const tenantCount = 20;
const queryCount = 500;
const concurrency = 50;

interface Answer {
  db: string;
  usr: string;
  bodies: string[] | null;
}

describe("tenant isolation", () => {
  it("answers every one of 500 interleaved queries from the caller's own database", async () => {
    const ids = Array.from({ length: tenantCount }, (_, i) => uniqueTenantId(`iso${i}`));
    // The smallest tier: isolation does not depend on the pool size, and the suite shares one host.
    const tenants = await mapConcurrent(ids, 4, (id) => createTenant(id, { tier: "free" }));
    await mapConcurrent(tenants, 10, async (tenant) => {
      const sql = sqlFor(tenant);
      await sql`INSERT INTO notes (body) VALUES (${tenant.id})`;
    });

    // Step 7 (coprime with 20) interleaves the tenants so neighbours in flight differ.
    const plan = Array.from(
      { length: queryCount },
      (_, i) => tenants[(i * 7) % tenantCount] as CreatedTenant,
    );
    const writesPerTenant = new Map<string, number>();
    const mismatches: string[] = [];
    await mapConcurrent(plan, concurrency, async (tenant, i) => {
      const sql = sqlFor(tenant);
      if (i % 5 === 0) {
        // Every fifth query writes its own id: a write that lands elsewhere shows up below.
        writesPerTenant.set(tenant.id, (writesPerTenant.get(tenant.id) ?? 0) + 1);
        const rows = await sql`INSERT INTO notes (body) VALUES (${tenant.id})
          RETURNING current_database() AS db, current_user AS usr, ARRAY[body] AS bodies`;
        check(tenant, rows[0] as Answer | undefined, mismatches, i);
      } else {
        const rows = await sql`SELECT current_database() AS db, current_user AS usr,
          (SELECT array_agg(DISTINCT body) FROM notes) AS bodies`;
        check(tenant, rows[0] as Answer | undefined, mismatches, i);
      }
    });
    expect(mismatches).toEqual([]);

    // After the storm each database holds only its own tenant's rows, exactly as many as it was sent.
    await mapConcurrent(tenants, 10, async (tenant) => {
      const sql = sqlFor(tenant);
      const rows = await sql`SELECT body, count(*)::int AS n FROM notes GROUP BY body`;
      expect(rows).toEqual([{ body: tenant.id, n: 1 + (writesPerTenant.get(tenant.id) ?? 0) }]);
    });
  });
});

function check(tenant: CreatedTenant, answer: Answer | undefined, mismatches: string[], i: number): void {
  const expected = tenant.database;
  if (!answer || answer.db !== expected || answer.usr !== expected || answer.bodies?.join() !== tenant.id) {
    mismatches.push(`query ${i} for ${tenant.id} got ${JSON.stringify(answer)}`);
  }
}
