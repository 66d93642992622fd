/**
 * A move of a tenant with a row in every control-plane table that holds a tenant's rows (the
 * per-tenant data declaration, src/core/tenant-data.ts; issue 41, docs/invariants.md invariant 20),
 * checked table by table against what the declaration says a move does with it (src/move/store.ts):
 *
 * - `refuse`: while the tenant has a row there, its move is refused with the declared code, and
 *   nothing changes in either region's control plane;
 * - `stub`: the catalog row is in the new region with its placement, the old region keeps it `moved`;
 * - `copy`: the new region holds exactly the rows the old one held when the copy ran (same count,
 *   same contents), and the old region holds none (`cleanupSource`);
 * - `append`: each row carried once, none left in the old region;
 * - `leave`: the old region keeps every row, the new region gets none.
 *
 * The tables are the declaration's (Object.values(tenantData)), never a list of this file's; the
 * control plane's own schema is read too, so a table that holds the tenant's rows and is not
 * declared (dropped from the declaration) fails here. A table taken out of `copy` by giving it
 * another move action would follow the declaration, so the tenant's own views (its keys, JWT
 * configuration, usage and events, as the admin API answers them) must read the same in the new
 * region as they did in the old one, and the tenant must answer a query there.
 */
import { env, runDurableObjectAlarm } from "cloudflare:test";
import type { Client } from "@neondatabase/serverless";
import { afterEach, describe, expect, it } from "vitest";
import { type TenantDataTable, type TenantTable, tenantData } from "../../src/core/tenant-data.ts";
import { moveHooksForTests } from "../../src/move/test-hooks.ts";
import { tenantObject } from "../../src/placement/index.ts";
import { admin, asSuperuser, pollUntil, sqlRequest, uniqueTenantId } from "../integration/harness.ts";

type RegionName = "us" | "eu";
const databases: Record<RegionName, string> = { us: "lessor", eu: "lessor_eu" };

const declared: TenantTable[] = Object.values(tenantData);
/** The declaration's own key of each table (the name the move's counts are recorded under). */
const kindOf = new Map<string, TenantDataTable>(
  (Object.keys(tenantData) as TenantDataTable[]).map((kind) => [tenantData[kind].table, kind]),
);

afterEach(() => {
  moveHooksForTests.onStep = undefined;
});

function inRegion<T>(region: RegionName, work: (client: Client) => Promise<T>): Promise<T> {
  return asSuperuser(work, databases[region]);
}

const quoted = (identifier: string) => `"${identifier.replace(/"/g, '""')}"`;

/** What a table holds of the tenant: how many rows, and a digest of their contents (order-free). */
interface Held {
  n: number;
  digest: string;
}

/** Every declared table's rows of `id` in `region`'s control plane. */
function heldIn(region: RegionName, id: string): Promise<Record<string, Held>> {
  return inRegion(region, async (client) => {
    const held: Record<string, Held> = {};
    for (const { table, column } of declared) {
      const { rows } = await client.query(
        `SELECT count(*)::int AS n, coalesce(string_agg(md5(t::text), ',' ORDER BY md5(t::text)), '') AS digest
           FROM ${quoted(table)} t WHERE ${quoted(column)} = $1`,
        [id],
      );
      held[table] = { n: Number(rows[0]?.n ?? 0), digest: String(rows[0]?.digest ?? "") };
    }
    return held;
  });
}

const countsOf = (held: Record<string, Held>) =>
  Object.fromEntries(Object.entries(held).map(([table, { n }]) => [table, n]));

/** The control plane's tables that hold rows of `id`, read from its schema (not from the declaration). */
function schemaTablesHolding(region: RegionName, id: string): Promise<string[]> {
  return inRegion(region, async (client) => {
    const { rows } = await client.query(
      `SELECT c.table_name, c.column_name FROM information_schema.columns c
         JOIN information_schema.tables t USING (table_schema, table_name)
        WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
          AND (c.column_name = 'tenant_id' OR (c.table_name = 'tenants' AND c.column_name = 'id'))`,
    );
    const holding: string[] = [];
    for (const row of rows as { table_name: string; column_name: string }[]) {
      const found = await client.query(
        `SELECT 1 FROM ${quoted(row.table_name)} WHERE ${quoted(row.column_name)} = $1 LIMIT 1`,
        [id],
      );
      if (found.rows.length > 0) holding.push(row.table_name);
    }
    return holding.sort();
  });
}

interface Seed {
  /** Writes the tenant's row directly into the control plane (as the superuser); absent: the product writes it. */
  insert?: (client: Client, tenant: { id: string; host: string }) => Promise<unknown>;
}

