/**
 * Invariant 3: concurrent first requests for a stopped tenant start exactly one generation.
 * Measured from outside the object: its status, the control-plane generation ledger, the lifecycle
 * events and the backends Postgres actually sees.
 */
import { describe, expect, it } from "vitest";
import {
  createTenant,
  eventsOf,
  ledgerGenerations,
  pollUntil,
  runtimeOf,
  sqlFor,
  tenantBackends,
  uniqueTenantId,
} from "./harness.ts";

const requests = 200;

describe("single-flight start", () => {
  it("200 concurrent first requests to a stopped tenant start one generation and one pool", async () => {
    const tenant = await createTenant(uniqueTenantId("flight"), { tier: "free" });
    const before = await runtimeOf(tenant.id);
    expect(before).toMatchObject({ state: "stopped", generation: 0, leases: 0 });
    expect(await ledgerGenerations(tenant.id)).toEqual([]);
    expect(await tenantBackends(tenant)).toEqual([]);
    const poolSize = before.poolSize;
    expect(poolSize).toBe(2);

    const sql = sqlFor(tenant);
    const answers = await Promise.all(
      Array.from(
        { length: requests },
        async (_, i) =>
          (
            await sql`SELECT current_setting('application_name') AS app, pg_backend_pid() AS pid, ${i}::int AS i`
          )[0],
      ),
    );

    // Every request was served, each with its own answer, all by generation 1.
    expect(answers.map((row) => row?.i)).toEqual(Array.from({ length: requests }, (_, i) => i));
    expect(new Set(answers.map((row) => row?.app))).toEqual(new Set([`lessor:${tenant.role}:1`]));
    const pids = new Set(answers.map((row) => row?.pid));
    expect(pids.size).toBeGreaterThanOrEqual(1);
    expect(pids.size).toBeLessThanOrEqual(poolSize ?? 0);

    const after = await runtimeOf(tenant.id);
    expect(after).toMatchObject({ state: "ready", generation: 1, leases: 0 });
    expect(await ledgerGenerations(tenant.id)).toEqual([1]);

    const backends = await tenantBackends(tenant);
    expect(new Set(backends)).toEqual(new Set([`lessor:${tenant.role}:1`]));
    expect(backends.length).toBeLessThanOrEqual(poolSize ?? 0);

    // The start itself was recorded once: one stopped → starting transition, for generation 1.
    const events = await pollUntil(
      () => eventsOf(tenant.id),
      (list) => list.some((event) => event.to === "starting"),
    );
    const starts = events.filter((event) => event.to === "starting");
    expect(starts).toEqual([expect.objectContaining({ generation: 1, from: "stopped" })]);
  });

  it("a second wave to the warm pool starts nothing new", async () => {
    const tenant = await createTenant(uniqueTenantId("flight2"), { tier: "free" });
    const sql = sqlFor(tenant);
    await Promise.all(Array.from({ length: 50 }, () => sql`SELECT 1`));
    const apps = await Promise.all(
      Array.from(
        { length: 50 },
        async () => (await sql`SELECT current_setting('application_name') AS app`)[0]?.app,
      ),
    );
    expect(new Set(apps)).toEqual(new Set([`lessor:${tenant.role}:1`]));
    expect((await runtimeOf(tenant.id)).generation).toBe(1);
    expect(await ledgerGenerations(tenant.id)).toEqual([1]);
  });
});
