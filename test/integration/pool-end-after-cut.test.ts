/**
 * The chaos soak's leak (issue 32), as an ordinary test, and the reconcile's repairs of its class.
 *
 * The leak: a `/sql` request answers and ends its lease; its connection is still out, being reset.
 * Its backend is killed right then, so the connection ends before it comes back. The pool stops
 * meanwhile (idle: an eviction, an idle timeout, a drain). The reset fails and the connection is
 * released with its error, and the driver's pool then waits for that connection's `end` event,
 * which it emitted once already: `Pool.end()` never settled, the generation stayed `closing`, and
 * its budget allocation was never released (the soak: "ledger 2, backends 0" for good).
 *
 * The repairs: a lease whose release is lost is reclaimed once overdue, a ledger lease count that
 * differs from its pool's is corrected, and a close that does not finish within its bound is cut.
 * Each is leaked here on purpose and watched coming back, with its counter and its event.
 */
import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterEach, describe, expect, it } from "vitest";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  eventsOf,
  pollUntil,
  runtimeOf,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

const host = "local";

interface LedgerRowSeen {
  generation: number;
  leases: number;
}

interface BudgetInternals {
  ledger: {
    rows(): (LedgerRowSeen & { tenantId: string })[];
    setPhase(
      tenantId: string,
      generation: number,
      phase: string,
      report: { leases: number; idleSince: number | null; pinned: boolean; migrating: boolean },
    ): void;
  };
}

interface PoolInternals {
  acquire(record: unknown, kind?: string): Promise<{ id: number; generation: number }>;
  checkout(lease: unknown): Promise<unknown>;
  /** The pool's lease book (src/tenant-object/pool/leases.ts), its current generation's leases. */
  leaseBook: { current: Map<number, { overdueAt: number }> };
  stop(reason: string): Promise<void>;
}

interface ObjectInternals {
  pool: PoolInternals;
  rt: { record: unknown };
}

/** The budget ledger's rows of `tenantId` (read in the host's BudgetObject). */
function ledgerRows(tenantId: string): Promise<LedgerRowSeen[]> {
  return runInDurableObject(env.BUDGETS.getByName(host), (instance) =>
    (instance as unknown as BudgetInternals).ledger
      .rows()
      .filter((row) => row.tenantId === tenantId)
      .map((row) => ({ generation: row.generation, leases: row.leases })),
  );
}

async function repairCounters(): Promise<Record<string, number>> {
  const response = await admin("/v1/capacity");
  expect(response.status).toBe(200);
  const body = await response.json<{ hosts: { host: string; reconciled: Record<string, number> }[] }>();
  return body.hosts.find((h) => h.host === host)?.reconciled ?? {};
}

function inObject<T>(tenantId: string, work: (object: ObjectInternals) => Promise<T> | T): Promise<T> {
  // The object's parts are its rooms (src/tenant-object/rooms.ts).
  return runInDurableObject(env.TENANTS.getByName(tenantId), (instance) =>
    work((instance as unknown as { rooms: ObjectInternals }).rooms),
  );
}

async function warm(tenant: CreatedTenant): Promise<number> {
  const response = await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] });
  expect(response.status).toBe(200);
  const runtime = await runtimeOf(tenant.id);
  expect(runtime.state).toBe("ready");
  return runtime.generation;
}

afterEach(() => {
  tenantHooksForTests.beforeReturn = undefined;
});

describe("a connection cut while it is being returned (the soak's leak)", () => {
  it("does not keep its generation closing: the pool stops and its budget comes back", async () => {
    const tenant = await createTenant(uniqueTenantId("cutret"));
    const generation = await warm(tenant);

    // Hold the next request's connection between its answer and its reset.
    let held: { client: object; ended: Promise<void> } | null = null;
    let letGo: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => {
      letGo = resolve;
    });
    tenantHooksForTests.beforeReturn = async (tenantId, client) => {
      if (tenantId !== tenant.id || held) return;
      const ended = new Promise<void>((resolve) =>
        (client as { once(event: "end", listener: () => void): void }).once("end", () => resolve()),
      );
      held = { client, ended };
      await gate;
    };
    const answer = await sqlRequest(tenant.connectionString, {
      query: "SELECT pg_backend_pid()::text AS pid",
      params: [],
    });
    expect(answer.status).toBe(200);
    const pid = Number((await answer.json<{ rows: string[][] }>()).rows[0]?.[0]);
    const caught = await pollUntil(
      async () => held,
      (h) => h !== null,
    );
    expect(caught).not.toBeNull();
    // The lease has ended (the answer is out); the connection has not come back.
    expect((await runtimeOf(tenant.id)).leases).toBe(0);

    // The fault lands: the backend is killed, and the connection has ended before it comes back.
    const killed = await asSuperuser(async (client) => {
      const { rows } = await client.query("SELECT pg_terminate_backend($1::int) AS ok", [pid]);
      return (rows[0] as { ok: boolean }).ok;
    });
    expect(killed).toBe(true);
    await (caught as unknown as { ended: Promise<void> }).ended;

    // The pool stops while that connection is still out (an operator drain of the idle pool).
    const drained = admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    const stopping = await pollUntil(
      () => runtimeOf(tenant.id),
      (r) => r.state === "stopped",
    );
    expect(stopping.state).toBe("stopped");
    expect((await ledgerRows(tenant.id)).map((r) => r.generation)).toContain(generation);

    // Now it comes back, failing its reset on the dead connection.
    letGo();
    const rows = await pollUntil(
      () => ledgerRows(tenant.id),
      (r) => r.length === 0,
    );
    expect(rows).toEqual([]);
    expect((await drained).status).toBeLessThan(300);
    expect(
      await inObject(tenant.id, (o) =>
        (o as unknown as { pool: { generations: { holds(g: number): boolean } } }).pool.generations.holds(
          generation,
        ),
      ),
    ).toBe(false);
    // Closed by the fix at the source, not by the bound that cuts a close that never finishes.
    const events = await eventsOf(tenant.id);
    expect(events.filter((e) => e.reason.startsWith("pool_close_forced"))).toEqual([]);

    // And the tenant starts again on the next request.
    const next = await sqlRequest(tenant.connectionString, { query: "SELECT 2", params: [] });
    expect(next.status).toBe(200);
    expect((await runtimeOf(tenant.id)).generation).toBeGreaterThan(generation);
  });
});

