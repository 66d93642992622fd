/**
 * Every file in examples/ runs against the test stack, so the docs' quotes of them never rot
 * (test/unit/client-examples.test.ts checks that the README and docs/examples.md quote them verbatim and that this file
 * imports each one). Each example exports `main(options)`; here it gets a fresh tenant's connection
 * string and Lessor's fetch handler, and no LESSOR_URL, so it finds Lessor from the connection
 * string's host and port as it does on a laptop.
 */
import { exports } from "cloudflare:workers";
import { neonConfig } from "@neondatabase/serverless";
import { describe, expect, it } from "vitest";
import { devJwtConfig, mintDevToken, newDevSigningKey } from "../../cli/jwt-dev.ts";
import { main as drizzleExample } from "../../examples/drizzle.mjs";
import { main as leaseExample } from "../../examples/lease.mjs";
import { main as quickstart } from "../../examples/quickstart.mjs";
import { main as rlsExample } from "../../examples/rls.mjs";
import { main as transactionExample } from "../../examples/transaction.mjs";
import { main as wireDrizzleExample } from "../../examples/wire-drizzle.mjs";
import { main as wirePoolExample } from "../../examples/wire-pool.mjs";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  runtimeOf,
  uniqueTenantId,
} from "./harness.ts";
import { LessorWebSocket } from "./wire-client.ts";

function lessorFetch(url: string, init: RequestInit): Promise<Response> {
  return exports.default.fetch(new Request(url, init));
}

async function options(prefix: string): Promise<{ tenant: CreatedTenant; connectionString: string }> {
  const tenant = await createTenant(uniqueTenantId(prefix));
  return { tenant, connectionString: tenant.connectionString };
}

/**
 * Runs a wire example, which points the driver's global settings at Lessor as an app does, then
 * puts them back: the harness's own connections use the same globals to reach the test Postgres.
 */
async function withDriverGlobals<T>(run: () => Promise<T>): Promise<T> {
  const saved = {
    wsProxy: neonConfig.wsProxy,
    useSecureWebSocket: neonConfig.useSecureWebSocket,
    webSocketConstructor: neonConfig.webSocketConstructor,
  };
  try {
    return await run();
  } finally {
    Object.assign(neonConfig, saved);
  }
}

/** The notes as Postgres has them, read around Lessor. */
async function notesOf(tenant: CreatedTenant): Promise<{ body: string; stars: number }[]> {
  const { rows } = await asSuperuser(
    (client) => client.query("SELECT body, stars FROM notes ORDER BY id"),
    tenant.database,
  );
  return rows as { body: string; stars: number }[];
}

describe("examples/", () => {
  it("quickstart.mjs: neon() inserts a note and reads it back", async () => {
    const { tenant, connectionString } = await options("ex-quick");
    const rows = await quickstart({ connectionString, fetchFunction: lessorFetch });
    expect(rows).toEqual([{ id: 1, body: "hello from the quickstart", created_at: expect.anything() }]);
    expect(await notesOf(tenant)).toEqual([{ body: "hello from the quickstart", stars: 0 }]);
  });

  it("drizzle.mjs: drizzle's neon-http inserts into the typed notes table and selects", async () => {
    const { tenant, connectionString } = await options("ex-drizzle");
    const rows = await drizzleExample({ connectionString, fetchFunction: lessorFetch });
    expect(rows).toEqual([{ id: 1, body: "hello from drizzle", tags: ["example"], stars: 5 }]);
    expect(await notesOf(tenant)).toEqual([{ body: "hello from drizzle", stars: 5 }]);
  });

  it("transaction.mjs: commits both statements, and a failing transaction leaves nothing", async () => {
    const { tenant, connectionString } = await options("ex-tx");
    const outcome = await transactionExample({ connectionString, fetchFunction: lessorFetch });
    expect(outcome).toEqual({ committed: [1, 2], failure: "rolled back: division by zero", notesAdded: 2 });
    expect((await notesOf(tenant)).map((note) => note.body)).toEqual(["first of two", "second of two"]);
  });

  it("lease.mjs: an interactive transaction on a session lease, released afterwards", async () => {
    const { tenant, connectionString } = await options("ex-lease");
    const starred = await leaseExample({ connectionString, fetchFunction: lessorFetch });
    expect(starred).toMatchObject({ id: 1, body: "starred on a lease", stars: 1 });
    expect(await notesOf(tenant)).toEqual([{ body: "starred on a lease", stars: 1 }]);
    expect((await runtimeOf(tenant.id)).leases).toBe(0);
  });

  it("rls.mjs: two end users' tokens, each seeing only their own rows (tokens as lessorctl jwt dev mints them)", async () => {
    const { tenant, connectionString } = await options("ex-rls");
    // What `npx lessorctl jwt dev <tenant>` does (docs/rls.md starts from it), with its own code:
    // a key pair, JWT mode trusting it as a static key set, and a token per user.
    const key = await newDevSigningKey();
    const configured = await admin(`/v1/tenants/${tenant.id}/jwt`, {
      method: "PUT",
      json: devJwtConfig(key),
    });
    expect(configured.status).toBe(200);
    const tokenFor = async (user: string) => (await mintDevToken(key, user, 300)).token;
    const seen = await rlsExample({
      connectionString,
      aliceToken: await tokenFor("alice"),
      bobToken: await tokenFor("bob"),
      fetchFunction: lessorFetch,
    });
    expect(seen).toEqual({
      alice: [{ user_id: "alice", task: "water the plants" }],
      bob: [{ user_id: "bob", task: "call the plumber" }],
    });
  });

  it("wire-pool.mjs: the Neon Pool over /v2, an interactive transaction, then a query", async () => {
    const { tenant, connectionString } = await options("ex-wire-pool");
    const rows = await withDriverGlobals(() =>
      wirePoolExample({ connectionString, webSocketConstructor: LessorWebSocket }),
    );
    expect(rows).toEqual([{ id: 1, body: "hello over the wire", stars: 1 }]);
    expect(await notesOf(tenant)).toEqual([{ body: "hello over the wire", stars: 1 }]);
    expect((await runtimeOf(tenant.id)).leases).toBe(0);
  });

  it("wire-drizzle.mjs: drizzle neon-serverless commits one transaction and rolls one back inside", async () => {
    const { tenant, connectionString } = await options("ex-wire-drizzle");
    const outcome = await withDriverGlobals(() =>
      wireDrizzleExample({ connectionString, webSocketConstructor: LessorWebSocket }),
    );
    expect(outcome).toEqual({
      refused: "rolled back: Rollback",
      kept: [
        { body: "taker", stars: 2 },
        { body: "giver", stars: 1 },
      ],
    });
    expect(await notesOf(tenant)).toEqual([
      { body: "giver", stars: 1 },
      { body: "taker", stars: 2 },
    ]);
  });
});
