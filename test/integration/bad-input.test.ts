/**
 * Bad input gets a clear 4xx with a JSON {code, message}, never touches a Durable Object when the
 * tenant id is malformed, and no answer ever carries a credential, a connection string with a
 * password, or a stack trace.
 */

import { createExecutionContext, listDurableObjectIds, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { app } from "../../src/app.ts";
import { unseal } from "../../src/crypto/seal.ts";
import {
  admin,
  asSuperuser,
  base,
  type CreatedTenant,
  createTenant,
  lessor,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";

let tenantA: CreatedTenant;
let tenantB: CreatedTenant;
/** Everything secret about the tenants: keys, database passwords, sealed passwords, key hashes. */
const secrets: string[] = [];
/** Every answer this file received (except the create answers, which hand out the key once). */
const seen: { what: string; status: number; headers: string; body: string }[] = [];

beforeAll(async () => {
  [tenantA, tenantB] = await Promise.all([
    createTenant(uniqueTenantId("bad-a"), { tier: "free" }),
    createTenant(uniqueTenantId("bad-b"), { tier: "free" }),
  ]);
  for (const tenant of [tenantA, tenantB]) {
    const row = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        `SELECT t.key_hash, c.sealed_password FROM tenants t JOIN tenant_credentials c ON c.tenant_id = t.id
         WHERE t.id = $1`,
        [tenant.id],
      );
      return rows[0] as { key_hash: string | null; sealed_password: string };
    }, "lessor");
    const password = await unseal(env.LESSOR_SEAL_KEY, tenant.id, row.sealed_password);
    secrets.push(tenant.key, tenant.key.slice(4), password, row.sealed_password);
    // The first-format hash is no longer written (tenant keys live in tenant_keys): a null here
    // would make every answer that contains "null" look like a leak.
    if (row.key_hash !== null) secrets.push(row.key_hash);
  }
  // Both tenants have a warm pool, so every path that could leak a live credential exists.
  for (const tenant of [tenantA, tenantB]) {
    const response = await sqlRequest(tenant.connectionString, { query: "SELECT 1" });
    expect(response.status).toBe(200);
  }
});

async function record(what: string, response: Response): Promise<string> {
  const body = await response.text();
  seen.push({ what, status: response.status, headers: JSON.stringify([...response.headers]), body });
  return body;
}

interface ErrorAnswer {
  status: number;
  body: string;
  code: string;
  message: string;
}

/** Asserts a JSON error answer with exactly {code, message} and returns it. */
async function errorAnswer(what: string, response: Response): Promise<ErrorAnswer> {
  const body = await record(what, response);
  expect(response.headers.get("content-type"), what).toMatch(/^application\/json/);
  const parsed = JSON.parse(body) as Record<string, unknown>;
  expect(Object.keys(parsed).sort(), what).toEqual(["code", "message"]);
  expect(parsed.code, what).toMatch(/^[a-z]+(_[a-z]+)*$/);
  expect(typeof parsed.message === "string" && parsed.message.length > 0, what).toBe(true);
  return { status: response.status, body, code: String(parsed.code), message: String(parsed.message) };
}

async function expectError(what: string, response: Response, status: number, code: string): Promise<void> {
  const answer = await errorAnswer(what, response);
  expect({ what, status: answer.status, code: answer.code }).toEqual({ what, status, code });
}

function connectionString(user: string, key: string, database = user): string {
  return `postgres://${user}:${key}@lessor.test/${database}`;
}

const wrongKey = "lsk_0000000000000000000000000000000000000000000";

/** Ids that must be refused before anything is derived from them, encoded for a URL. */
const malformedIds = [
  "Acme",
  "ACME",
  "-acme",
  "acme-",
  "acme_corp",
  "a".repeat(41),
  "..",
  "../acme",
  "acme/..",
  "acmé",
  "ac me",
  "acme%00",
  "tenant.acme",
];

async function objectIds(): Promise<Set<string>> {
  return new Set((await listDurableObjectIds(env.TENANTS)).map((id) => id.toString()));
}

