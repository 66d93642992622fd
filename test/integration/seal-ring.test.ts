/**
 * Seal-key rotation (issue 14, docs/adr/015-seal-key-ring.md): tenants sealed under k1 (and one
 * under the old single key, a v1 value), the ring switched to k2, `lessorctl reseal` (what
 * `npm run reseal` runs) interrupted half way and run again, k1 removed: every tenant still
 * starts. A value whose key left the ring answers `misconfigured` and the log names the key id.
 *
 * The ring is switched by changing `LESSOR_SEAL_KEY` on this isolate's env object, which the
 * Worker and the tenant objects of this test file share (each test file has its own workerd), the
 * way a deploy of a new secret changes it. The catalog is shared with other test files, so every
 * reseal here is scoped to this file's tenant-id prefix; nothing here runs the fleet-wide cron job
 * under a changed ring.
 */
import { env, runInDurableObject } from "cloudflare:test";
import { exports } from "cloudflare:workers";
import { afterEach, describe, expect, it } from "vitest";
import { runCli } from "../../cli/program.ts";
import { loadConfig } from "../../src/config/index.ts";
import { withControlPlane } from "../../src/control-plane/index.ts";
import { resealJob, resealTick } from "../../src/cron/jobs/reseal.ts";
import { toBase64 } from "../../src/crypto/encoding.ts";
import { unseal } from "../../src/crypto/seal.ts";
import { setLogSink } from "../../src/log/index.ts";
import { readResealPage, resealRows, writeResealed } from "../../src/reseal/index.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  pollUntil,
  runtimeOf,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

const suiteKey = env.LESSOR_SEAL_KEY;
const k1 = toBase64(crypto.getRandomValues(new Uint8Array(32)));
const k2 = toBase64(crypto.getRandomValues(new Uint8Array(32)));
const ring = (current: string, keys: Record<string, string>) => JSON.stringify({ current, keys });

/** Changes the seal key ring of this isolate's Worker and tenant objects. */
function useSealKey(value: string): void {
  (env as unknown as Record<string, string>).LESSOR_SEAL_KEY = value;
}

afterEach(() => useSealKey(suiteKey));

interface CatalogCredential {
  sealed: string;
  sealedAt: string;
}

async function credentialOf(id: string): Promise<CatalogCredential> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT sealed_password, sealed_at::text AS sealed_at FROM tenant_credentials WHERE tenant_id = $1",
      [id],
    );
    const row = rows[0] as { sealed_password: string; sealed_at: string } | undefined;
    if (!row) throw new Error(`no credential for ${id}`);
    return { sealed: row.sealed_password, sealedAt: row.sealed_at };
  }, "lessor");
}

interface Progress {
  currentKeyId: string;
  resealed: number;
  skipped: number;
  failed: { tenantId: string; keyId: string | null; problem: string }[];
  remaining: number;
  cursor: string | null;
  done: boolean;
}

async function resealBatch(body: Record<string, unknown>): Promise<Progress> {
  const response = await admin("/v1/credentials/reseal", { method: "POST", json: body });
  expect(response.status, await response.clone().text()).toBe(200);
  return response.json<Progress>();
}

/** `lessorctl reseal` (what `npm run reseal` runs), against this Worker; `failAfter` cuts it off. */
async function lessorctlReseal(
  args: string[],
  failAfter = Number.POSITIVE_INFINITY,
): Promise<{ code: number; stdout: string[]; stderr: string[]; calls: number }> {
  const stdout: string[] = [];
  const stderr: string[] = [];
  let calls = 0;
  const code = await runCli(["reseal", ...args], {
    out: {
      line: (text) => stdout.push(text),
      error: (text) => stderr.push(text),
      isTTY: false,
      redraw: (text) => stdout.push(text),
    },
    fetch: (async (input: RequestInfo | URL, init?: RequestInit) => {
      if (++calls > failAfter) throw new Error("killed");
      return exports.default.fetch(new Request(input, init));
    }) as typeof fetch,
    env: { LESSOR_URL: "http://lessor.test", LESSOR_ADMIN_KEY: env.LESSOR_ADMIN_KEY },
    cwd: "/nonexistent",
    sleep: async () => undefined,
  });
  return { code, stdout, stderr, calls };
}

