/**
 * The per-tenant data declaration (src/core/tenant-data.ts, issue 41, docs/invariants.md
 * invariant 20): the control plane's own schema is read, and every table with a tenant column must
 * be declared, with what a move and an erase do with it; then an erase of a tenant with a row in
 * every declared table it deletes from leaves none, and keeps what is declared kept.
 */
import { describe, expect, it } from "vitest";
import { tenantData } from "../../src/core/tenant-data.ts";
import { admin, asSuperuser, createTenant, pollUntil, sqlRequest, uniqueTenantId } from "./harness.ts";

const declared = Object.values(tenantData);

function controlPlane<T>(work: Parameters<typeof asSuperuser<T>>[0]): Promise<T> {
  return asSuperuser(work, "lessor");
}

async function rowsIn(table: string, column: string, id: string): Promise<number> {
  return controlPlane(async (client) => {
    const { rows } = await client.query(`SELECT count(*)::int AS n FROM ${table} WHERE ${column} = $1`, [id]);
    return Number(rows[0]?.n ?? 0);
  });
}

describe("every control-plane table that holds a tenant's rows is declared (issue 41)", () => {
  it("the schema's tables with a tenant column are exactly the declared ones", async () => {
    const inSchema = await controlPlane(async (client) => {
      const { rows } = await client.query(
        `SELECT DISTINCT table_name FROM information_schema.columns
          WHERE table_schema = 'public' AND column_name = 'tenant_id'
            AND table_name IN (SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE')`,
      );
      return rows.map((row: { table_name: string }) => row.table_name);
    });
    const declaredTables = declared.filter((t) => t.column === "tenant_id").map((t) => t.table);
    expect([...inSchema].sort()).toEqual([...declaredTables].sort());
    // And each declared column is really there (the catalog's own `id` included).
    for (const { table, column } of declared) {
      const found = await controlPlane(async (client) => {
        const { rows } = await client.query(
          "SELECT 1 FROM information_schema.columns WHERE table_schema = 'public' AND table_name = $1 AND column_name = $2",
          [table, column],
        );
        return rows.length;
      });
      expect(found, `${table}.${column}`).toBe(1);
    }
  });

  it("an erase of a tenant with a row in every declared table deletes what is declared deleted and keeps what is declared kept", async () => {
    const tenant = await createTenant(uniqueTenantId("data-erase"));
    const query = await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] });
    expect(query.status).toBe(200);
    const campaignId = `c-${tenant.id}`;
    await controlPlane(async (client) => {
      await client.query(
        `INSERT INTO tenant_jwt (tenant_id, issuer, audiences, role, algorithms, clock_skew_seconds)
         VALUES ($1, 'https://issuer.test', '{app}', 'authenticated', '{RS256}', 30)`,
        [tenant.id],
      );
      await client.query(
        `INSERT INTO campaigns (id, state, to_version, concurrency, continue_on_failure, force, drain_timeout_ms, stability_window_ms)
         VALUES ($1, 'done', 1, 1, false, false, 1000, 0)`,
        [campaignId],
      );
      await client.query(
        `INSERT INTO campaign_tenants (campaign_id, tenant_id, host, cohort, position, state, from_version)
         VALUES ($1, $2, 'local', 'rollout', 0, 'succeeded', 1)`,
        [campaignId, tenant.id],
      );
      await client.query(
        "INSERT INTO usage_deltas (tenant_id, seq, queries, rows_returned, errors, lease_ms, pool_starts, at) VALUES ($1, 999999, 1, 1, 0, 1, 0, now())",
        [tenant.id],
      );
      await client.query(
        "INSERT INTO usage_rollups (tenant_id, queries, rows_returned, errors, lease_ms, pool_starts) VALUES ($1, 1, 1, 0, 1, 0) ON CONFLICT DO NOTHING",
        [tenant.id],
      );
      await client.query(
        `INSERT INTO tenant_moves (tenant_id, from_region, to_region, state, stage, tenant_status, host, actor)
         VALUES ($1, 'default', 'elsewhere', 'moved', 'commit', 'active', 'local', 'test')`,
        [tenant.id],
      );
    });
    // The pool's start reached the ledger, its events and the audit log.
    for (const table of ["generation_ledger", "lifecycle_events", "audit_log"]) {
      expect(
        await pollUntil(
          () => rowsIn(table, "tenant_id", tenant.id),
          (n) => n > 0,
        ),
        table,
      ).toBeGreaterThan(0);
    }
    // Every declared table but the customer's adoption (an attached tenant comes only from a real
    // attach: test/integration/tunnels.test.ts erases one) holds a row of the tenant now.
    for (const { table, column } of declared) {
      if (table === "adopted_databases" || table === "tenant_erasures") continue;
      expect(await rowsIn(table, column, tenant.id), table).toBeGreaterThan(0);
    }
    const erase = await admin(`/v1/tenants/${tenant.id}?confirm=${tenant.id}`, { method: "DELETE" });
    expect(erase.status).toBe(202);
    const view = await pollUntil(
      async () => (await admin(`/v1/tenants/${tenant.id}/erase`)).json<{ state: string }>(),
      (v) => v.state === "erased",
      { attempts: 160, intervalMs: 250 },
    );
    expect(view.state).toBe("erased");
    const after: Record<string, string> = {};
    const expected: Record<string, string> = {};
    for (const { table, column, erase: action } of declared) {
      const n = await rowsIn(table, column, tenant.id);
      after[table] = n === 0 ? "none" : "kept";
      expected[table] = action.do === "delete" ? "none" : "kept";
    }
    expect(after).toEqual(expected);
  });
});
