/**
 * Every holder of a tenant against every operation that must end, refuse or wait for holders
 * (issue 41, docs/invariants.md invariant 17, docs/adr/026-tenant-object-kernel.md).
 *
 * For each operation, one tenant holds one live holder of every kind at once (a `/sql` flight, a
 * REST session lease, a transaction-mode and a session-mode wire connection, all opened with one
 * key); the operation runs; each holder ends as the policy table (src/core/holders.ts) says: ended
 * with its code, waited for, or kept. The kinds and the expectations are read from that table, so
 * a kind added there without a live holder here fails `holderOpeners`' type, and a kind the
 * registry forgets fails its row here.
 */
import { env, runDurableObjectAlarm, runInDurableObject } from "cloudflare:test";
import { afterEach, describe, expect, it } from "vitest";
import { type HolderKind, type HolderOperation, holderOutcome } from "../../src/core/holders.ts";
import { concatBytes, frontend, type Message, textMessage } from "../../src/core/pg-wire.ts";
import { tenantObject } from "../../src/placement/index.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  pollUntil,
  runtimeOf,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";
import { fieldsOf, RawWire, typesOf } from "./wire-client.ts";

afterEach(() => {
  tenantHooksForTests.config = undefined;
});

const q = (sql: string) => textMessage(frontend.query, sql);

function errorOf(messages: readonly Message[]): Record<string, string> {
  return fieldsOf(messages.find((message) => message.type === 0x45));
}

interface Minted {
  keyId: string;
  key: string;
  connectionString: string;
}

async function mint(tenant: CreatedTenant): Promise<Minted> {
  const response = await admin(`/v1/tenants/${tenant.id}/keys`, { method: "POST", json: {} });
  expect(response.status).toBe(201);
  return response.json<Minted>();
}

/** What became of a holder once the operation ran. */
type Observed = { ended: string } | { refused: string } | { kept: true } | { finished: number };

interface LiveHolder {
  /** Waits for the holder's fate (bounded), after the operation answered. */
  observe(expectEnd: boolean): Promise<Observed>;
  /** How many pool leases it holds while open. */
  leases: number;
}

async function wireHolder(tenant: CreatedTenant, key: Minted, mode: "transaction" | "session") {
  const wire = await RawWire.connect(tenant.id, key.key, { options: `-c lessor.pool_mode=${mode}` });
  const greeting = await wire.untilReady();
  expect(typesOf(greeting)).toContain("Z");
  // One transaction done: the connection is live, and idle now (transaction mode holds no lease).
  wire.send(q("SELECT 1"));
  expect(typesOf(await wire.untilReady())).toContain("D");
  const holder: LiveHolder = {
    leases: mode === "session" ? 1 : 0,
    async observe(expectEnd) {
      if (expectEnd) {
        const messages = await wire.untilClosed();
        return wire.closed ? { ended: errorOf(messages).D ?? "closed" } : { kept: true };
      }
      wire.send(q("SELECT 1"));
      const answer = await wire.untilReady();
      if (wire.closed) return { ended: errorOf(answer).D ?? "closed" };
      const error = errorOf(answer);
      // An ERROR on a connection that stays open: this transaction was refused, the holder is not ended.
      return error.D ? { refused: error.D } : { kept: true };
    },
  };
  return { holder, wire };
}

