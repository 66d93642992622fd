import { describe, expect, it } from "vitest";
import { createTenant, uniqueTenantId } from "./harness.ts";
import { WireClient, wirePool } from "./wire-client.ts";

describe("wire smoke", () => {
  it("Pool.query and a Client transaction through /v2", async () => {
    const tenant = await createTenant(uniqueTenantId("wire-smoke"));
    const pool = wirePool({ connectionString: tenant.connectionString });
    const { rows } = await pool.query("SELECT 1 + $1::int AS n", [41]);
    expect(rows).toEqual([{ n: 42 }]);
    const client = new WireClient(tenant.connectionString);
    await client.connect();
    await client.query("BEGIN");
    await client.query("INSERT INTO notes (body) VALUES ($1)", ["wire"]);
    const inside = await client.query("SELECT count(*)::int AS n FROM notes");
    await client.query("COMMIT");
    expect(inside.rows).toEqual([{ n: 1 }]);
    await client.end();
    await pool.end();
  });
});
