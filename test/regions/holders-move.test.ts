/**
 * A move against every kind of holder (issue 41, docs/invariants.md invariants 17 and 20): a `/sql`
 * flight is waited for, a REST session lease and a session-mode wire connection are ended at the
 * drain (`tenant_moving`), an idle transaction-mode wire connection at the switch with FATAL 57P01
 * `tenant_moved`, which a driver answers by reconnecting, and the reconnection reaches the new
 * owner. An attached tenant (its database behind a tunnel of the default region) is refused.
 */
import { describe, expect, it } from "vitest";
import { holderOutcome } from "../../src/core/holders.ts";
import { concatBytes, frontend, type Message, textMessage } from "../../src/core/pg-wire.ts";
import { admin, asSuperuser, lessor, pollUntil, sqlRequest, uniqueTenantId } from "../integration/harness.ts";
import { fieldsOf, RawWire, typesOf } from "../integration/wire-client.ts";

const q = (sql: string) => textMessage(frontend.query, sql);

function errorOf(messages: readonly Message[]): Record<string, string> {
  return fieldsOf(messages.find((message) => message.type === 0x45));
}

interface Tenant {
  id: string;
  key: string;
  connectionString: string;
}

async function createInUs(prefix: string): Promise<Tenant> {
  const id = uniqueTenantId(prefix);
  const response = await admin("/v1/tenants", {
    method: "POST",
    json: { id, region: "us", tier: "standard" },
  });
  expect(response.status, await response.clone().text()).toBe(201);
  const body = await response.json<{ key: string; connectionString: string }>();
  return { id, key: body.key, connectionString: body.connectionString };
}

async function wireOf(tenant: Tenant, mode: "transaction" | "session"): Promise<RawWire> {
  const wire = await RawWire.connect(tenant.id, tenant.key, { options: `-c lessor.pool_mode=${mode}` });
  expect(typesOf(await wire.untilReady())).toContain("Z");
  wire.send(q("SELECT 1"));
  expect(typesOf(await wire.untilReady())).toContain("D");
  return wire;
}

function untilMoved(id: string) {
  return pollUntil(
    async () =>
      (await admin(`/v1/tenants/${id}/move?region=us`)).json<{ state: string; lastError?: string }>(),
    (view) => view.state === "moved",
    { attempts: 160, intervalMs: 250 },
  );
}

describe("a move ends every holder as src/core/holders.ts says (issue 41)", () => {
  it("waits for a flight, ends session leases and session-mode connections at the drain, idle transaction-mode ones at the switch; a reconnect reaches the new owner", async () => {
    const tenant = await createInUs("hold-move");
    const transaction = await wireOf(tenant, "transaction");
    const session = await wireOf(tenant, "session");
    const opened = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: { authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
      body: JSON.stringify({ ttlMs: 60_000 }),
    });
    expect(opened.status).toBe(201);
    const { lease } = await opened.json<{ lease: string }>();
    const flight = sqlRequest(tenant.connectionString, { query: "SELECT pg_sleep(1)", params: [] });

    const moved = await admin(`/v1/tenants/${tenant.id}/move?region=us`, {
      method: "POST",
      json: { region: "eu" },
    });
    expect(moved.status, await moved.clone().text()).toBeLessThan(300);
    expect((await flight).status).toBe(200);
    expect(holderOutcome("move_drain", "wire_session")).toMatchObject({ do: "end", code: "tenant_moving" });
    expect(errorOf(await session.untilClosed(30_000))).toMatchObject({
      S: "FATAL",
      C: "57P03",
      D: "tenant_moving",
    });
    expect((await untilMoved(tenant.id)).state).toBe("moved");
    expect(errorOf(await transaction.untilClosed(30_000))).toMatchObject({
      S: "FATAL",
      C: "57P01",
      D: "tenant_moved",
    });
    const onLease = await lessor(`/v1/leases/${lease}/sql`, {
      method: "POST",
      headers: { authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
      body: JSON.stringify({ query: "SELECT 1", params: [] }),
    });
    expect(onLease.status).not.toBe(200);
    // The driver's reconnection, with the same key, reaches the new owner.
    const again = await RawWire.connect(tenant.id, tenant.key);
    expect(typesOf(await again.untilReady())).toContain("Z");
    again.send(concatBytes([q("SELECT 1")]));
    expect(typesOf(await again.untilReady())).toContain("D");
    again.close();
  });

  it("refuses to move an attached tenant with 409 tenant_attached: its adoption stays in the default region", async () => {
    const tenant = await createInUs("hold-attached");
    // The tenant's database is a customer's: the adoption record is what the placement rule reads.
    await asSuperuser(async (client) => {
      await client.query(
        `INSERT INTO adopted_databases (tenant_id, tunnel, hostname, port, credential_policy, report)
         VALUES ($1, 'cust', '127.0.0.1', 5432, 'customer', '{}'::jsonb)`,
        [tenant.id],
      );
    }, "lessor");
    const moved = await admin(`/v1/tenants/${tenant.id}/move?region=us`, {
      method: "POST",
      json: { region: "eu" },
    });
    expect(moved.status).toBe(409);
    expect(await moved.json()).toMatchObject({ code: "tenant_attached" });
    // Nothing was fenced: the tenant still serves where it is.
    const still = await sqlRequest(tenant.connectionString, { query: "SELECT 1", params: [] });
    expect(still.status).toBe(200);
    await asSuperuser(async (client) => {
      await client.query("DELETE FROM adopted_databases WHERE tenant_id = $1", [tenant.id]);
    }, "lessor");
  });
});
