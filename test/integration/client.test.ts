/**
 * lessor/client against the real test stack (Lessor's fetch handler, real Postgres): typed rows
 * through `sql` and drizzle, a draining tenant answered by a retried success or a typed error, and
 * a session lease's round trip (typed rows, commit, rollback, release).
 */
import { exports } from "cloudflare:workers";
import { NeonDbError } from "@neondatabase/serverless";
import { eq } from "drizzle-orm";
import { drizzle } from "drizzle-orm/neon-http";
import { describe, expect, it } from "vitest";
import { createClient, type LessorClientOptions, LessorResponseError } from "../../src/client/index.ts";
import { systemClock } from "../../src/client/retry.ts";
import { notes } from "../fixtures/tenant-schema/schema.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  runtimeOf,
  sqlFor,
  uniqueTenantId,
} from "./harness.ts";

/** Lessor's fetch handler, as the client's `fetch`. */
function lessorFetch(url: string, init: RequestInit): Promise<Response> {
  return exports.default.fetch(new Request(url, init));
}

function clientFor(tenant: CreatedTenant, options: LessorClientOptions = {}) {
  return createClient(tenant.connectionString, { fetch: lessorFetch, ...options });
}

async function notesSeenOutside(tenant: CreatedTenant): Promise<string[]> {
  const { rows } = await asSuperuser(
    (client) => client.query("SELECT body FROM notes ORDER BY id"),
    tenant.database,
  );
  return rows.map((row: { body: string }) => row.body);
}

describe("lessor/client on the stack", () => {
  it("queries with rows typed as neon() types them, and serves drizzle's neon-http", async () => {
    const tenant = await createTenant(uniqueTenantId("client-sql"));
    const { sql } = clientFor(tenant);
    const [inserted] = await sql`
      INSERT INTO notes (body, tags, attributes, stars) VALUES (${"first"}, ${["a", "b"]}, ${{ x: 1 }}, ${3})
      RETURNING id, body, tags, attributes, stars, created_at`;
    expect(inserted).toMatchObject({ body: "first", tags: ["a", "b"], attributes: { x: 1 }, stars: 3 });
    expect(typeof inserted?.id).toBe("number");
    // The same values neon() itself returns. (Compared, not assumed: drizzle's neon-http replaces the
    // driver's global date parsers, so whether created_at is a Date depends on what ran before.)
    expect(await sql`SELECT * FROM notes`).toEqual(await sqlFor(tenant)`SELECT * FROM notes`);

    const db = drizzle({ client: sql });
    await db.insert(notes).values({ body: "second", stars: 5 });
    const starred = await db.select({ body: notes.body }).from(notes).where(eq(notes.stars, 5));
    expect(starred).toEqual([{ body: "second" }]);
  });

  it("leaves a Postgres error the driver's NeonDbError", async () => {
    const tenant = await createTenant(uniqueTenantId("client-pg"));
    const error = await clientFor(tenant).sql`SELECT 1/0`.catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(NeonDbError);
    expect(error).toMatchObject({ code: "22012" });
  });

  it("answers a draining tenant with a typed error, or with a retried success once the drain ends", async () => {
    const tenant = await createTenant(uniqueTenantId("client-drain"));
    const client = clientFor(tenant);
    // A held lease keeps the drain from finishing: new work is refused with a retry hint.
    const lease = await client.lease({ ttlMs: 60_000 });
    const drain = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    expect(drain.status).toBe(202);

    const once = clientFor(tenant, { retry: { maxAttempts: 1 } });
    const refused = await once.sql`SELECT 1`.catch((caught: unknown) => caught);
    expect(refused).toBeInstanceOf(LessorResponseError);
    expect(refused).toMatchObject({ code: "tenant_draining", status: 503, attempts: 1 });
    expect((refused as LessorResponseError).retryAfter).toBeGreaterThanOrEqual(1);

    // The first refusal releases the lease; the drain then ends, and the retry starts a new pool.
    let refusals = 0;
    // Real time, with each wait the client asks for recorded.
    const waits: number[] = [];
    const patient = clientFor(tenant, {
      fetch: async (url, init) => {
        const response = await lessorFetch(url, init);
        if (response.status === 503 && refusals++ === 0) await lease.release();
        return response;
      },
      clock: {
        now: systemClock.now,
        sleep: (ms, signal) => {
          waits.push(ms);
          return systemClock.sleep(ms, signal);
        },
      },
    });
    expect(await patient.sql`SELECT 2 AS n`).toEqual([{ n: 2 }]);
    expect(refusals).toBe(1);
    // It honoured Retry-After (at least 1 s) before sending again.
    expect(waits).toHaveLength(1);
    expect(waits[0]).toBeGreaterThanOrEqual(1000);
    expect((await runtimeOf(tenant.id)).generation).toBe(2);
  });

  it("runs a session lease: typed rows, commit, rollback, release", async () => {
    const tenant = await createTenant(uniqueTenantId("client-lease"));
    const client = clientFor(tenant);
    const lease = await client.lease({ ttlMs: 30_000 });
    expect(lease.id).toMatch(/^lsl_/);
    expect(lease.expiresAt.getTime()).toBeGreaterThan(Date.now());

    const committed = await lease.transaction(async (tx) => {
      const [row] = await tx.query(
        "INSERT INTO notes (body, tags, attributes) VALUES ($1, $2, $3) RETURNING id, tags, attributes, created_at",
        ["kept", ["x", "y"], { deep: [1, 2] }],
      );
      // Not committed yet: another connection does not see it.
      expect(await notesSeenOutside(tenant)).toEqual([]);
      return row;
    });
    expect(committed).toMatchObject({ tags: ["x", "y"], attributes: { deep: [1, 2] } });
    expect(typeof committed?.id).toBe("number");
    const sameQuery = "SELECT id, tags, attributes, created_at FROM notes WHERE id = $1";
    expect(await lease.query(sameQuery, [committed?.id])).toEqual(
      await sqlFor(tenant).query(sameQuery, [committed?.id]),
    );
    expect(await notesSeenOutside(tenant)).toEqual(["kept"]);

    await expect(
      lease.transaction(async (tx) => {
        await tx.query("INSERT INTO notes (body) VALUES ($1)", ["dropped"]);
        throw new Error("undo");
      }),
    ).rejects.toThrow("undo");
    expect(await notesSeenOutside(tenant)).toEqual(["kept"]);

    // A failed statement whose error the callback swallowed: COMMIT turns into ROLLBACK, and says so.
    await expect(
      lease.transaction(async (tx) => {
        await tx.query("INSERT INTO notes (body) VALUES ($1)", ["half"]);
        await tx.query("SELECT 1/0").catch(() => undefined);
      }),
    ).rejects.toThrow(/rolled back, not committed/);
    expect(await notesSeenOutside(tenant)).toEqual(["kept"]);

    const counted = await lease.query("SELECT count(*)::int AS n FROM notes", [], { fullResults: true });
    expect(counted).toMatchObject({ command: "SELECT", rowCount: 1, rows: [{ n: 1 }] });

    await lease.release();
    expect((await runtimeOf(tenant.id)).leases).toBe(0);
    await expect(lease.query("SELECT 1")).rejects.toMatchObject({
      name: "LessorResponseError",
      code: "lease_not_found",
      status: 404,
    });
  });
});
