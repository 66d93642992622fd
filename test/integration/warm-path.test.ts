/**
 * What the warm path may do per request (docs/adr/020-warm-path.md): no storage row written on it,
 * and a connection back in the pool without a round trip of its own (the reset rides in the
 * statement's flight, test/unit/pipelined-reset.test.ts).
 */
import { describe, expect, it } from "vitest";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import { admin, createTenant, sqlRequest, uniqueTenantId } from "./harness.ts";

async function rowsWritten(id: string): Promise<number> {
  const response = await admin(`/v1/tenants/${id}`);
  expect(response.status).toBe(200);
  return (await response.json<{ runtime: { storageRowsWritten: number } }>()).runtime.storageRowsWritten;
}

describe("the warm path", () => {
  it("writes no storage row per request: usage is saved at most once a second", async () => {
    const tenant = await createTenant(uniqueTenantId("warmrows"));
    const first = await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] });
    expect(first.status).toBe(200);
    // A cold start writes (its lifecycle, its events): counted, so the counter is not a constant.
    const afterStart = await rowsWritten(tenant.id);
    expect(afterStart).toBeGreaterThan(0);
    // The object's usage saves (runtime.ts `saveUsage`, at most one a second by its own timer),
    // counted as they happen rather than inferred from how long the requests took on this machine.
    let saves = 0;
    tenantHooksForTests.onUsageSaved = (id) => {
      if (id === tenant.id) saves++;
    };
    const requests = 40;
    let written: number;
    try {
      for (let i = 0; i < requests; i++) {
        const response = await sqlRequest(tenant.connectionString, {
          query: "SELECT $1::int AS i",
          params: [i],
        });
        expect(response.status).toBe(200);
      }
      written = (await rowsWritten(tenant.id)) - afterStart;
    } finally {
      tenantHooksForTests.onUsageSaved = undefined;
    }
    // Every row written is a usage save (and the heartbeat's, if one ran): never one per request.
    expect(written).toBeLessThanOrEqual(saves + 4);
    expect(written).toBeLessThan(requests);
  });
});
