/**
 * Postgres stopped and restarted under load. While it is down, requests fail fast with retryable
 * answers (never hang). Once it is back, every warm tenant serves again with no 5xx, leases return
 * to zero, and no backend is leaked: every pooled backend belongs to its tenant's live generation.
 */
import { env } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import {
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  uniqueTenantId,
} from "../integration/harness.ts";

function query(tenant: CreatedTenant): Promise<Response> {
  return lessor("/sql", {
    method: "POST",
    headers: {
      "Neon-Connection-String": tenant.connectionString,
      "Neon-Raw-Text-Output": "true",
      "Neon-Array-Mode": "true",
    },
    body: JSON.stringify({ query: "SELECT current_database() AS db", params: [] }),
  });
}

async function control(hook: "pg-stop" | "pg-start"): Promise<void> {
  const response = await fetch(`${env.TEST_PROXY_CONTROL_URL}/hook/${hook}`);
  expect(response.status).toBe(200);
}

/** Runs `count` rounds of concurrent queries over every tenant; returns the statuses seen. */
async function load(tenants: CreatedTenant[], rounds: number, concurrency: number): Promise<number[]> {
  const statuses: number[] = [];
  for (let round = 0; round < rounds; round++) {
    const batch = await Promise.all(
      Array.from({ length: concurrency }, async (_, i) => {
        const tenant = tenants[i % tenants.length] as CreatedTenant;
        const response = await query(tenant);
        if (response.status === 200) {
          const body = await response.json<{ rows: string[][] }>();
          expect(body.rows[0]?.[0]).toBe(tenant.database);
        } else {
          await response.body?.cancel();
        }
        return response.status;
      }),
    );
    statuses.push(...batch);
  }
  return statuses;
}

describe("Postgres restart under load", () => {
  it("fails fast while down, serves with no 5xx once back, and leaks nothing", async () => {
    const tenants = await Promise.all(
      Array.from({ length: 4 }, (_, i) => createTenant(uniqueTenantId(`pgr${i}`), { tier: "free" })),
    );
    expect(new Set(await load(tenants, 3, 12))).toEqual(new Set([200]));

    const during = load(tenants, 6, 12);
    await control("pg-stop");
    const down = await load(tenants, 2, 8);
    // Down: only retryable refusals, each with a hint.
    for (const status of down) expect([503]).toContain(status);
    await control("pg-start");
    const mixed = await during;
    for (const status of mixed) expect([200, 503]).toContain(status);

    // Back: each tenant serves again within a bounded number of tries (its pool replaces the
    // connections Postgres killed; a tenant caught starting during the outage waits out its backoff).
    for (const tenant of tenants) {
      let ok = false;
      for (let i = 0; i < 60 && !ok; i++) {
        const response = await query(tenant);
        ok = response.status === 200;
        await response.body?.cancel();
        if (!ok) await new Promise((resolve) => setTimeout(resolve, 250));
      }
      expect(ok).toBe(true);
    }
    const after = await load(tenants, 5, 12);
    expect(after.filter((status) => status >= 500)).toEqual([]);

    for (const tenant of tenants) {
      const status = await env.TENANTS.getByName(tenant.id).status();
      expect(status.leases).toBe(0);
      expect(status.state).toBe("ready");
    }
    const backends = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        "SELECT application_name AS app, state FROM pg_stat_activity WHERE application_name LIKE 'lessor:%'",
      );
      return rows as { app: string; state: string }[];
    });
    for (const tenant of tenants) {
      const generation = (await env.TENANTS.getByName(tenant.id).status()).generation;
      const mine = backends.filter((b) => b.app.startsWith(`lessor:${tenant.role}:`));
      // At most the pool's size, all of the live generation, none idle in a transaction.
      expect(mine.length).toBeLessThanOrEqual(2);
      for (const backend of mine) {
        expect(backend.app).toBe(`lessor:${tenant.role}:${generation}`);
        expect(backend.state).not.toMatch(/idle in transaction/);
      }
    }
  });
});
