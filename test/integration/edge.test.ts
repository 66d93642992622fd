/**
 * Hostile callers at the edge (issue 12): forged credentials cost nothing, nothing is recorded
 * before authentication, every answer is bounded, leases never overshoot, and failed logins are
 * rate-limited without ever locking out the right key.
 */
import { env, listDurableObjectIds } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { appSchemaVersionReported } from "../../src/campaigns/schema-version.ts";
import { mintTenantKey } from "../../src/crypto/tenant-keys.ts";
import { connectionsOpened } from "../../src/postgres/index.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  mapConcurrent,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

async function objectIds(): Promise<Set<string>> {
  return new Set((await listDurableObjectIds(env.TENANTS)).map((id) => id.toString()));
}

/** A key that looks right (a real key's shape, minted under another MAC key): the strongest forgery. */
async function forgedKey(tenantId: string): Promise<string> {
  const stranger = {
    current: 1,
    keys: new Map([[1, btoa(String.fromCharCode(...new Uint8Array(32).fill(77)))]]),
  };
  return (await mintTenantKey(stranger, tenantId)).key;
}

describe("forged credentials cost nothing", () => {
  it("300 forged requests create no object and open no connection, and a real tenant still starts", async () => {
    const before = await objectIds();
    const opened = connectionsOpened();
    const forged = await Promise.all(
      Array.from({ length: 300 }, async (_, i) => {
        const id = uniqueTenantId(`forged${i % 7}`);
        const key = i % 3 === 0 ? await forgedKey(id) : i % 3 === 1 ? `lsk_${"A".repeat(64)}` : "hunter2";
        return { id, key };
      }),
    );
    const statuses = await mapConcurrent(forged, 50, async ({ id, key }) => {
      const response = await sqlRequest(`postgres://${id}:${key}@lessor.test/${id}`, { query: "SELECT 1" });
      await response.text();
      return response.status;
    });
    // Each answer is the authentication failure (every id is tried once: no rate limit applies).
    expect(new Set(statuses)).toEqual(new Set([400]));
    const after = await objectIds();
    expect([...after].filter((id) => !before.has(id))).toEqual([]);
    for (const { id } of forged) expect(after.has(env.TENANTS.idFromName(id).toString())).toBe(false);
    expect(connectionsOpened()).toEqual(opened);

    // The positive control: the same counter moves when a real tenant's first request starts its
    // pool (a counter that never moved would have passed the check above).
    const real = await createTenant(uniqueTenantId("after-flood"));
    const beforeStart = connectionsOpened();
    const answer = await sqlRequest(real.connectionString, { query: "SELECT 1" });
    expect(answer.status).toBe(200);
    expect(connectionsOpened().tenant).toBeGreaterThan(beforeStart.tenant);
  });

  it("counts failed logins per tenant: past the limit 429 with Retry-After, while the right key still works", async () => {
    const tenant = await createTenant(uniqueTenantId("breaker"));
    const wrong = tenant.connectionString.replace(tenant.key, await forgedKey(tenant.id));
    // The limiter counts in fixed 10 s windows, so a run that straddles a window boundary may need
    // up to 40 failures before one is refused; the first 20 are never refused.
    const statuses: number[] = [];
    let retryAfter: string | null = null;
    for (let i = 0; i < 45 && retryAfter === null; i++) {
      const response = await sqlRequest(wrong, { query: "SELECT 1" });
      statuses.push(response.status);
      if (response.status === 429) retryAfter = response.headers.get("Retry-After");
      await response.text();
    }
    expect(statuses.slice(0, 20)).toEqual(Array.from({ length: 20 }, () => 400));
    expect(statuses.at(-1)).toBe(429);
    expect(new Set(statuses.slice(0, -1))).toEqual(new Set([400]));
    expect(Number(retryAfter)).toBeGreaterThanOrEqual(1);
    // Still refused while the window lasts.
    const again = await sqlRequest(wrong, { query: "SELECT 1" });
    expect(again.status).toBe(429);
    await again.text();
    // The right key is never counted, so never locked out.
    const right = await sqlRequest(tenant.connectionString, { query: "SELECT 1" });
    expect(right.status).toBe(200);
  });
});

describe("nothing is recorded before authentication", () => {
  it("Lessor-Schema-Version from a forged caller writes nothing; from the tenant's app it is recorded", async () => {
    const tenant = await createTenant(uniqueTenantId("seen"));
    expect((await sqlRequest(tenant.connectionString, { query: "SELECT 1" })).status).toBe(200);
    const forged = await sqlRequest(
      `postgres://${tenant.id}:${await forgedKey(tenant.id)}@lessor.test/${tenant.id}`,
      { query: "SELECT 1" },
      { "Lessor-Schema-Version": "2" },
    );
    expect(forged.status).toBe(400);
    // The Worker runs in this isolate: nothing was noted for the tenant, so nothing was written.
    expect(appSchemaVersionReported(tenant.id, 2)).toBe(false);

    // The app's own request: noted, and written off its path to the control plane.
    const real = await sqlRequest(
      tenant.connectionString,
      { query: "SELECT 1" },
      { "Lessor-Schema-Version": "2" },
    );
    expect(real.status).toBe(200);
    expect(appSchemaVersionReported(tenant.id, 2)).toBe(true);
    const seenRows = () =>
      asSuperuser(async (client) => {
        const { rows: seen } = await client.query(
          "SELECT count(*)::int AS n FROM app_schema_versions_seen WHERE version = 2 AND minute >= date_trunc('minute', now()) - interval '1 minute'",
        );
        return Number(seen[0]?.n);
      }, "lessor");
    expect(
      await pollUntil(seenRows, (n) => n >= 1, { attempts: 40, intervalMs: 100 }),
    ).toBeGreaterThanOrEqual(1);
  });
});