describe("malformed tenant ids touch no Durable Object", () => {
  it("refuses them on /sql, in /v1/tenants/:id paths and in the create body, before any object exists", async () => {
    const before = await objectIds();

    for (const raw of malformedIds) {
      const encoded = encodeURIComponent(raw);
      await expectError(
        `/sql as ${raw}`,
        await sqlRequest(connectionString(encoded, tenantA.key), { query: "SELECT 1" }),
        400,
        "invalid_tenant_id",
      );
      // A path segment of exactly ".." is resolved away by the URL parser before it reaches Lessor.
      if (raw !== "..") {
        for (const path of [`/v1/tenants/${encoded}`, `/v1/tenants/${encoded}/events`]) {
          await expectError(`GET ${path}`, await admin(path), 400, "invalid_tenant_id");
        }
        await expectError(
          `POST /v1/tenants/${encoded}/disable`,
          await admin(`/v1/tenants/${encoded}/disable`, { method: "POST" }),
          400,
          "invalid_tenant_id",
        );
      }
      await expectError(
        `create ${raw}`,
        await admin("/v1/tenants", { method: "POST", json: { id: raw } }),
        400,
        "invalid_tenant_id",
      );
    }
    for (const id of [42, null, true, ["acme"], { id: "acme" }, ""]) {
      await expectError(
        `create ${JSON.stringify(id)}`,
        await admin("/v1/tenants", { method: "POST", json: { id } }),
        400,
        "invalid_tenant_id",
      );
    }
    await expectError(
      "create without id",
      await admin("/v1/tenants", { method: "POST", json: {} }),
      400,
      "invalid_tenant_id",
    );

    const after = await objectIds();
    for (const raw of malformedIds) {
      expect(after.has(env.TENANTS.idFromName(raw).toString()), raw).toBe(false);
    }
    expect([...after].filter((id) => !before.has(id))).toEqual([]);
  });

  it("a well-formed but unknown tenant gets no object either; a real tenant's object is seen (the check can fail)", async () => {
    const ghost = uniqueTenantId("ghost");
    const ghostId = env.TENANTS.idFromName(ghost).toString();
    const answer = await sqlRequest(connectionString(ghost, wrongKey), { query: "SELECT 1" });
    expect(answer.status).toBe(400);
    expect(await answer.json()).toMatchObject({ code: "28P01" });
    expect((await objectIds()).has(ghostId)).toBe(false);
    // Provisioning installs a real tenant's record in its object: that object is listed.
    const real = await createTenant(uniqueTenantId("real"));
    expect((await objectIds()).has(env.TENANTS.idFromName(real.id).toString())).toBe(true);
  });
});

