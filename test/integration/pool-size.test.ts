/**
 * Pools larger than six (docs/adr/030-pools-larger-than-six.md, docs/invariants.md invariant 24):
 * the platform bounds how many of an object's connections are opening at once, not how many it
 * holds. Inside a Durable Object, a pool of twelve takes twelve connections to the real Postgres
 * (through the real driver and proxy), and its connections open at most six at a time
 * (src/postgres/opening-gate.ts), however many checkouts ask at once. The condition is made: twelve checkouts start in the same turn, so twelve opens
 * would run together without the gate.
 */
import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import type { PoolClient } from "@neondatabase/serverless";
import { describe, expect, it } from "vitest";
import { loadConfig, maxPoolSize } from "../../src/config/index.ts";
import { type ConnectionTarget, endPool, openPool } from "../../src/postgres/index.ts";
import { maxOpeningAtOnce, OpeningGate } from "../../src/postgres/opening-gate.ts";
import { sessionLimits } from "../../src/tenant-db/connect.ts";
import { asSuperuser, hostAdminUrl, uniqueTenantId } from "./harness.ts";

/** The host admin's address and credential (the pool's role does not matter here). */
function adminTarget(): ConnectionTarget {
  const url = new URL(hostAdminUrl("local"));
  return {
    host: url.hostname,
    port: Number(url.port || 5432),
    user: decodeURIComponent(url.username),
    password: decodeURIComponent(url.password),
    database: decodeURIComponent(url.pathname.replace(/^\//, "")) || "postgres",
  };
}

describe("a pool larger than six", () => {
  it("holds twelve connections at once, opened at most six at a time", async () => {
    expect(maxPoolSize).toBeGreaterThanOrEqual(24);
    const config = loadConfig(env);
    const applicationName = `lessor:test:${uniqueTenantId("wide")}`;
    const stub = env.TENANTS.getByName(uniqueTenantId("wide-object"));
    const outcome = await runInDurableObject(stub, async () => {
      const gate = new OpeningGate();
      const pool = openPool(config, adminTarget(), {
        max: 12,
        applicationName,
        limits: sessionLimits(config),
        loginToken: null,
        openingGate: gate,
        onError: () => undefined,
      });
      let inside = 0;
      let insideMost = 0;
      const clients = await Promise.all(
        Array.from({ length: 12 }, async () => {
          const client: PoolClient = await pool.connect();
          inside++;
          insideMost = Math.max(insideMost, inside);
          return client;
        }),
      );
      // All twelve are held now: Postgres has twelve backends of the pool.
      const backends = await asSuperuser(async (superuser) => {
        const { rows } = await superuser.query(
          "SELECT count(*)::int AS n FROM pg_catalog.pg_stat_activity WHERE application_name = $1",
          [applicationName],
        );
        return Number(rows[0]?.n ?? 0);
      });
      const answers = await Promise.all(
        clients.map(async (client) => (await client.query("SELECT 1 AS n")).rows[0]?.n),
      );
      for (const client of clients) client.release();
      const ended = await endPool(pool);
      return { backends, answers, insideMost, peak: gate.peak, opening: gate.size, ended };
    });
    expect(outcome.backends).toBe(12);
    expect(outcome.insideMost).toBe(12);
    expect(outcome.answers).toEqual(Array.from({ length: 12 }, () => 1));
    // Twelve asked at once, and the gate held them to the platform's six.
    expect(outcome.peak).toBe(maxOpeningAtOnce);
    expect(outcome.opening).toBe(0);
    expect(outcome.ended).toBe("ended");
  });
});
