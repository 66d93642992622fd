/**
 * Postgres stopped and restarted under load. The load runs from before the stop until every tenant
 * has been served again after the restart, and Postgres stays down until requests sent during the
 * outage have been answered: while it is down, requests fail fast with retryable answers (never
 * hang). Once it is back, every warm tenant serves again with no 5xx, leases return to zero, and no
 * backend is leaked: every pooled backend belongs to its tenant's live generation.
 */
import { env } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import {
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  pollUntil,
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

interface Answer {
  tenant: string;
  /** Logical times (one counter for the test) the request was sent and answered. */
  sent: number;
  answered: number;
  status: number;
  code: string | null;
  retryAfter: string | null;
}

describe("Postgres restart under load", () => {
  it("fails fast while down, serves with no 5xx once back, and leaks nothing", async () => {
    const tenants = await Promise.all(
      Array.from({ length: 4 }, (_, i) => createTenant(uniqueTenantId(`pgr${i}`), { tier: "free" })),
    );
    expect(new Set(await load(tenants, 3, 12))).toEqual(new Set([200]));

    // Load from before the stop until every tenant has been served again after the restart: 12
    // clients, each sending its next request when the last one is answered.
    let clock = 0;
    let stop = false;
    const answers: Answer[] = [];
    const client = async (i: number) => {
      const tenant = tenants[i % tenants.length] as CreatedTenant;
      for (let n = 0; n < 5_000 && !stop; n++) {
        const sent = clock++;
        const response = await query(tenant);
        const answered = clock++;
        const text = await response.text();
        let code: string | null = null;
        if (response.status === 200) {
          expect((JSON.parse(text) as { rows: string[][] }).rows[0]?.[0]).toBe(tenant.database);
        } else {
          code = (JSON.parse(text) as { code?: string }).code ?? text.slice(0, 100);
        }
        answers.push({
          tenant: tenant.id,
          sent,
          answered,
          status: response.status,
          code,
          retryAfter: response.headers.get("Retry-After"),
        });
        // A refused client waits a moment, as the hint says (not the whole hint: the test is bounded).
        if (response.status !== 200) await new Promise((resolve) => setTimeout(resolve, 100));
      }
    };
    const running = Promise.all(Array.from({ length: 12 }, (_, i) => client(i)));
    let stoppedAt = 0;
    let startedAt = 0;
    try {
      await pollUntil(
        async () => answers.length,
        (n) => n >= 24,
      );
      await control("pg-stop");
      stoppedAt = clock++;
      // Postgres stays down until requests sent during the outage have been answered: they failed
      // fast, they did not wait for it to come back.
      const refusedWhileDown = await pollUntil(
        async () => answers.filter((a) => a.sent > stoppedAt && a.status === 503).length,
        (n) => n >= 12,
        { attempts: 200, intervalMs: 100 },
      );
      expect(refusedWhileDown).toBeGreaterThanOrEqual(12);
      await control("pg-start");
      startedAt = clock++;
      // Back: every tenant is served again (its pool replaces the connections Postgres killed; a
      // tenant caught starting during the outage waits out its backoff).
      const servedAfter = await pollUntil(
        async () =>
          new Set(answers.filter((a) => a.sent > startedAt && a.status === 200).map((a) => a.tenant)),
        (set) => set.size === tenants.length,
        { attempts: 240, intervalMs: 250 },
      );
      expect(servedAfter.size).toBe(tenants.length);
    } finally {
      stop = true;
      await running;
    }
    // Only answers or retryable refusals, each refusal with a hint; both were seen, and the
    // refusals came while Postgres was down.
    const refusals = answers.filter((a) => a.status !== 200);
    for (const a of refusals) {
      expect(a, JSON.stringify(a)).toMatchObject({ status: 503 });
      expect(Number(a.retryAfter), JSON.stringify(a)).toBeGreaterThanOrEqual(1);
    }
    expect(answers.some((a) => a.status === 200 && a.answered < stoppedAt)).toBe(true);
    expect(refusals.some((a) => a.sent > stoppedAt && a.answered < startedAt)).toBe(true);
    expect(answers.some((a) => a.status === 200 && a.sent > startedAt)).toBe(true);

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