describe("/sql credentials", () => {
  it("refuses a request without Neon-Connection-String", async () => {
    await expectError("no header", await sqlRequest(null, { query: "SELECT 1" }), 401, "missing_credentials");
  });

  it("refuses a connection string without a key, or with a bad scheme", async () => {
    await expectError(
      "no key",
      await sqlRequest(`postgres://${tenantA.id}@lessor.test/${tenantA.id}`, { query: "SELECT 1" }),
      400,
      "invalid_connection_string",
    );
    await expectError(
      "empty key",
      await sqlRequest(`postgres://${tenantA.id}:@lessor.test/${tenantA.id}`, { query: "SELECT 1" }),
      400,
      "invalid_connection_string",
    );
    await expectError(
      "http scheme",
      await sqlRequest(tenantA.connectionString.replace(/^postgres:/, "http:"), { query: "SELECT 1" }),
      400,
      "invalid_connection_string",
    );
    await expectError(
      "bad percent-encoding",
      await sqlRequest(connectionString(tenantA.id, "%zz"), { query: "SELECT 1" }),
      400,
      "invalid_connection_string",
    );
  });

  it("refuses a valid key that addresses another tenant's database exactly as a wrong password (28P01)", async () => {
    // A's own key, but B's database: the user and the database must name the same tenant. Postgres
    // (and the Neon driver's own tests) answer a user that does not match like a wrong password.
    const wrongPassword = await sqlRequest(connectionString(tenantA.id, wrongKey), { query: "SELECT 1" });
    const expected = { status: wrongPassword.status, body: await wrongPassword.text() };
    expect(expected.status).toBe(400);
    expect(JSON.parse(expected.body)).toEqual({
      message: "password authentication failed",
      code: "28P01",
      severity: "FATAL",
    });
    for (const [user, database] of [
      [tenantA.id, tenantB.id],
      [tenantB.id, tenantA.id],
    ] as const) {
      const response = await sqlRequest(connectionString(user, tenantA.key, database), { query: "SELECT 1" });
      expect({ status: response.status, body: await response.text() }).toEqual(expected);
    }
  });

  it("answers a wrong key, another tenant's key and an unknown tenant identically", async () => {
    const ghost = uniqueTenantId("nobody");
    const answers = [
      ["wrong key", await sqlRequest(connectionString(tenantA.id, wrongKey), { query: "SELECT 1" })],
      ["B's key for A", await sqlRequest(connectionString(tenantA.id, tenantB.key), { query: "SELECT 1" })],
      ["A's key for B", await sqlRequest(connectionString(tenantB.id, tenantA.key), { query: "SELECT 1" })],
      ["unknown tenant", await sqlRequest(connectionString(ghost, wrongKey), { query: "SELECT 1" })],
      [
        "unknown tenant, A's key",
        await sqlRequest(connectionString(ghost, tenantA.key), { query: "SELECT 1" }),
      ],
      ["not an lsk key", await sqlRequest(connectionString(tenantA.id, "hunter2"), { query: "SELECT 1" })],
    ] as const;
    const shapes = await Promise.all(
      answers.map(async ([, response]) => ({
        status: response.status,
        body: await response.text(),
        retryAfter: response.headers.get("Retry-After"),
      })),
    );
    // What Postgres answers a wrong password (the driver throws a NeonDbError with code 28P01).
    expect(shapes[0]?.status).toBe(400);
    expect(JSON.parse(shapes[0]?.body ?? "{}")).toMatchObject({ code: "28P01" });
    for (const shape of shapes) expect(shape).toEqual(shapes[0]);
  });

  it("still serves the right tenant afterwards", async () => {
    const response = await sqlRequest(tenantA.connectionString, { query: "SELECT current_database() AS db" });
    expect(response.status).toBe(200);
    const body = await record("A's query", response);
    expect(JSON.parse(body)).toMatchObject({ rows: [[tenantA.database]] });
  });
});

describe("/sql request bodies", () => {
  it("refuses bad JSON", async () => {
    for (const body of ["{not json", '{"query": "SELECT 1"', "\u0000", "'single'"]) {
      await expectError(
        `body ${body}`,
        await sqlRequest(tenantA.connectionString, body),
        400,
        "invalid_json",
      );
    }
  });

  it("refuses JSON that is not a Neon request", async () => {
    for (const body of [
      [],
      42,
      "SELECT 1",
      { query: "" },
      { query: 1 },
      { queries: "SELECT 1" },
      { query: "SELECT $1", params: "x" },
    ]) {
      await expectError(
        `body ${JSON.stringify(body)}`,
        await sqlRequest(tenantA.connectionString, JSON.stringify(body)),
        400,
        "invalid_request",
      );
    }
  });

  it("refuses bad batch headers", async () => {
    const batch = { queries: [{ query: "SELECT 1" }] };
    await expectError(
      "isolation level",
      await sqlRequest(tenantA.connectionString, batch, { "Neon-Batch-Isolation-Level": "Snapshot" }),
      400,
      "invalid_request",
    );
    await expectError(
      "read only",
      await sqlRequest(tenantA.connectionString, batch, { "Neon-Batch-Read-Only": "perhaps" }),
      400,
      "invalid_request",
    );
  });
});