/**
 * How the tenant gets its row in each declared table: the product writes some (its create, and its
 * first pool start); the rest are inserted as test/integration/tenant-data.test.ts does. Keyed by
 * the declaration, so a table declared later has no seed until one is written here (the compiler
 * says so, and the test's check that every declared table holds a row fails).
 */
const seeds: Record<TenantDataTable, Seed> = {
  tenants: {},
  tenantKeys: {},
  tenantCredentials: {},
  generationLedger: {},
  lifecycleEvents: {},
  auditLog: {},
  tenantJwt: {
    insert: (client, { id }) =>
      client.query(
        `INSERT INTO tenant_jwt (tenant_id, issuer, audiences, jwks_url, role, algorithms, clock_skew_seconds)
         VALUES ($1, 'https://issuer.test', '{app}', 'https://issuer.test/jwks.json', 'authenticated', '{RS256}', 30)`,
        [id],
      ),
  },
  usageDeltas: {
    insert: (client, { id }) =>
      client.query(
        "INSERT INTO usage_deltas (tenant_id, seq, queries, rows_returned, errors, lease_ms, pool_starts, at) VALUES ($1, 999999, 1, 1, 0, 1, 0, now())",
        [id],
      ),
  },
  usageRollups: {
    insert: (client, { id }) =>
      client.query(
        "INSERT INTO usage_rollups (tenant_id, queries, rows_returned, errors, lease_ms, pool_starts) VALUES ($1, 1, 1, 0, 1, 0) ON CONFLICT DO NOTHING",
        [id],
      ),
  },
  campaignTenants: {
    insert: async (client, { id, host }) => {
      await client.query(
        `INSERT INTO campaigns (id, state, to_version, concurrency, continue_on_failure, force, drain_timeout_ms, stability_window_ms)
         VALUES ($1, 'done', 1, 1, false, false, 1000, 0)`,
        [`c-${id}`],
      );
      await client.query(
        `INSERT INTO campaign_tenants (campaign_id, tenant_id, host, cohort, position, state, from_version)
         VALUES ($1, $2, $3, 'rollout', 0, 'succeeded', 1)`,
        [`c-${id}`, id, host],
      );
    },
  },
  // The tombstone of an earlier incarnation of the id (an ordinal no tenant of this stack reaches,
  // and no key ids: no holder of a key of the live tenant is told it was erased).
  tenantErasures: {
    insert: (client, { id, host }) =>
      client.query(
        `INSERT INTO tenant_erasures (ordinal, tenant_id, state, stage, host, actor, erased_at)
         VALUES ($1, $2, 'erased', 'commit', $3, 'test', now())`,
        [4_000_000_000_000 + Math.floor(Math.random() * 1_000_000_000), id, host],
      ),
  },
  // An earlier move's history row (the move it records is long done).
  tenantMoves: {
    insert: (client, { id, host }) =>
      client.query(
        `INSERT INTO tenant_moves (tenant_id, from_region, to_region, state, stage, tenant_status, host, actor)
         VALUES ($1, 'eu', 'us', 'moved', 'commit', 'active', $2, 'test')`,
        [id, host],
      ),
  },
  // The tenant's database is a customer's (as test/regions/holders-move.test.ts records it).
  adoptedDatabases: {
    insert: (client, { id }) =>
      client.query(
        `INSERT INTO adopted_databases (tenant_id, tunnel, hostname, port, credential_policy, report)
         VALUES ($1, 'cust', '127.0.0.1', 5432, 'customer', '{}'::jsonb)`,
        [id],
      ),
  },
};

/** The tenant as the admin API shows it in `region`: its keys, JWT configuration, usage and events. */
async function viewsIn(region: RegionName, id: string) {
  const read = async (path: string) => {
    const response = await admin(`/v1/tenants/${id}${path}?region=${region}`);
    expect(response.status, `${path} in ${region}: ${await response.clone().text()}`).toBe(200);
    return response.json<Record<string, unknown>>();
  };
  const keys = (await read("/keys")).keys as { keyId: string; scope: string; createdAt: string }[];
  const usage = await read("/usage");
  const events = (await read("/events")).events as Record<string, unknown>[];
  return {
    keys: keys.map(({ keyId, scope, createdAt }) => ({ keyId, scope, createdAt })),
    jwt: (await read("/jwt")).jwt,
    usage: { usage: usage.usage, unfoldedDeltas: usage.unfoldedDeltas },
    events,
  };
}

/** One `/sql` query; the generation its connection was named for (application_name `lessor:<role>:<gen>`). */
async function queryGeneration(connectionString: string): Promise<number> {
  const response = await sqlRequest(connectionString, {
    query: "SELECT current_setting('application_name') AS app",
    params: [],
  });
  expect(response.status, await response.clone().text()).toBe(200);
  const body = await response.json<{ rows: string[][] }>();
  return Number(body.rows[0]?.[0]?.split(":").at(-1));
}