async function sessionLeaseHolder(tenant: CreatedTenant, key: Minted): Promise<LiveHolder> {
  const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { authorization: `Bearer ${key.key}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs: 60_000 }),
  });
  expect(response.status, await response.clone().text()).toBe(201);
  const { lease } = await response.json<{ lease: string }>();
  return {
    leases: 1,
    async observe(expectEnd) {
      if (expectEnd) {
        // Ended means the object let go of it (its connection returned), whatever the key says now.
        const status = await pollUntil(
          () => sessionsOf(tenant),
          (n) => n === 0,
          { attempts: 80 },
        );
        return status === 0 ? { ended: "session_ended" } : { kept: true };
      }
      const answer = await lessor(`/v1/leases/${lease}/sql`, {
        method: "POST",
        headers: { authorization: `Bearer ${key.key}`, "content-type": "application/json" },
        body: JSON.stringify({ query: "SELECT 1", params: [] }),
      });
      return answer.status === 200 ? { kept: true } : { ended: (await answer.json<{ code: string }>()).code };
    },
  };
}

async function sessionsOf(tenant: CreatedTenant): Promise<number> {
  const response = await admin(`/v1/tenants/${tenant.id}`);
  if (response.status !== 200) return 0;
  return (await response.json<{ runtime: { sessions: number } }>()).runtime.sessions;
}

function flightHolder(key: Minted): LiveHolder {
  const answer = sqlRequest(key.connectionString, { query: "SELECT pg_sleep(1)", params: [] });
  return {
    leases: 1,
    async observe() {
      return { finished: (await answer).status };
    },
  };
}

/** One opener per kind: a kind added to the table without one here does not compile. */
const holderOpeners: { [K in HolderKind]: (tenant: CreatedTenant, key: Minted) => Promise<LiveHolder> } = {
  session_lease: sessionLeaseHolder,
  wire_session: async (tenant, key) => (await wireHolder(tenant, key, "session")).holder,
  wire_transaction: async (tenant, key) => (await wireHolder(tenant, key, "transaction")).holder,
  // Last: it is in flight while the operation runs.
  flight: async (_tenant, key) => flightHolder(key),
};

const kinds = Object.keys(holderOpeners) as HolderKind[];

/** Runs an operation the way an operator (or the budget, or the clock) does. */
const operations: {
  [O in Exclude<HolderOperation, "move_drain" | "move_switch">]: (
    tenant: CreatedTenant,
    key: Minted,
  ) => Promise<void>;
} = {
  erase: async (tenant) => {
    const response = await admin(`/v1/tenants/${tenant.id}?confirm=${tenant.id}`, { method: "DELETE" });
    expect(response.status, await response.clone().text()).toBe(202);
  },
  disable: async (tenant) => {
    expect((await admin(`/v1/tenants/${tenant.id}/disable`, { method: "POST" })).status).toBe(200);
  },
  key_revoked: async (tenant, key) => {
    const response = await admin(`/v1/tenants/${tenant.id}/keys/${key.keyId}?force=true`, {
      method: "DELETE",
    });
    expect(response.status).toBe(204);
  },
  key_expired: async (tenant, key) => {
    // The key expires a moment from now; the object hears of it (any key change refreshes it) and
    // nothing else happens: whatever ends the holders is the object's own clock.
    await asSuperuser(async (client) => {
      await client.query(
        "UPDATE tenant_keys SET expires_at = now() + interval '1500 milliseconds' WHERE key_id = $1",
        [key.keyId],
      );
    }, "lessor");
    await mint(tenant);
    const stub = tenantObject(env, "default", tenant.id);
    // Once the expiry passed, the alarm has run (or is run now, if it has not fired yet).
    await pollUntil(
      () =>
        asSuperuser(
          async (c) =>
            (
              await c.query("SELECT now() > expires_at AS past FROM tenant_keys WHERE key_id = $1", [
                key.keyId,
              ])
            ).rows[0]?.past === true,
          "lessor",
        ),
      (past) => past,
    );
    await runDurableObjectAlarm(stub);
  },
  rotate: async (tenant) => {
    const response = await admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" });
    expect(response.status, await response.clone().text()).toBeLessThan(300);
  },
  // An operator drain that is not forced: no new lease, and every holder is waited for.
  drain: async (tenant) => {
    const response = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: {} });
    expect(response.status).toBe(202);
    expect((await runtimeOf(tenant.id)).state).toBe("draining");
  },
  drain_forced: async (tenant) => {
    const response = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: { force: true } });
    expect(response.status).toBe(202);
  },
  evict: async (tenant) => {
    const { generation } = await runtimeOf(tenant.id);
    const outcome = await tenantObject(env, "default", tenant.id).evictIfIdle(generation);
    expect(outcome.evicted).toBe(false);
  },
};

describe("every holder kind against every operation (issue 41)", () => {
  for (const operation of Object.keys(operations) as (keyof typeof operations)[]) {
    it(`${operation}: each kind of holder ends, waits or stays as src/core/holders.ts says`, async () => {
      const tenant = await createTenant(uniqueTenantId(`hold-${operation.replace("_", "")}`.slice(0, 20)), {
        tier: "standard",
      });
      const key = await mint(tenant);
      const live = new Map<HolderKind, LiveHolder>();
      for (const kind of kinds) live.set(kind, await holderOpeners[kind](tenant, key));
      const leases = [...live.values()].reduce((n, holder) => n + holder.leases, 0);
      // Every holder is live before the operation: the flight is running, the leases are held.
      expect(
        (
          await pollUntil(
            () => runtimeOf(tenant.id),
            (r) => r.leases >= leases,
          )
        ).leases,
      ).toBeGreaterThanOrEqual(leases);
      await operations[operation](tenant, key);
      const seen: Record<string, Observed> = {};
      const expected: Record<string, Observed> = {};
      for (const kind of kinds) {
        const policy = holderOutcome(operation, kind);
        const ends = policy.do === "end";
        seen[kind] = await (live.get(kind) as LiveHolder).observe(ends);
        if (kind === "flight") expected[kind] = { finished: 200 };
        // A drain takes no new lease: a transaction-mode connection stays open, and its next
        // transaction is refused (retryable) until the pool is back.
        else if (operation === "drain" && kind === "wire_transaction")
          expected[kind] = { refused: "tenant_draining" };
        else if (!ends) expected[kind] = { kept: true };
        else if (kind === "session_lease") expected[kind] = { ended: "session_ended" };
        else expected[kind] = { ended: policy.code };
      }
      expect(seen).toEqual(expected);
    });
  }
});

describe("access is re-checked at every lease of an open wire connection (issue 41)", () => {
  it("a key the object no longer holds is refused at the connection's next transaction, with FATAL 28000 key_revoked", async () => {
    const tenant = await createTenant(uniqueTenantId("hold-relea"));
    const key = await mint(tenant);
    const { wire } = await wireHolder(tenant, key, "transaction");
    // The object's record loses the key without being told (no configure, so nothing ends the
    // connection now): only the check at the next lease can refuse it.
    await runInDurableObject(tenantObject(env, "default", tenant.id), (instance) => {
      type Runtime = { record: { keys: { keyId: string }[] } | null };
      const rt = (instance as unknown as { rooms: { rt: Runtime } }).rooms.rt;
      if (rt.record) rt.record = { ...rt.record, keys: rt.record.keys.filter((k) => k.keyId !== key.keyId) };
    });
    wire.send(concatBytes([q("SELECT 1")]));
    const answer = await wire.untilClosed();
    expect(errorOf(answer)).toMatchObject({ S: "FATAL", C: "28000", D: "key_revoked" });
  });
});