async function selectOne(tenant: CreatedTenant): Promise<Response> {
  return sqlRequest(tenant.connectionString, { query: "SELECT 1 AS one", params: [] });
}

/** Resets the tenant's object with its pool live, as a deploy does: the next request starts afresh. */
async function resetObject(tenant: CreatedTenant): Promise<void> {
  const outcome = await runInDurableObject(env.TENANTS.getByName(tenant.id), (_instance, state) => {
    state.abort("test: object reset");
  }).then(
    () => "not reset",
    (error: unknown) => String(error),
  );
  expect(outcome).toMatch(/object reset/);
}

describe("seal key ring", () => {
  it("reseal, remove old key, every tenant still starts (the reseal cut off half way and run again)", async () => {
    const prefix = uniqueTenantId("sealring");
    // One tenant from before the ring: a v1 value under the single key (k0 in a ring).
    const legacy = await createTenant(`${prefix}-0`, { tier: "free" });
    expect((await credentialOf(legacy.id)).sealed).toMatch(/^v1\./);

    useSealKey(ring("k1", { k0: suiteKey, k1 }));
    const tenants = [legacy];
    for (const n of [1, 2, 3, 4]) tenants.push(await createTenant(`${prefix}-${n}`, { tier: "free" }));
    for (const tenant of tenants.slice(1))
      expect((await credentialOf(tenant.id)).sealed).toMatch(/^v2\.k1\./);
    for (const tenant of tenants) expect((await selectOne(tenant)).status).toBe(200);
    const before = new Map(
      await Promise.all(tenants.map(async (t) => [t.id, await credentialOf(t.id)] as const)),
    );

    // k2 becomes current; k0 and k1 stay until every value is under k2.
    useSealKey(ring("k2", { k0: suiteKey, k1, k2 }));
    const newcomer = await createTenant(`${prefix}-5`, { tier: "free" });
    expect((await credentialOf(newcomer.id)).sealed).toMatch(/^v2\.k2\./);
    tenants.push(newcomer);

    // The first run is killed after its first batch of two.
    const cut = await lessorctlReseal(["--batch", "2", "--prefix", prefix], 1);
    expect(cut.code).toBe(1);
    expect(cut.stdout[0]).toMatch(/^reseal batch=1 resealed=2 skipped=0 failed=0 remaining=3 /);
    const firstTwo = tenants.slice(0, 2).map((t) => t.id);
    const resealedFirst = new Map<string, string>();
    for (const id of firstTwo) {
      const now = await credentialOf(id);
      expect(now.sealed).toMatch(/^v2\.k2\./);
      resealedFirst.set(id, now.sealed);
    }

    // Run again from the start: it picks up what is left and leaves the first two alone.
    const rerun = await lessorctlReseal(["--batch", "2", "--prefix", prefix]);
    expect(rerun.stderr).toEqual([]);
    expect(rerun.code).toBe(0);
    expect(rerun.stdout.at(-1)).toMatch(
      /^reseal_done resealed=3 skipped=0 failed=0 remaining=0 current_key=k2$/,
    );
    for (const id of firstTwo) expect((await credentialOf(id)).sealed).toBe(resealedFirst.get(id));

    for (const tenant of tenants) {
      const now = await credentialOf(tenant.id);
      expect(now.sealed).toMatch(/^v2\.k2\./);
      // A reseal is not a rotation: the credential's age (the rotation policy's clock) is unchanged.
      if (tenant.id !== newcomer.id) expect(now.sealedAt).toBe(before.get(tenant.id)?.sealedAt);
    }
    // Idempotent: one more pass finds nothing.
    expect(await resealBatch({ prefix })).toMatchObject({
      currentKeyId: "k2",
      resealed: 0,
      failed: [],
      remaining: 0,
      cursor: null,
      done: true,
    });

    // k0 and k1 leave the ring; every object restarts (as on a deploy) and must open its credential.
    useSealKey(ring("k2", { k2 }));
    for (const tenant of tenants) {
      const generation = (await runtimeOf(tenant.id)).generation;
      await resetObject(tenant);
      const answer = await selectOne(tenant);
      expect(answer.status, await answer.clone().text()).toBe(200);
      expect((await runtimeOf(tenant.id)).generation).toBeGreaterThan(generation);
    }
  });

  it("a value sealed under a key that left the ring answers misconfigured, and the log names the key id", async () => {
    const lines: string[] = [];
    const restoreLogs = setLogSink((_level, line) => lines.push(line));
    try {
      const prefix = uniqueTenantId("sealgone");
      useSealKey(ring("k1", { k1 }));
      const tenant = await createTenant(`${prefix}-a`, { tier: "free" });
      expect((await selectOne(tenant)).status).toBe(200);

      useSealKey(ring("k2", { k2 }));
      await resetObject(tenant);
      for (let attempt = 0; attempt < 2; attempt++) {
        // The first start fails; the next request meets the backoff: both say misconfigured.
        const answer = await selectOne(tenant);
        expect(answer.status).toBe(500);
        expect(await answer.json()).toEqual({
          code: "misconfigured",
          message: "Lessor is misconfigured; the operator has been told in the logs.",
        });
      }
      const status = await admin(`/v1/tenants/${tenant.id}`);
      expect(await status.json()).toMatchObject({
        runtime: { state: "failed", failureReason: "misconfigured" },
      });
      expect(
        lines.some((line) => line.includes("sealed with key k1, which LESSOR_SEAL_KEY no longer holds")),
      ).toBe(true);

      // The reseal cannot move it either: it reports the tenant and the missing key, and goes on.
      const progress = await resealBatch({ prefix });
      expect(progress).toMatchObject({
        resealed: 0,
        failed: [{ tenantId: tenant.id, keyId: "k1", problem: "key_missing" }],
        remaining: 1,
        done: true,
      });
      const cli = await lessorctlReseal(["--prefix", prefix]);
      expect(cli.code).toBe(1);
      expect(cli.stderr.join("\n")).toContain(`tenant=${tenant.id} key=k1 problem=key_missing`);

      // k1 back in the ring: the tenant starts again (after its backoff), and the reseal moves it.
      useSealKey(ring("k2", { k1, k2 }));
      const healed = await pollUntil(
        () => selectOne(tenant).then((r) => r.status),
        (code) => code === 200,
        { attempts: 60, intervalMs: 500 },
      );
      expect(healed).toBe(200);
      expect(await resealBatch({ prefix })).toMatchObject({ resealed: 1, failed: [], remaining: 0 });

      // No line anywhere holds key material.
      const plain = await unseal(ring("k2", { k2 }), tenant.id, (await credentialOf(tenant.id)).sealed);
      for (const secret of [k1, k2, suiteKey, plain]) {
        expect(lines.filter((line) => line.includes(secret))).toEqual([]);
      }
    } finally {
      restoreLogs();
    }
  });

  it("a credential rotated between the reseal's read and its write is left as the rotation sealed it", async () => {
    const prefix = uniqueTenantId("sealrace");
    useSealKey(ring("k1", { k1 }));
    const tenant = await createTenant(`${prefix}-a`, { tier: "free" });
    expect((await selectOne(tenant)).status).toBe(200);
    useSealKey(ring("k2", { k1, k2 }));
    const config = loadConfig(env);

    const page = await withControlPlane(config, env, "default", (db) =>
      readResealPage(db, env.LESSOR_SEAL_KEY, { prefix, after: null, limit: 10 }),
    );
    expect(page.rows.map((row) => row.tenantId)).toEqual([tenant.id]);
    const computed = await resealRows(env.LESSOR_SEAL_KEY, page.rows);

    // A rotation lands in between: new password, sealed under the current key.
    const rotated = await admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" });
    expect(rotated.status).toBe(202);
    const afterRotation = (await credentialOf(tenant.id)).sealed;
    expect(afterRotation).toMatch(/^v2\.k2\./);

    const written = await withControlPlane(config, env, "default", (db) =>
      writeResealed(db, computed.resealed),
    );
    expect(written).toEqual({ resealed: 0, skipped: 1 });
    expect((await credentialOf(tenant.id)).sealed).toBe(afterRotation);
    await resetObject(tenant);
    expect((await selectOne(tenant)).status).toBe(200);
  });

  it("the reseal route refuses bad input with a stable code, and needs the admin key", async () => {
    for (const [body, message] of [
      [{ limit: 0 }, "limit must be an integer from 1 to 500."],
      [{ limit: 501 }, "limit must be an integer from 1 to 500."],
      [{ limit: "10" }, "limit must be an integer from 1 to 500."],
      [{ after: "Not An Id" }, "after must be a cursor this endpoint returned (or null)."],
      [{ after: 7 }, "after must be a cursor this endpoint returned (or null)."],
      [{ prefix: "ACME" }, "prefix must be up to 40 lowercase letters, digits or hyphens."],
      [[], "The body must be a JSON object."],
    ] as const) {
      const response = await admin("/v1/credentials/reseal", { method: "POST", json: body });
      expect(response.status).toBe(400);
      expect(await response.json()).toEqual({ code: "invalid_request", message });
    }
    const malformed = await admin("/v1/credentials/reseal", { method: "POST", body: "{" });
    expect(await malformed.json()).toMatchObject({ code: "invalid_json" });
    const anonymous = await exports.default.fetch(
      new Request("http://lessor.test/v1/credentials/reseal", { method: "POST", body: "{}" }),
    );
    expect(anonymous.status).toBe(401);
    const wrong = await exports.default.fetch(
      new Request("http://lessor.test/v1/credentials/reseal", {
        method: "POST",
        body: "{}",
        headers: { Authorization: "Bearer lsk_not-the-admin-key" },
      }),
    );
    expect(wrong.status).toBe(401);

    // A malformed ring: misconfigured, and the answer holds nothing of it.
    useSealKey(`{"current":"k1","keys":{"k1":"${k1}"`);
    const broken = await admin("/v1/credentials/reseal", { method: "POST", json: { prefix: "none-such" } });
    expect(broken.status).toBe(500);
    const text = await broken.text();
    expect(JSON.parse(text)).toEqual({
      code: "misconfigured",
      message: "Lessor is misconfigured; the operator has been told in the logs.",
    });
    expect(text).not.toContain(k1);
  });

  it("the cron step reseals a bounded batch per tick and is idle when the ring holds one key", async () => {
    const prefix = uniqueTenantId("sealcron");
    useSealKey(ring("k1", { k1 }));
    const tenants: CreatedTenant[] = [];
    for (const n of [1, 2, 3]) tenants.push(await createTenant(`${prefix}-${n}`, { tier: "free" }));
    useSealKey(ring("k2", { k1, k2 }));

    const first = await resealTick(env, loadConfig(env), { prefix, batch: 2, region: "default" });
    expect(first).toMatchObject({ resealed: 2, failed: 0, remaining: 1 });
    const second = await resealTick(env, loadConfig(env), { prefix, batch: 2, region: "default" });
    expect(second).toMatchObject({ resealed: 1, failed: 0, remaining: 0 });
    const third = await resealTick(env, loadConfig(env), { prefix, batch: 2, region: "default" });
    expect(third).toMatchObject({ resealed: 0, remaining: 0 });
    for (const tenant of tenants) expect((await credentialOf(tenant.id)).sealed).toMatch(/^v2\.k2\./);

    // One key (the single-key form, or a ring of one): nothing can be moved, and nothing is read.
    useSealKey(suiteKey);
    const idle = await resealJob.run(env, {
      cron: "* * * * *",
      scheduledTime: Date.now(),
      region: "default",
    });
    expect(idle.summary).toMatch(/one key/);
  });
});