describe("body size", () => {
  const limit = 1024 * 1024;
  const oversize = JSON.stringify({ query: `SELECT '${"x".repeat(limit)}'` });

  it("refuses a body over 1 MiB with 413 payload_too_large", async () => {
    expect(new TextEncoder().encode(oversize).byteLength).toBeGreaterThan(limit);
    await expectError(
      "/sql oversize",
      await sqlRequest(tenantA.connectionString, oversize),
      413,
      "payload_too_large",
    );
    await expectError(
      "create oversize",
      await admin("/v1/tenants", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ id: uniqueTenantId("big"), pad: "x".repeat(limit) }),
      }),
      413,
      "payload_too_large",
    );
  });

  it("refuses an oversize body streamed without a Content-Length", async () => {
    const chunk = new TextEncoder().encode("x".repeat(64 * 1024));
    let sent = 0;
    const stream = new ReadableStream<Uint8Array>({
      pull(controller) {
        // Bounded: 1 MiB + two chunks, then the stream ends.
        if (sent > limit + 2 * chunk.byteLength) controller.close();
        else {
          sent += chunk.byteLength;
          controller.enqueue(chunk);
        }
      },
    });
    const response = await lessor("/sql", {
      method: "POST",
      headers: { "Neon-Connection-String": tenantA.connectionString, "content-type": "application/json" },
      body: stream,
    });
    await expectError("/sql streamed oversize", response, 413, "payload_too_large");
  });

  it("accepts a body just under the limit", async () => {
    const filler = "y".repeat(limit - 200);
    const response = await sqlRequest(tenantA.connectionString, {
      query: "SELECT length($1) AS n",
      params: [filler],
    });
    const body = await record("/sql under the limit", response);
    expect(response.status).toBe(200);
    expect(JSON.parse(body)).toMatchObject({ rows: [[String(filler.length)]] });
  });

  it("takes the limit from LESSOR_MAX_BODY_BYTES", async () => {
    const small: Env = { ...env, LESSOR_MAX_BODY_BYTES: "2048" };
    const request = (size: number) =>
      new Request(`${base}/sql`, {
        method: "POST",
        headers: { "Neon-Connection-String": tenantA.connectionString, "content-type": "application/json" },
        body: JSON.stringify({ query: "SELECT length($1) AS n", params: ["z".repeat(size)] }),
      });
    const ctx = createExecutionContext();
    const refused = await app.fetch(request(4096), small, ctx);
    const accepted = await app.fetch(request(1024), small, ctx);
    await waitOnExecutionContext(ctx);
    await expectError("configured limit", refused, 413, "payload_too_large");
    expect(accepted.status).toBe(200);
    await record("configured limit, small body", accepted);
  });
});

describe("admin authentication", () => {
  it("refuses a missing admin key", async () => {
    await expectError("no Authorization", await lessor("/v1/tenants"), 401, "missing_credentials");
    await expectError(
      "no Authorization on create",
      await lessor("/v1/tenants", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ id: uniqueTenantId("noauth") }),
      }),
      401,
      "missing_credentials",
    );
  });

  it("refuses a wrong admin key, and a tenant key used as one", async () => {
    for (const token of ["wrong-admin-key", tenantA.key, `${env.LESSOR_ADMIN_KEY}x`]) {
      await expectError(
        "wrong admin key",
        await lessor(`/v1/tenants/${tenantA.id}`, { headers: { Authorization: `Bearer ${token}` } }),
        401,
        "invalid_credentials",
      );
    }
  });

  it("refuses an Authorization header that is not a bearer token", async () => {
    const answer = await errorAnswer(
      "basic auth",
      await lessor("/v1/tenants", {
        headers: { Authorization: `Basic ${btoa(`admin:${env.LESSOR_ADMIN_KEY}`)}` },
      }),
    );
    expect(answer.status).toBe(400);
    expect(answer.code).toBe("invalid_request");
  });

  it("creates nothing without the admin key", async () => {
    const id = uniqueTenantId("unauth");
    await record(
      "create with a tenant key",
      await lessor("/v1/tenants", {
        method: "POST",
        headers: { Authorization: `Bearer ${tenantA.key}`, "content-type": "application/json" },
        body: JSON.stringify({ id }),
      }),
    );
    await expectError("created?", await admin(`/v1/tenants/${id}`), 404, "tenant_not_found");
  });
});

