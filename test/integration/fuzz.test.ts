/**
 * The whole HTTP surface under property-based fuzzing (fast-check), plus a canary: whatever
 * arrives, Lessor answers with no 5xx, settles, leaks no secret into an answer or a log line, and
 * creates no object for a tenant id nobody provisioned.
 */
import { env, listDurableObjectIds, runDurableObjectAlarm } from "cloudflare:test";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loginGuardKey } from "../../src/crypto/login-guard.ts";
import { seal } from "../../src/crypto/seal.ts";
import { setLogSink } from "../../src/log/index.ts";
import { guardKeyId } from "../../src/tenant-db/connect.ts";
import { installLoginGuard } from "../../src/tenant-db/login-guard.ts";
import { tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  adminKey,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  eventsOf,
  lessor,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

/** Every log line written while this file runs (the object shares this isolate's logger). */
const logLines: string[] = [];
let restoreLogs: () => void = () => undefined;
let tenant: CreatedTenant;

beforeAll(async () => {
  restoreLogs = setLogSink((_level, line) => {
    logLines.push(line);
  });
  tenant = await createTenant(uniqueTenantId("fuzzed"));
});

afterAll(() => restoreLogs());

/** Secrets no answer and no log line may ever contain. */
function secrets(): string[] {
  return [adminKey, env.LESSOR_SEAL_KEY, env.LESSOR_KEY_MAC_KEYS, tenant.key, tenant.key.slice(4)];
}

const routes = [
  "/sql",
  "/v1/tenants",
  "/v1/tenants/{id}",
  "/v1/tenants/{id}/events",
  "/v1/tenants/{id}/usage",
  "/v1/tenants/{id}/leases",
  "/v1/tenants/{id}/keys",
  "/v1/tenants/{id}/keys/k_0123456789abcdef",
  "/v1/tenants/{id}/drain",
  "/v1/tenants/{id}/pin",
  "/v1/leases/lsl_{id}_000000000000000000000000000000000000000000000000/sql",
  "/v1/leases/{id}",
  "/v1/capacity",
  "/v1/campaigns",
  "/v1/campaigns/cmp_0123456789abcdef",
  "/v1/maintenance",
  "/v1/usage",
  "/",
  "/nowhere",
];

/** Tenant ids: the real one, forged well-formed ones, and junk. */
const tenantIds = fc.oneof(
  fc.constant("{real}"),
  fc.stringMatching(/^[a-z0-9][a-z0-9-]{0,20}[a-z0-9]$/),
  fc.string({ maxLength: 50 }),
  fc.constantFrom(
    "..",
    "%00",
    "Acme",
    "a".repeat(41),
    "postgres",
    "lessor",
    "tenant_x",
    "t_0000000000000000",
  ),
);

const keys = fc.oneof(
  fc.constant("{realkey}"),
  fc.constant("{adminkey}"),
  fc.stringMatching(/^lsk_[A-Za-z0-9_-]{64}$/),
  fc.string({ maxLength: 80 }),
  fc.constant(""),
);

const bodies = fc.oneof(
  fc.json({ maxDepth: 3 }),
  fc
    .record({
      query: fc.oneof(
        fc.constantFrom("SELECT 1", "SELECT $1", "SELECT 1; SELECT 2", ""),
        fc.string({ maxLength: 40 }),
      ),
      params: fc.oneof(
        fc.array(fc.jsonValue({ maxDepth: 2 }), { maxLength: 4 }),
        fc.string(),
        fc.constant(null),
      ),
    })
    .map((body) => JSON.stringify(body)),
  fc
    .record({
      queries: fc.array(fc.record({ query: fc.constantFrom("SELECT 1", "BEGIN", "x") }), { maxLength: 3 }),
    })
    .map((body) => JSON.stringify(body)),
  fc.string({ maxLength: 200 }),
  fc.constant(""),
);

const headerValues = fc.oneof(
  fc.string({ maxLength: 60 }),
  fc.constantFrom("true", "false", "1", "", "Serializable"),
);

const requests = fc.record({
  method: fc.constantFrom("GET", "POST", "DELETE", "PUT", "PATCH", "OPTIONS"),
  route: fc.constantFrom(...routes),
  id: tenantIds,
  key: keys,
  auth: fc.constantFrom("bearer", "basic", "none", "connection-string", "both"),
  body: bodies,
  extra: fc.dictionary(
    fc.constantFrom(
      "Neon-Raw-Text-Output",
      "Neon-Array-Mode",
      "Neon-Batch-Isolation-Level",
      "Neon-Batch-Read-Only",
      "Neon-Batch-Deferrable",
      "Lessor-Schema-Version",
      "Content-Type",
    ),
    headerValues,
    { maxKeys: 3 },
  ),
  query: fc.constantFrom("", "?limit=0", "?limit=5", "?cursor=zz", "?force=true", "?limit=1e3&cursor=%00"),
});

type FuzzRequest = typeof requests extends fc.Arbitrary<infer R> ? R : never;

function materialise(request: FuzzRequest): { path: string; init: RequestInit; forgedId: string | null } {
  const id = request.id === "{real}" ? tenant.id : request.id;
  const key =
    request.key === "{realkey}" ? tenant.key : request.key === "{adminkey}" ? adminKey : request.key;
  const path = request.route.replaceAll("{id}", encodeURIComponent(id)) + request.query;
  const headers = new Headers();
  for (const [name, value] of Object.entries(request.extra)) {
    try {
      headers.set(name, value);
    } catch {
      // A value a header cannot carry: leave it out, as a client would have to.
    }
  }
  if (request.auth === "bearer" || request.auth === "both") headers.set("Authorization", `Bearer ${key}`);
  if (request.auth === "basic") headers.set("Authorization", `Basic ${btoa(`${id}:x`)}`);
  if (request.auth === "connection-string" || request.auth === "both") {
    headers.set(
      "Neon-Connection-String",
      `postgres://${encodeURIComponent(id)}:${encodeURIComponent(key)}@lessor.test/${encodeURIComponent(id)}`,
    );
  }
  const init: RequestInit = { method: request.method, headers };
  if (request.method !== "GET" && request.method !== "OPTIONS") init.body = request.body;
  // Only a real tenant's key is not a forgery; an id that was never provisioned must get no object.
  const forgedId = id !== tenant.id ? id : null;
  return { path, init, forgedId };
}

/**
 * A hang detector, not a measurement: how long an answer may take before the test calls it hung.
 * It asserts no time; a request that never settles fails by name instead of running into the
 * test's timeout.
 */
const hungAfterMs = 20_000;

/** Settles as `work` does, or throws "hung: <what>" once the detector's bound has passed. */
async function settled<T>(what: string, work: Promise<T>): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`hung: ${what}`)), hungAfterMs);
  });
  try {
    return await Promise.race([work, late]);
  } finally {
    clearTimeout(timer);
  }
}

