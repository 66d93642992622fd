/**
 * Issue 30: every deploy restarts every object, so every warm pool reconnects at once. Kill every
 * object of a 100-tenant fleet at the same moment, under traffic: the host's connections (counted
 * in Postgres and in the ledger, sampled throughout) never pass its budget, the starts that wait
 * never outnumber the tenants, every refusal is a retryable 503 with a code and Retry-After, and
 * every tenant serves again.
 */
import { env, runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import {
  asSuperuser,
  type CreatedTenant,
  createTenant,
  mapConcurrent,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

/** The host of this file: 120 connections, 10 of them the maintenance reserve (vitest.config.ts). */
const host = "mass";
const budgetConnections = 120;

interface Sample {
  backends: number;
  ledger: number;
  waiters: number;
}

describe("a mass restart", () => {
  it("kills every object of 100 tenants under traffic: never past the budget, every refusal retryable, all serve again", {
    timeout: 240_000,
  }, async () => {
    const tenants = await mapConcurrent(
      Array.from({ length: 100 }, (_, i) => i),
      8,
      (i) => createTenant(uniqueTenantId(`mass-${i}`), { host, tier: "solo" }),
    );
    const roles = tenants.map((t) => t.role);
    await mapConcurrent(tenants, 16, async (tenant) => {
      const warm = await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] });
      expect(warm.status).toBe(200);
    });

    let sampling = true;
    const samples: Sample[] = [];
    const sampler = (async () => {
      while (sampling) {
        const [backends, status] = await Promise.all([
          asSuperuser(async (client) => {
            const { rows } = await client.query(
              `SELECT count(*)::int AS n FROM pg_stat_activity
                WHERE usename = ANY($1::text[]) OR application_name LIKE $2`,
              [roles, `lessor:host:${host}:%`],
            );
            return Number(rows[0]?.n ?? 0);
          }),
          env.BUDGETS.getByName(host).status(host, 0),
        ]);
        samples.push({
          backends,
          ledger: status.allocated + status.reserved + status.draining + status.maintenance.inUse,
          waiters: status.waiters,
        });
      }
    })();

    let traffic = true;
    const answers: { status: number; code?: string; retryAfter: string | null }[] = [];
    const clients = Array.from({ length: 24 }, async (_, c) => {
      let i = c;
      while (traffic) {
        const tenant = tenants[(i * 37) % tenants.length] as CreatedTenant;
        i++;
        const response = await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] });
        const body = (await response.json()) as { code?: string };
        answers.push({
          status: response.status,
          ...(body.code ? { code: body.code } : {}),
          retryAfter: response.headers.get("Retry-After"),
        });
      }
    });
    await pollUntil(
      () => Promise.resolve(answers.length),
      (n) => n >= 200,
      { attempts: 400, intervalMs: 50 },
    );
    // The deploy: every object dies at once, with whatever it has in flight.
    const killed = await Promise.all(
      tenants.map((tenant) =>
        runInDurableObject(env.TENANTS.getByName(tenant.id), (_instance, state) => {
          state.abort("test: mass restart");
        }).then(
          () => false,
          () => true,
        ),
      ),
    );
    expect(killed.every(Boolean)).toBe(true);
    const afterKill = answers.length;
    await pollUntil(
      () => Promise.resolve(answers.length),
      (n) => n >= afterKill + 600,
      { attempts: 1200, intervalMs: 50 },
    );
    traffic = false;
    await Promise.all(clients);
    // Every tenant serves again.
    await mapConcurrent(tenants, 16, async (tenant) => {
      const answer = await pollUntil(
        async () => (await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] })).status,
        (status) => status === 200,
        { attempts: 40, intervalMs: 250 },
      );
      expect(answer).toBe(200);
    });
    sampling = false;
    await sampler;

    expect(samples.length).toBeGreaterThan(20);
    expect(Math.max(...samples.map((s) => s.backends))).toBeLessThanOrEqual(budgetConnections);
    expect(Math.max(...samples.map((s) => s.ledger))).toBeLessThanOrEqual(budgetConnections);
    // The storm queued: starts waited for admission, never more than one per tenant.
    expect(Math.max(...samples.map((s) => s.waiters))).toBeLessThanOrEqual(tenants.length);
    // The pools really came back after the kill (the fleet reconnected, it did not just idle).
    expect(samples.at(-1)?.backends ?? 0).toBeGreaterThan(50);
    const refused = answers.filter((a) => a.status !== 200);
    for (const answer of refused) {
      expect(answer.status).toBe(503);
      expect(answer.code).toMatch(
        /^(object_unavailable|capacity_saturated|connection_lost|stale_generation)$/,
      );
      expect(answer.retryAfter).toBeTruthy();
    }
    // Most of the traffic was served through the storm.
    expect(answers.filter((a) => a.status === 200).length).toBeGreaterThan(answers.length / 2);
  });
});