describe("a move of a tenant with a row in every declared table (issue 41)", () => {
  it("is refused while a `refuse` table holds a row; then does with every table what the declaration says", {
    timeout: 120_000,
  }, async () => {
    const id = uniqueTenantId("every-table");
    const created = await admin("/v1/tenants", { method: "POST", json: { id, region: "us" } });
    expect(created.status, await created.clone().text()).toBe(201);
    const { connectionString } = await created.json<{ connectionString: string }>();
    const generationBefore = await queryGeneration(connectionString);
    const host = await inRegion("us", async (client) => {
      const { rows } = await client.query("SELECT host FROM tenants WHERE id = $1", [id]);
      return String(rows[0]?.host);
    });
    try {
      // ── A row in every declared table ────────────────────────────────────────────────────────
      await inRegion("us", async (client) => {
        for (const seed of Object.values(seeds)) await seed.insert?.(client, { id, host });
      });
      // The heartbeat flushes the object's outboxes (the query's usage, its pool start's events,
      // its key's use) now, so nothing of the tenant's reaches the control plane behind the test.
      await runDurableObjectAlarm(tenantObject(env, "us", id));
      const seeded = await pollUntil(
        () => heldIn("us", id),
        (held) => Object.values(held).every(({ n }) => n > 0),
      );
      for (const { table } of declared) expect(seeded[table]?.n, `${table} holds a row`).toBeGreaterThan(0);
      // And the schema agrees: every table that holds a row of the tenant is declared.
      expect(await schemaTablesHolding("us", id)).toEqual(declared.map(({ table }) => table).sort());
      // The new region holds nothing of the id.
      expect(Object.values(countsOf(await heldIn("eu", id))).every((n) => n === 0)).toBe(true);

      // ── `refuse`: refused with the declared code; nothing changes in either region ───────────
      const refusing = declared.filter((t) => t.move.do === "refuse");
      for (const { table, move } of refusing) {
        expect(move.do).toBe("refuse");
        if (move.do !== "refuse") continue;
        const before = { us: await heldIn("us", id), eu: await heldIn("eu", id) };
        const refused = await admin(`/v1/tenants/${id}/move?region=us`, {
          method: "POST",
          json: { region: "eu" },
        });
        expect(refused.status, table).toBe(409);
        expect(await refused.json(), table).toMatchObject({ code: move.code });
        expect({ us: await heldIn("us", id), eu: await heldIn("eu", id) }, table).toEqual(before);
        expect((await tenantObject(env, "us", id).status()).move).toBeNull();
      }
      // The rows that refuse the move go (the tenant is no longer attached), and it moves.
      await inRegion("us", async (client) => {
        for (const { table, column } of refusing) {
          await client.query(`DELETE FROM ${quoted(table)} WHERE ${quoted(column)} = $1`, [id]);
        }
      });
      const views = await viewsIn("us", id);

      // ── The move ────────────────────────────────────────────────────────────────────────────
      // What the copy reads: the old region's rows just before the copy starts (after the drain
      // flushed the object's outboxes), and the new region's, which must be empty.
      const snapshot: { atCopy?: { us: Record<string, Held>; eu: Record<string, Held> }; failed?: unknown } =
        {};
      moveHooksForTests.onStep = async ({ tenantId, step }) => {
        if (tenantId !== id || step.point !== "started" || step.stage !== "copy" || snapshot.atCopy) return;
        try {
          snapshot.atCopy = { us: await heldIn("us", id), eu: await heldIn("eu", id) };
        } catch (error) {
          snapshot.failed = error;
        }
      };
      const started = await admin(`/v1/tenants/${id}/move?region=us`, {
        method: "POST",
        json: { region: "eu" },
      });
      expect(started.status, await started.clone().text()).toBe(202);
      const done = await pollUntil(
        async () => (await admin(`/v1/tenants/${id}/move?region=us`)).json<{ state: string }>(),
        (view) => view.state === "moved",
        { attempts: 240, intervalMs: 250 },
      );
      expect(done, JSON.stringify(done)).toMatchObject({ state: "moved", from: "us", to: "eu" });
      moveHooksForTests.onStep = undefined;
      expect(snapshot.failed).toBeUndefined();
      if (!snapshot.atCopy) throw new Error("the copy stage never started");
      const source = snapshot.atCopy.us;
      expect(Object.values(countsOf(snapshot.atCopy.eu)).every((n) => n === 0)).toBe(true);

      // ── Table by table, as the declaration says ─────────────────────────────────────────────
      const after = { us: await heldIn("us", id), eu: await heldIn("eu", id) };
      const job = await inRegion("us", async (client) => {
        const { rows } = await client.query(
          "SELECT counts FROM tenant_moves WHERE tenant_id = $1 AND state = 'moved' AND from_region = 'us' ORDER BY id DESC LIMIT 1",
          [id],
        );
        return rows[0]?.counts as Record<string, Record<string, number>>;
      });
      const catalog = (region: RegionName) =>
        inRegion(region, async (client) => {
          const { rows } = await client.query(
            "SELECT status, tier, host, database_name, role_name, schema_version, created_at FROM tenants WHERE id = $1",
            [id],
          );
          return rows;
        });
      for (const { table, move } of declared) {
        const kind = kindOf.get(table) as TenantDataTable;
        const was = source[table] ?? { n: -1, digest: "" };
        const us = after.us[table] ?? { n: -1, digest: "" };
        const eu = after.eu[table] ?? { n: -1, digest: "" };
        switch (move.do) {
          case "stub": {
            // One row in each region: the new one serves it, with the same placement; the old one
            // keeps the `moved` stub.
            const [inUs, inEu] = [await catalog("us"), await catalog("eu")];
            expect(inUs, table).toHaveLength(1);
            expect(inEu, table).toHaveLength(1);
            expect(inUs[0]?.status, table).toBe("moved");
            expect(inEu[0]?.status, table).toBe("active");
            expect({ ...inEu[0], status: null }, table).toEqual({ ...inUs[0], status: null });
            break;
          }
          case "copy":
            // Exactly what the old region held when the copy ran, and nothing left behind.
            expect(was.n, `${table} held rows to copy`).toBeGreaterThan(0);
            expect(eu, `${table} in the new region`).toEqual(was);
            expect(us.n, `${table} cleaned up in the old region`).toBe(0);
            expect(job?.copy?.[kind], `${table}: the copy's count`).toBe(was.n);
            expect(job?.cleanup?.[kind], `${table}: the cleanup's count`).toBe(was.n);
            break;
          case "append":
            // Each row carried once (the new region may add its own: the move's audit row), none
            // left behind.
            expect(was.n, `${table} held rows to append`).toBeGreaterThan(0);
            expect(job?.copy?.[kind], `${table}: the copy's count`).toBe(was.n);
            expect(eu.n, `${table} in the new region`).toBeGreaterThanOrEqual(was.n);
            expect(us.n, `${table} cleaned up in the old region`).toBe(0);
            expect(job?.cleanup?.[kind], `${table}: the cleanup's count`).toBe(was.n);
            break;
          case "leave":
            // Stays where it was written: every row in the old region, none in the new one.
            expect(was.n, `${table} held rows to leave`).toBeGreaterThan(0);
            expect(us.n, `${table} kept in the old region`).toBe(was.n);
            expect(eu.n, `${table} not copied`).toBe(0);
            expect(job?.copy?.[kind], `${table}: not in the copy's counts`).toBeUndefined();
            expect(job?.cleanup?.[kind], `${table}: not in the cleanup's counts`).toBeUndefined();
            break;
          case "refuse":
            // Never copied (the test removed the rows that refused the move before it ran).
            expect(eu.n, `${table} not copied`).toBe(0);
            expect(job?.copy?.[kind], `${table}: not in the copy's counts`).toBeUndefined();
            break;
        }
      }
      // The audit trail came along, and the move wrote its one row in the new region.
      const actions = (region: RegionName) =>
        inRegion(region, async (client) => {
          const { rows } = await client.query(
            "SELECT action FROM audit_log WHERE tenant_id = $1 ORDER BY id",
            [id],
          );
          return rows.map((row: { action: string }) => row.action);
        });
      expect((await actions("eu")).filter((action) => action === "tenant.move")).toEqual(["tenant.move"]);
      expect((await actions("eu")).length).toBe((source.audit_log?.n ?? 0) + 1);

      // ── The tenant, as the API and a query see it in the new region ─────────────────────────
      const moved = await viewsIn("eu", id);
      expect(moved.keys).toEqual(views.keys);
      expect(moved.jwt).toEqual(views.jwt);
      expect(moved.usage).toEqual(views.usage);
      for (const event of views.events) expect(moved.events).toContainEqual(event);
      const generationAfter = await queryGeneration(connectionString);
      expect(generationAfter).toBeGreaterThan(generationBefore);
      expect((await tenantObject(env, "eu", id).status()).state).toBe("ready");
      expect((await tenantObject(env, "us", id).status()).move).toEqual({ state: "moved", to: "eu" });
    } finally {
      moveHooksForTests.onStep = undefined;
      // The campaign this test invented goes (its rows are the old region's; nothing else reads them).
      await inRegion("us", async (client) => {
        await client.query("DELETE FROM campaign_tenants WHERE campaign_id = $1", [`c-${id}`]);
        await client.query("DELETE FROM campaigns WHERE id = $1", [`c-${id}`]);
      });
    }
  });
});