describe("fuzzing the HTTP surface", () => {
  it("no 5xx, every answer settles, no secret anywhere, no object for a forged id", async () => {
    const forgedIds = new Set<string>();
    const problems: string[] = [];
    await fc.assert(
      fc.asyncProperty(requests, async (request) => {
        const { path, init, forgedId } = materialise(request);
        // Every answer settles (a hang detector, not a speed check).
        const response = await settled(`${init.method} ${path}`, lessor(path, init));
        const text = await response.text();
        if (forgedId) forgedIds.add(forgedId);
        if (response.status >= 500)
          problems.push(`${init.method} ${path}: ${response.status} ${text.slice(0, 200)}`);
        for (const secret of secrets()) {
          if (secret.length > 8 && text.includes(secret))
            problems.push(`${init.method} ${path} leaked a secret`);
        }
        return problems.length === 0;
      }),
      { numRuns: 400, seed: 20261130, endOnFailure: true },
    );
    expect(problems).toEqual([]);
    const objects = new Set((await listDurableObjectIds(env.TENANTS)).map((id) => id.toString()));
    for (const id of forgedIds) {
      if (id !== tenant.id) expect(objects.has(env.TENANTS.idFromName(id).toString()), id).toBe(false);
    }
    for (const line of logLines) for (const secret of secrets()) expect(line.includes(secret)).toBe(false);
  });
});