describe("operator endpoints", () => {
  it("refuses bad JSON and non-object bodies on create", async () => {
    await expectError(
      "create bad JSON",
      await admin("/v1/tenants", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: "{id:",
      }),
      400,
      "invalid_json",
    );
    await expectError(
      "create array body",
      await admin("/v1/tenants", { method: "POST", json: [{ id: uniqueTenantId("arr") }] }),
      400,
      "invalid_request",
    );
  });

  it("refuses an unknown tier", async () => {
    await expectError(
      "unknown tier",
      await admin("/v1/tenants", { method: "POST", json: { id: uniqueTenantId("tier"), tier: "platinum" } }),
      400,
      "unknown_tier",
    );
  });

  it("names the valid tiers and hosts when one is unknown", async () => {
    const tier = await admin("/v1/tenants", {
      method: "POST",
      json: { id: uniqueTenantId("tier"), tier: "platinum" },
    });
    expect(tier.status).toBe(400);
    const tierBody = await tier.json<{ code: string; message: string }>();
    expect(tierBody.code).toBe("unknown_tier");
    expect(tierBody.message).toContain("standard");
    const host = await admin("/v1/tenants", {
      method: "POST",
      json: { id: uniqueTenantId("host"), host: "atlantis" },
    });
    expect(host.status).toBe(400);
    const hostBody = await host.json<{ code: string; message: string }>();
    expect(hostBody.code).toBe("unknown_host");
    expect(hostBody.message).toContain("local");
    expect(hostBody.message).not.toContain("postgres://");
  });

  it("refuses a duplicate tenant with 409 tenant_exists, and keeps the original key", async () => {
    await expectError(
      "duplicate",
      await admin("/v1/tenants", { method: "POST", json: { id: tenantA.id } }),
      409,
      "tenant_exists",
    );
    const response = await sqlRequest(tenantA.connectionString, { query: "SELECT 1" });
    expect(response.status).toBe(200);
    await record("A after duplicate", response);
  });

  it("answers an unknown tenant with 404 tenant_not_found", async () => {
    await expectError(
      "unknown",
      await admin(`/v1/tenants/${uniqueTenantId("none")}`),
      404,
      "tenant_not_found",
    );
  });

  it("answers unknown routes with 404 not_found", async () => {
    for (const [method, path] of [
      ["GET", "/nope"],
      ["GET", "/v2/tenants"],
      ["POST", "/v1/nope"],
      ["GET", "/sql/extra"],
      ["DELETE", "/v1"],
    ] as const) {
      await expectError(`${method} ${path}`, await lessor(path, { method }), 404, "not_found");
    }
  });

  it("status and list answers carry no credential", async () => {
    for (const path of [
      `/v1/tenants/${tenantA.id}`,
      "/v1/tenants?limit=200",
      `/v1/tenants/${tenantA.id}/events`,
    ]) {
      const response = await admin(path);
      expect(response.status).toBe(200);
      await record(path, response);
    }
  });
});

afterAll(() => {
  // Runs once every answer above has been recorded; a leak anywhere fails the file.
  expect(seen.length).toBeGreaterThan(50);
  const leaks: string[] = [];
  for (const { what, status, headers, body } of seen) {
    const text = `${headers}\n${body}`;
    for (const secret of secrets)
      if (text.includes(secret)) leaks.push(`${what} (${status}) contains a secret`);
    if (/postgres(ql)?:\/\/[^\s"'@/]*:[^\s"'@]+@/i.test(text))
      leaks.push(`${what} contains a connection string`);
    if (/lsk_[A-Za-z0-9_-]{8,}/.test(text)) leaks.push(`${what} contains a tenant key`);
    if (/password/i.test(text)) leaks.push(`${what} mentions a password`);
    if (/\n\s*at |\bat \S+ \(|:\d+:\d+\)/.test(body)) leaks.push(`${what} contains a stack frame`);
  }
  expect(leaks).toEqual([]);
});