describe("every answer is bounded", () => {
  it("a result over LESSOR_MAX_RESPONSE_BYTES is 507, and the connection serves the next request", async () => {
    const tenant = await createTenant(uniqueTenantId("big"), { tier: "solo" });
    // Reading 12 MB is about bytes, not time: this tenant's statements get 10 minutes (test-only
    // setting, test-hooks.ts) so a loaded machine cannot turn the 507 into a statement timeout.
    tenantHooksForTests.config = (id) => (id === tenant.id ? { statementTimeoutMs: 600_000 } : undefined);
    try {
      await answersTooLarge(tenant);
    } finally {
      tenantHooksForTests.config = undefined;
    }
  });

  async function answersTooLarge(tenant: CreatedTenant): Promise<void> {
    // 12 MB in many rows, past the 10 MB limit: read and dropped, so the connection is drained
    // and stays (the same backend serves the next request).
    const [[pidBefore]] = (
      (await (
        await sqlRequest(tenant.connectionString, { query: "SELECT pg_backend_pid()::text" })
      ).json()) as {
        rows: string[][];
      }
    ).rows as [[string]];
    const many = await sqlRequest(tenant.connectionString, {
      query: "SELECT repeat('x', 1000) FROM generate_series(1, 12000)",
    });
    expect(many.status).toBe(507);
    expect(await many.json()).toMatchObject({ code: "response_too_large" });
    const after = (await (
      await sqlRequest(tenant.connectionString, { query: "SELECT pg_backend_pid()::text" })
    ).json()) as {
      rows: string[][];
    };
    expect(after.rows[0]?.[0]).toBe(pidBefore);

    // One row too big to wait for: the connection is cut, a new one serves.
    const huge = await sqlRequest(tenant.connectionString, {
      query: "SELECT repeat(repeat('x', 1000000), 60)",
    });
    expect(huge.status).toBe(507);
    expect(await huge.json()).toMatchObject({ code: "response_too_large" });
    const next = await sqlRequest(tenant.connectionString, { query: "SELECT 'fine'" });
    expect(next.status).toBe(200);
  }

  it("the same limit applies on a session lease", async () => {
    const tenant = await createTenant(uniqueTenantId("biglease"));
    const opened = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: "{}",
    });
    const { lease } = await opened.json<{ lease: string }>();
    const big = await lessor(`/v1/leases/${lease}/sql`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: JSON.stringify({ query: "SELECT repeat('x', 1000) FROM generate_series(1, 12000)" }),
    });
    expect(big.status).toBe(507);
    const small = await lessor(`/v1/leases/${lease}/sql`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}` },
      body: JSON.stringify({ query: "SELECT 1" }),
    });
    expect(small.status).toBe(200);
  });
});

describe("session leases never overshoot", () => {
  it("ten concurrent opens on a pool of two: exactly two leases, the rest lease_limit", async () => {
    const tenant = await createTenant(uniqueTenantId("burst"), { tier: "free" });
    const answers = await Promise.all(
      Array.from({ length: 10 }, () =>
        lessor(`/v1/tenants/${tenant.id}/leases`, {
          method: "POST",
          headers: { Authorization: `Bearer ${tenant.key}` },
          body: "{}",
        }).then(async (response) => ({
          status: response.status,
          body: (await response.json()) as { code?: string },
        })),
      ),
    );
    expect(answers.filter((a) => a.status === 201)).toHaveLength(2);
    for (const refused of answers.filter((a) => a.status !== 201)) {
      expect(refused).toMatchObject({ status: 503, body: { code: "lease_limit" } });
    }
    const status = await env.TENANTS.getByName(tenant.id).status();
    expect(status.sessions).toBe(2);
  });
});

describe("CORS", () => {
  it("answers /sql preflights as Neon does, and no admin route allows cross-origin calls", async () => {
    const preflight = await lessor("/sql", {
      method: "OPTIONS",
      headers: {
        Origin: "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "neon-connection-string, neon-raw-text-output",
      },
    });
    expect(preflight.status).toBeLessThan(300);
    expect(preflight.headers.get("Access-Control-Allow-Origin")).toBe("*");
    expect(preflight.headers.get("Access-Control-Allow-Headers")).toContain("Neon-Connection-String");
    expect(preflight.headers.get("Access-Control-Max-Age")).toBe("86400");
    const answered = await sqlRequest(null, { query: "SELECT 1" }, { Origin: "https://app.example" });
    expect(answered.headers.get("Access-Control-Allow-Origin")).toBe("*");

    const adminPreflight = await lessor("/v1/tenants", {
      method: "OPTIONS",
      headers: { Origin: "https://app.example", "Access-Control-Request-Method": "POST" },
    });
    expect(adminPreflight.headers.get("Access-Control-Allow-Origin")).toBeNull();
    const adminAnswer = await admin("/v1/capacity", { headers: { Origin: "https://app.example" } });
    expect(adminAnswer.headers.get("Access-Control-Allow-Origin")).toBeNull();
  });
});