describe("a canary password never surfaces", () => {
  it("appears in no answer, no lifecycle event and no log line, whatever fails", async () => {
    const canary = `CANARY${crypto.randomUUID().replaceAll("-", "")}`;
    const bird = await createTenant(uniqueTenantId("canary"), { tier: "free" });
    // The role's password becomes the canary, sealed as Lessor keeps it, with its login-guard key.
    await asSuperuser((client) => client.query(`ALTER ROLE "${bird.role}" PASSWORD '${canary}'`));
    const sealed = await seal(env.LESSOR_SEAL_KEY, bird.id, canary);
    await asSuperuser(
      (client) =>
        client.query("UPDATE tenant_credentials SET sealed_password = $1 WHERE tenant_id = $2", [
          sealed,
          bird.id,
        ]),
      "lessor",
    );
    const guardKey = await loginGuardKey(canary);
    await asSuperuser(
      async (client) => installLoginGuard(client, await guardKeyId(guardKey), guardKey, "direct"),
      bird.database,
    );
    expect((await admin(`/v1/tenants/${bird.id}/drain`, { method: "POST", json: {} })).status).toBe(202);

    const answers: string[] = [];
    const ask = async (query: string, connectionString = bird.connectionString) => {
      const response = await sqlRequest(connectionString, { query });
      answers.push(`${response.status} ${await response.text()}`);
      return response.status;
    };
    // The pool starts with Postgres's own limits and the statement bound past the test (test-only
    // setting, read at each use), so the sleep below runs until the test kills it, on any machine.
    let boundLifted = true;
    tenantHooksForTests.config = (id) =>
      id === bird.id && boundLifted ? { statementTimeoutMs: 600_000 } : undefined;
    try {
      expect(await ask("SELECT 1")).toBe(200); // started with the canary password
      // A killed backend mid-query: the pool's one connection runs the sleep until it is killed.
      const killed = ask("SELECT pg_sleep(30)");
      const terminated = await pollUntil(
        () =>
          asSuperuser(async (client) => {
            const { rows } = await client.query(
              "SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE usename = $1 AND state = 'active' AND query LIKE '%pg_sleep(30)%'",
              [bird.role],
            );
            return rows.filter((row: { ok: boolean }) => row.ok).length;
          }),
        (n) => n > 0,
        { attempts: 200, intervalMs: 50 },
      );
      expect(terminated).toBeGreaterThan(0);
      await killed;
    } finally {
      boundLifted = false;
      tenantHooksForTests.config = undefined;
    }
    await ask("SELECT * FROM no_such_table"); // a Postgres error
    await ask("SELECT pg_sleep(60)"); // a timeout
    await ask("SELECT repeat(repeat('x', 1000000), 30)"); // an oversized answer
    await ask("SELECT 1", bird.connectionString.replace(bird.key, `lsk_${"B".repeat(64)}`)); // a bad key
    // A failed start: the role may not log in.
    expect(
      (await admin(`/v1/tenants/${bird.id}/drain`, { method: "POST", json: { force: true } })).status,
    ).toBe(202);
    await asSuperuser((client) => client.query(`ALTER ROLE "${bird.role}" NOLOGIN`));
    try {
      expect(await ask("SELECT 1")).toBe(503);
      const status = await admin(`/v1/tenants/${bird.id}`);
      answers.push(await status.text());
    } finally {
      await asSuperuser((client) => client.query(`ALTER ROLE "${bird.role}" LOGIN`));
    }
    await runDurableObjectAlarm(env.TENANTS.getByName(bird.id));
    const events = JSON.stringify(await eventsOf(bird.id));

    expect(answers.length).toBeGreaterThan(7);
    for (const text of [...answers, events, ...logLines]) expect(text.includes(canary)).toBe(false);
    // The checks can fail: the canary really is the password Lessor used, and the object's own log
    // lines (the timeout, the failed start) were captured with the rest.
    expect(answers[0]).toMatch(/^200 /);
    expect(logLines.some((line) => line.includes('"event":"statement_timeout"'))).toBe(true);
    expect(logLines.some((line) => line.includes('"event":"pool_start_failed"'))).toBe(true);
  });
});