describe("the reconcile repairs the class from the outside", () => {
  it("reclaims a lease whose release was lost, and the pool goes idle and stops", async () => {
    const tenant = await createTenant(uniqueTenantId("lostlease"), {});
    const generation = await warm(tenant);
    const before = await repairCounters();

    // Leak a lease on purpose: taken, never released, and already past its bound.
    await inObject(tenant.id, async (o) => {
      const lease = await o.pool.acquire(o.rt.record);
      const held = o.pool.leaseBook.current.get(lease.id);
      if (!held) throw new Error("the leaked lease is not in the registry");
      held.overdueAt = Date.now() - 1;
    });
    expect((await runtimeOf(tenant.id)).leases).toBe(1);

    const result = await env.BUDGETS.getByName(host).reconcile(host, 0);
    expect(result.checked).toBeGreaterThanOrEqual(1);
    expect((await runtimeOf(tenant.id)).leases).toBe(0);
    const after = await pollUntil(
      () => repairCounters(),
      (c) => (c.lease_reclaimed ?? 0) > (before.lease_reclaimed ?? 0),
    );
    expect(after.lease_reclaimed).toBe((before.lease_reclaimed ?? 0) + 1);
    const events = await pollUntil(
      () => eventsOf(tenant.id),
      (e) => e.some((x) => x.reason.startsWith("lease_reclaimed")),
    );
    expect(events.find((e) => e.reason.startsWith("lease_reclaimed"))).toMatchObject({ generation });

    // Idle again: an operator drain now stops it at once and the budget comes back.
    const drained = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    expect(drained.status).toBeLessThan(300);
    expect(
      await pollUntil(
        () => ledgerRows(tenant.id),
        (r) => r.length === 0,
      ),
    ).toEqual([]);
  });

  it("corrects a ledger lease count its pool does not have", async () => {
    const tenant = await createTenant(uniqueTenantId("fakecount"));
    const generation = await warm(tenant);
    const before = await repairCounters();
    // The ledger claims two leases; the pool holds none (what a failed eviction once wrote).
    await runInDurableObject(env.BUDGETS.getByName(host), (instance) => {
      (instance as unknown as BudgetInternals).ledger.setPhase(tenant.id, generation, "allocated", {
        leases: 2,
        idleSince: null,
        pinned: false,
        migrating: false,
      });
    });
    expect(await ledgerRows(tenant.id)).toEqual([{ generation, leases: 2 }]);

    const result = await env.BUDGETS.getByName(host).reconcile(host, 0);
    expect(result.corrected).toBeGreaterThanOrEqual(1);
    expect(await ledgerRows(tenant.id)).toEqual([{ generation, leases: 0 }]);
    const after = await repairCounters();
    expect(after.lease_count_corrected).toBeGreaterThan(before.lease_count_corrected ?? 0);
  });

  it("cuts a close that does not finish within its bound, and releases the budget", async () => {
    const tenant = await createTenant(uniqueTenantId("stuckclose"));
    const generation = await warm(tenant);
    const before = await repairCounters();
    // Leak a connection on purpose: checked out under a lease, the lease released, the connection
    // never returned. Ending the pool waits for it; past the bound it is cut.
    await inObject(tenant.id, async (o) => {
      const lease = await o.pool.acquire(o.rt.record);
      await o.pool.checkout(lease);
      (o.pool as unknown as { release(l: unknown): void }).release(lease);
    });
    const drained = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    expect(drained.status).toBeLessThan(300);
    expect(
      await pollUntil(
        () => ledgerRows(tenant.id),
        (r) => r.length === 0,
      ),
    ).toEqual([]);
    expect(
      await inObject(tenant.id, (o) =>
        (o as unknown as { pool: { generations: { holds(g: number): boolean } } }).pool.generations.holds(
          generation,
        ),
      ),
    ).toBe(false);
    const events = await pollUntil(
      () => eventsOf(tenant.id),
      (e) => e.some((x) => x.reason.startsWith("pool_close_forced")),
    );
    expect(events.some((e) => e.reason.startsWith("pool_close_forced"))).toBe(true);
    const after = await pollUntil(
      () => repairCounters(),
      (c) => (c.close_forced ?? 0) > (before.close_forced ?? 0),
    );
    expect(after.close_forced).toBe((before.close_forced ?? 0) + 1);
    // No backend of the generation is left on the host.
    const left = await pollUntil(
      () =>
        asSuperuser(async (client) => {
          const { rows } = await client.query(
            "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1",
            [`lessor:${tenant.role}:${generation}`],
          );
          return (rows[0] as { n: number }).n;
        }),
      (n) => n === 0,
    );
    expect(left).toBe(0);
  });
});
