/**
 * The budget storm with wire clients (issue 29): on the `wire` host (connections 12, reserve 2, so
 * pools share 10), four standard tenants (pools of 5: twice what fits) are driven at once by Neon
 * `Pool`s in transaction mode and `Client`s in session mode through `/v2`. Wire connections share
 * their tenant's pool and the host's budget with `/sql`: the ledger, sampled throughout, and the
 * backends Postgres itself saw (its connection log, server-log.ts) never pass the budget, and every
 * query that could not run was refused with a clean, retryable error (SQLSTATE 53300 or 57P03, the
 * Lessor code in `detail`, "Retryable" in `hint`), never a hang or a broken protocol.
 */
import { describe, expect, it } from "vitest";
import type { CapacityStatus } from "../../src/rpc/budget.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import { admin, type CreatedTenant, createTenant, uniqueTenantId } from "./harness.ts";
import { type BackendClass, connectionPeaks, markServerLog } from "./server-log.ts";
import { inMode, WireClient, wirePool } from "./wire-client.ts";

const host = "wire";
const poolCapacity = 10;
const connections = 12;
const reserve = 2;

async function capacity(): Promise<CapacityStatus> {
  const response = await admin("/v1/capacity");
  const { hosts } = await response.json<{ hosts: CapacityStatus[] }>();
  const status = hosts.find((h) => h.host === host);
  if (!status) throw new Error("capacity lists no wire host");
  return status;
}

interface Refusal {
  code: string;
  detail: string;
  hint: string;
  severity: string;
}

/** What each attempt came to: ok, or the refusal's fields (anything else is kept whole, to fail on). */
type Outcome = { ok: true } | { ok: false; refusal: Refusal } | { ok: false; other: string };

function outcomeOf(error: unknown): Outcome {
  const e = error as Partial<Refusal> & { message?: string };
  if (typeof e.code === "string" && typeof e.detail === "string") {
    return {
      ok: false,
      refusal: { code: e.code, detail: e.detail, hint: e.hint ?? "", severity: e.severity ?? "" },
    };
  }
  return { ok: false, other: String(e.message ?? error) };
}

describe("the budget storm with wire clients", () => {
  it("four pools of five on a budget of ten: never over it, every excess a clean retryable refusal", async () => {
    const tenants: CreatedTenant[] = [];
    for (let i = 0; i < 4; i++) {
      tenants.push(await createTenant(uniqueTenantId(`wstorm${i}`), { host, tier: "standard" }));
    }
    const roles = tenants.map((t) => t.role);
    // The sessions below hold their connections longer than the tests' statement bound allows.
    const ids = new Set(tenants.map((t) => t.id));
    tenantHooksForTests.config = (id) => (ids.has(id) ? { statementTimeoutMs: 30_000 } : undefined);
    const from = await markServerLog();
    let sampling = true;
    let maxLedger = 0;
    let samples = 0;
    const sampler = (async () => {
      for (let i = 0; (sampling || samples === 0) && i < 4_000; i++) {
        const status = await capacity();
        samples++;
        maxLedger = Math.max(maxLedger, status.allocated + status.reserved + status.draining);
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();

    const outcomes: Outcome[] = [];
    const storm = tenants.map(async (tenant) => {
      // A session-mode client per tenant holds a connection for seconds, longer than a start waits
      // for the budget (LESSOR_ADMISSION_WAIT_MS): two pools fit, the others must be refused.
      const session = new WireClient(inMode(tenant.connectionString, "session"));
      session.on("error", () => undefined);
      const held = session
        .connect()
        .then(() => session.query("SELECT pg_sleep(6)"))
        .then((): Outcome => ({ ok: true }), outcomeOf);
      // Meanwhile, transaction-mode traffic from a Neon Pool, in rounds.
      const pool = wirePool({ connectionString: tenant.connectionString, max: 5 });
      for (let round = 0; round < 3; round++) {
        const queries = Array.from({ length: 8 }, (_, n) =>
          pool
            .query("SELECT pg_sleep(0.1), $1::int AS n", [round * 10 + n])
            .then((): Outcome => ({ ok: true }), outcomeOf),
        );
        outcomes.push(...(await Promise.all(queries)));
      }
      outcomes.push(await held);
      // Bounded: a client Lessor refused with FATAL already ended (its driver may not say so twice).
      await Promise.race([session.end().catch(() => undefined), new Promise((r) => setTimeout(r, 2_000))]);
      await pool.end();
    });
    await Promise.all(storm).finally(() => {
      tenantHooksForTests.config = undefined;
    });
    sampling = false;
    await sampler;
    const to = await markServerLog();
    const peaks = await connectionPeaks(
      from,
      to,
      { users: roles, appPatterns: [`lessor:host:${host}:%`] },
      ({ user, app }): BackendClass | null => {
        if (app.startsWith(`lessor:host:${host}:`)) return "maintenance";
        if (!roles.includes(user) || !app.startsWith(`lessor:${user}:`)) return null;
        return /^[0-9]+$/.test(app.slice(`lessor:${user}:`.length)) ? "pool" : "maintenance";
      },
    );

    // Never over the budget: the ledger at every sample, Postgres at every moment.
    expect(maxLedger).toBeLessThanOrEqual(poolCapacity);
    expect(peaks.pool, JSON.stringify(peaks)).toBeLessThanOrEqual(poolCapacity);
    expect(peaks.maintenance).toBeLessThanOrEqual(reserve);
    expect(peaks.total).toBeLessThanOrEqual(connections);
    expect(samples).toBeGreaterThan(0);

    // Every attempt either ran or was refused cleanly and retryably; the storm did exceed the budget.
    const others = outcomes.filter((o) => !o.ok && "other" in o);
    expect(others).toEqual([]);
    const refusals = outcomes.flatMap((o) => (!o.ok && "refusal" in o ? [o.refusal] : []));
    for (const refusal of refusals) {
      expect(["53300", "57P03"]).toContain(refusal.code);
      expect(refusal.hint).toMatch(/^Retryable/);
      expect(["ERROR", "FATAL"]).toContain(refusal.severity);
      expect(["capacity_saturated", "lease_timeout", "lease_limit", "tenant_draining"]).toContain(
        refusal.detail,
      );
    }
    expect(refusals.length).toBeGreaterThan(0);
    // Transaction-mode queries are refused one by one (ERROR: the connection goes on); a session is
    // refused at its start (FATAL: it never had a connection).
    expect(
      refusals.some((r) => r.severity === "ERROR"),
      JSON.stringify(refusals),
    ).toBe(true);
    expect(outcomes.filter((o) => o.ok).length).toBeGreaterThan(0);
    expect(outcomes.length).toBe(4 * (3 * 8 + 1));
  });
});
