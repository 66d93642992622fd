/**
 * The tenant object's one gate (issue 41, src/core/tenant-gate.ts, docs/invariants.md invariant 22):
 * every RPC names its purpose and passes the gate before anything else runs. The object is made a
 * pointer (a move committed) or an erase's gate is closed directly in its memory, so the test reads
 * what each RPC answers in that state, RPC by RPC: one that skipped the gate would answer otherwise.
 */
import { env, runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { driverOutputMode } from "../../src/core/result-shape.ts";
import type { WireError } from "../../src/errors/index.ts";
import { tenantObject } from "../../src/placement/index.ts";
import type { KeyProof } from "../../src/rpc/tenant.ts";
import { createTenant, uniqueTenantId } from "./harness.ts";

/** Any proof: the gate answers before the key is looked at (the edge checked the key's MAC). */
const proof: KeyProof = { keyId: "k_0000000000000000", keyHash: "0".repeat(64), region: "default" };
const statement = { query: "SELECT 1", params: [] };

type Gates = { move: unknown; erase: unknown };

async function setGates(id: string, gates: Partial<Gates>): Promise<void> {
  await runInDurableObject(tenantObject(env, "default", id), (instance) => {
    const object = instance as unknown as { rooms?: { rt: Gates }; rt?: Gates };
    const rt = object.rooms?.rt ?? object.rt;
    if (rt) Object.assign(rt, gates);
  });
}

/** Every RPC of the object that serves a caller of the tenant, and the refusal it answered. */
async function answersOf(id: string): Promise<Record<string, string | undefined>> {
  const stub = tenantObject(env, "default", id);
  const code = (answer: { ok: boolean; error?: WireError }) => (answer.ok ? "ok" : answer.error?.code);
  const request = { kind: "single" as const, statement, output: driverOutputMode };
  return {
    verifyKey: code(await stub.verifyKey(id, proof)),
    sql: code(await stub.sql(id, proof, request)),
    openSession: code(await stub.openSession(id, proof, 10_000)),
    sessionSql: code(await stub.sessionSql(id, proof, `lsr_lease_${id}_00`, statement)),
    closeSession: code(await stub.closeSession(id, proof, `lsr_lease_${id}_00`)),
    rotateCredentials: code(await stub.rotateCredentials(id)),
    supplyCredential: code(await stub.supplyCredential(id, null, "a-new-password-long-enough", "admin")),
    requestErase: code(await stub.requestErase(id, "admin", false)),
    requestMove: code(await stub.requestMove(id, "elsewhere", "admin", false)),
  };
}

describe("every RPC passes the one gate (issue 41)", () => {
  it("a tenant that moved away: every RPC answers 409 tenant_moved (none tenant_moving), and a migration is skipped", async () => {
    const tenant = await createTenant(uniqueTenantId("gate-moved"));
    await setGates(tenant.id, {
      move: {
        tenantId: tenant.id,
        jobId: 1,
        to: "elsewhere",
        state: "moved",
        startedAt: Date.now(),
        committed: true,
      },
    });
    const answers = await answersOf(tenant.id);
    expect(answers).toEqual(Object.fromEntries(Object.keys(answers).map((rpc) => [rpc, "tenant_moved"])));
    const stub = tenantObject(env, "default", tenant.id);
    expect(await stub.migrate(tenant.id, 1, 1_000)).toEqual({ outcome: "skipped", reason: "tenant_unknown" });
    await setGates(tenant.id, { move: null });
  });

  it("a tenant being moved: new work answers 503 tenant_moving, a lease's statement goes on to the key check", async () => {
    const tenant = await createTenant(uniqueTenantId("gate-moving"));
    await setGates(tenant.id, {
      move: { tenantId: tenant.id, jobId: 1, to: "elsewhere", state: "moving", startedAt: Date.now() },
    });
    const answers = await answersOf(tenant.id);
    expect(answers).toMatchObject({
      verifyKey: "tenant_moving",
      sql: "tenant_moving",
      openSession: "tenant_moving",
      rotateCredentials: "tenant_moving",
      supplyCredential: "tenant_moving",
      requestErase: "tenant_moving",
    });
    // Past the gate: the key check refuses the made-up key.
    expect(answers.sessionSql).toBe("invalid_credentials");
    await setGates(tenant.id, { move: null });
  });

  it("a tenant being erased: no credential changes, the customer's supplied credential included, and no migration", async () => {
    const tenant = await createTenant(uniqueTenantId("gate-erasing"));
    await setGates(tenant.id, {
      erase: {
        tenantId: tenant.id,
        ordinal: 1,
        state: "erasing",
        keyIds: [],
        startedAt: Date.now(),
        erasedAt: null,
      },
    });
    const stub = tenantObject(env, "default", tenant.id);
    expect((await stub.rotateCredentials(tenant.id)).ok).toBe(false);
    expect(await stub.rotateCredentials(tenant.id)).toMatchObject({ error: { code: "tenant_erasing" } });
    expect(await stub.supplyCredential(tenant.id, null, "a-new-password-long-enough", "admin")).toMatchObject(
      {
        error: { code: "tenant_erasing" },
      },
    );
    // A campaign skips it (its rows go with the erase), and says why.
    expect(await stub.migrate(tenant.id, 1, 1_000)).toEqual({ outcome: "skipped", reason: "tenant_erasing" });
    await setGates(tenant.id, { erase: null });
  });
});
