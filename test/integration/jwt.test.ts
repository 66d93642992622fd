/**
 * End-user JWTs and row-level security (issue 20; docs/adr/012-end-user-jwts.md): the official
 * driver's `authToken` against real Postgres policies, every way a token can be wrong, the attacks
 * an end user with a SQL prompt would try, JWKS rotation served from loopback, a token of one
 * tenant's issuer at another tenant, end-user keys, and the shared pool capacity.
 */
import { env } from "cloudflare:test";
import { exportJWK, generateKeyPair, type JWK, SignJWT } from "jose";
import { beforeAll, describe, expect, it } from "vitest";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  mapConcurrent,
  pollUntil,
  sqlFor,
  sqlRequest,
  tenantBackends,
  uniqueTenantId,
} from "./harness.ts";

interface SigningKey {
  kid: string;
  alg: "ES256" | "RS256";
  privateKey: CryptoKey;
  jwk: JWK;
}

async function signingKey(kid: string, alg: "ES256" | "RS256" = "ES256"): Promise<SigningKey> {
  const { publicKey, privateKey } = await generateKeyPair(alg, { extractable: true });
  return { kid, alg, privateKey, jwk: { ...(await exportJWK(publicKey)), kid, alg, use: "sig" } };
}

const issuer = "https://idp.example.test/";
const audience = "lessor-tests";

interface TokenOptions {
  sub?: string;
  iss?: string;
  aud?: string;
  expiresIn?: string | number;
  notBefore?: string | number;
  extra?: Record<string, unknown>;
}

async function tokenFor(key: SigningKey, options: TokenOptions = {}): Promise<string> {
  let jwt = new SignJWT({ ...options.extra })
    .setProtectedHeader({ alg: key.alg, kid: key.kid, typ: "JWT" })
    .setIssuer(options.iss ?? issuer)
    .setAudience(options.aud ?? audience)
    .setIssuedAt()
    .setExpirationTime(options.expiresIn ?? "5m");
  if (options.sub !== undefined) jwt = jwt.setSubject(options.sub);
  if (options.notBefore !== undefined) jwt = jwt.setNotBefore(options.notBefore);
  return jwt.sign(key.privateKey);
}

function base64url(text: string): string {
  return btoa(text).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
}

/** Sends `/sql` as the driver does, with an end user's token. */
function asEndUser(tenant: CreatedTenant, token: string | null, body: unknown, connectionString?: string) {
  return sqlRequest(
    connectionString ?? tenant.connectionString,
    body,
    token === null ? {} : { Authorization: `Bearer ${token}` },
  );
}

async function configureJwt(tenant: CreatedTenant, body: Record<string, unknown>): Promise<Response> {
  return admin(`/v1/tenants/${tenant.id}/jwt`, { method: "PUT", json: body });
}

async function expectRefusal(response: Response, status: number, code: string): Promise<void> {
  const text = await response.text();
  expect({ status: response.status, body: text }).toMatchObject({ status });
  expect((JSON.parse(text) as { code: string }).code).toBe(code);
}

/** The RLS schema of the example: each end user sees and writes only their own rows. */
const rlsSchema = [
  "CREATE TABLE todos (id serial PRIMARY KEY, user_id text NOT NULL DEFAULT auth.user_id(), body text NOT NULL)",
  "ALTER TABLE todos ENABLE ROW LEVEL SECURITY",
  "CREATE POLICY own_todos ON todos TO authenticated USING (user_id = auth.user_id()) WITH CHECK (user_id = auth.user_id())",
  "GRANT SELECT, INSERT, UPDATE, DELETE ON todos TO authenticated",
  "GRANT USAGE ON SEQUENCE todos_id_seq TO authenticated",
  // What a refused request would have written, had it run under any role.
  "CREATE TABLE marks (note text)",
  "GRANT INSERT ON marks TO authenticated",
];

let tenant: CreatedTenant;
let keyA: SigningKey;
let otherKey: SigningKey;

beforeAll(async () => {
  tenant = await createTenant(uniqueTenantId("jwt"));
  keyA = await signingKey("a1");
  otherKey = await signingKey("a1"); // same kid, another key: a forgery
  const configured = await configureJwt(tenant, {
    issuer,
    audience,
    jwks: { keys: [keyA.jwk] },
    algorithms: ["ES256"],
  });
  expect(configured.status, await configured.clone().text()).toBe(200);
  const sql = sqlFor(tenant);
  for (const statement of rlsSchema) await sql.query(statement);
});

describe("the admin API", () => {
  it("answers the configuration as stored, and refuses bad ones with a message that names the field", async () => {
    const got = await admin(`/v1/tenants/${tenant.id}/jwt`);
    expect(got.status).toBe(200);
    expect(await got.json()).toEqual({
      jwt: {
        issuer,
        audiences: [audience],
        jwks: { keys: [keyA.jwk] },
        jwksUrl: null,
        role: "authenticated",
        algorithms: ["ES256"],
        clockSkewSeconds: 30,
      },
    });
    const bad: [Record<string, unknown>, RegExp][] = [
      [{ issuer, audience }, /exactly one of jwks/],
      [{ issuer, audience, jwks: { keys: [keyA.jwk] }, jwksUrl: "https://x.test/jwks" }, /exactly one/],
      [{ issuer, audience, jwksUrl: "http://idp.example.test/jwks" }, /https/],
      [{ issuer, audience, jwks: { keys: [{ ...keyA.jwk, d: "secret" }] } }, /public keys only/],
      [{ issuer, audience, jwks: { keys: [{ kty: "oct", k: "c2VjcmV0" }] } }, /public keys only/],
      [{ issuer, audience, jwks: { keys: [keyA.jwk] }, algorithms: ["HS256"] }, /algorithms/],
      [{ issuer, audience, jwks: { keys: [keyA.jwk] }, algorithms: ["none"] }, /algorithms/],
      [{ issuer, audience, jwks: { keys: [keyA.jwk] }, role: "postgres" }, /reserved/],
      [{ issuer, audience, jwks: { keys: [keyA.jwk] }, role: "t_0000000000000000" }, /reserved/],
      [{ issuer, audience, jwks: { keys: [keyA.jwk] }, role: "Robert'); DROP" }, /role must be/],
      [{ issuer, audience, jwks: { keys: [keyA.jwk] }, clockSkewSeconds: 3600 }, /clockSkewSeconds/],
      [{ audience, jwks: { keys: [keyA.jwk] } }, /issuer/],
    ];
    for (const [body, message] of bad) {
      const answer = await configureJwt(tenant, body);
      const text = await answer.text();
      expect({ status: answer.status, body, text }).toMatchObject({ status: 400 });
      expect(text).toMatch(message);
    }
    // A role name taken by a role Lessor did not create (here: a tenant role's member-less twin).
    await asSuperuser((client) =>
      client.query(
        "DO $$ BEGIN CREATE ROLE squatter LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
      ),
    );
    await expectRefusal(
      await configureJwt(tenant, { issuer, audience, jwks: { keys: [keyA.jwk] }, role: "squatter" }),
      409,
      "jwt_role_unavailable",
    );
    // Without the admin key: refused.
    const asTenant = await lessor(`/v1/tenants/${tenant.id}/jwt`, {
      headers: { Authorization: `Bearer ${tenant.key}` },
    });
    expect(asTenant.status).toBe(401);
  });
});

describe("end users through neon()'s authToken", () => {
  it("reads the claims the way pg_session_jwt exposes them, as the configured role on the end-user login", async () => {
    const token = await tokenFor(keyA, { sub: "alice", extra: { email: "alice@example.test" } });
    const sql = sqlFor(tenant, { authToken: token });
    const [row] =
      await sql`SELECT auth.user_id() AS uid, auth.session() AS session, auth.jwt() = auth.session() AS same,
        current_user AS role, session_user AS login, auth.uid() AS uuid`;
    expect(row).toMatchObject({ uid: "alice", same: true, role: "authenticated", uuid: null });
    expect(row?.session).toMatchObject({
      sub: "alice",
      email: "alice@example.test",
      iss: issuer,
      aud: audience,
    });
    expect(row?.login).toBe(`${tenant.role}_jwt`);
    // The tenant's own requests see no claims (JSON null, as pg_session_jwt answers) and run as the tenant.
    const [plain] = await sqlFor(
      tenant,
    )`SELECT auth.user_id() AS uid, auth.session() AS session, current_user AS role`;
    expect(plain).toEqual({ uid: null, session: null, role: tenant.role });
  });

  it("keeps two end users apart under interleaved load: each sees and writes only their own rows", async () => {
    const users = ["user-1", "user-2"];
    const tokens = new Map(
      await Promise.all(users.map(async (sub) => [sub, await tokenFor(keyA, { sub })] as const)),
    );
    const perUser = 12;
    const work = Array.from({ length: perUser * users.length }, (_, i) => users[i % users.length] ?? "");
    await mapConcurrent(work, 6, async (sub, i) => {
      const sql = sqlFor(tenant, { authToken: tokens.get(sub) });
      if (i % 3 === 2) {
        // A transaction: its second statement reads what the first wrote, still as the same user.
        const results = await sql.transaction([
          sql`INSERT INTO todos (body) VALUES (${`${sub}-${i}`})`,
          sql`SELECT count(*)::int AS n, bool_and(user_id = ${sub}) AS mine FROM todos`,
        ]);
        expect(results[1]?.[0]).toMatchObject({ mine: true });
      } else {
        await sql`INSERT INTO todos (body) VALUES (${`${sub}-${i}`})`;
      }
      // Interleaved reads: never a row of the other user.
      const rows = await sql`SELECT user_id FROM todos`;
      expect(rows.every((r) => r.user_id === sub)).toBe(true);
    });
    for (const sub of users) {
      const sql = sqlFor(tenant, { authToken: tokens.get(sub) });
      const rows = await sql`SELECT user_id, body FROM todos ORDER BY id`;
      expect(rows).toHaveLength(perUser);
      expect(rows.every((r) => r.user_id === sub && String(r.body).startsWith(`${sub}-`))).toBe(true);
      // Writing a row for someone else is refused by the policy's check.
      const other = users.find((u) => u !== sub) ?? "";
      await expect(sql`INSERT INTO todos (user_id, body) VALUES (${other}, 'forged')`).rejects.toMatchObject({
        code: "42501",
      });
    }
    // The tenant role (the table's owner) sees everything.
    const [all] = await sqlFor(tenant)`SELECT count(*)::int AS n FROM todos WHERE user_id = ANY(${users})`;
    expect(all?.n).toBe(perUser * users.length);
  });
});

describe("tokens that must not pass (and never run as anyone)", () => {
  it("refuses expired, not-yet-valid, wrong-audience, wrong-issuer, alg none, unsigned, forged and junk tokens with 401", async () => {
    const now = Math.floor(Date.now() / 1000);
    const header = (alg: string) => base64url(JSON.stringify({ alg, typ: "JWT", kid: "a1" }));
    const payload = base64url(JSON.stringify({ sub: "mallory", iss: issuer, aud: audience, exp: now + 300 }));
    const cases: [string, string, string][] = [
      ["expired", await tokenFor(keyA, { sub: "mallory", expiresIn: now - 120 }), "jwt_expired"],
      ["not yet valid", await tokenFor(keyA, { sub: "mallory", notBefore: now + 600 }), "jwt_not_yet_valid"],
      [
        "wrong audience",
        await tokenFor(keyA, { sub: "mallory", aud: "someone-else" }),
        "jwt_audience_mismatch",
      ],
      [
        "wrong issuer",
        await tokenFor(keyA, { sub: "mallory", iss: "https://evil.test/" }),
        "jwt_issuer_mismatch",
      ],
      ["alg none", `${header("none")}.${payload}.`, "jwt_algorithm_refused"],
      [
        "HS256 (alg confusion)",
        `${header("HS256")}.${payload}.${base64url("x".repeat(32))}`,
        "jwt_algorithm_refused",
      ],
      [
        "unsigned (signature cut)",
        `${(await tokenFor(keyA, { sub: "mallory" })).split(".").slice(0, 2).join(".")}.`,
        "jwt_invalid",
      ],
      [
        "signed by another key with the same kid",
        await tokenFor(otherKey, { sub: "mallory" }),
        "jwt_invalid",
      ],
      [
        "with no exp",
        await new SignJWT({ sub: "mallory" })
          .setProtectedHeader({ alg: "ES256", kid: "a1" })
          .setIssuer(issuer)
          .setAudience(audience)
          .sign(keyA.privateKey),
        "jwt_invalid",
      ],
      ["junk", "not-a-jwt", "jwt_invalid"],
    ];
    for (const [name, token, code] of cases) {
      const answer = await asEndUser(tenant, token, {
        query: "INSERT INTO marks (note) VALUES ($1)",
        params: [name],
      });
      const text = await answer.text();
      expect({ name, status: answer.status, text }).toMatchObject({ status: 401 });
      expect({ name, code: (JSON.parse(text) as { code: string }).code }).toEqual({ name, code });
    }
    // An Authorization header that is not a bearer token is refused too, not ignored.
    await expectRefusal(
      await sqlRequest(
        tenant.connectionString,
        { query: "INSERT INTO marks (note) VALUES ('basic')" },
        { Authorization: "Basic YTpi" },
      ),
      401,
      "jwt_invalid",
    );
    // The official driver surfaces the refusal with the status and the code in its message.
    const expired = await tokenFor(keyA, { sub: "mallory", expiresIn: now - 120 });
    await expect(
      sqlFor(tenant, { authToken: expired })`INSERT INTO marks (note) VALUES ('driver')`,
    ).rejects.toThrow(/401.*jwt_expired/);
    const [marks] = await sqlFor(tenant)`SELECT count(*)::int AS n FROM marks`;
    expect(marks?.n).toBe(0);
  });

  it("a tenant without JWT mode refuses a Bearer token instead of ignoring it", async () => {
    const plain = await createTenant(uniqueTenantId("nojwt"));
    const token = await tokenFor(keyA, { sub: "alice" });
    await expectRefusal(await asEndUser(plain, token, { query: "SELECT 1" }), 401, "jwt_not_configured");
    expect((await asEndUser(plain, null, { query: "SELECT 1" })).status).toBe(200);
  });
});

describe("an end user with a SQL prompt cannot escalate", () => {
  let token: string;
  beforeAll(async () => {
    token = await tokenFor(keyA, { sub: "eve" });
    await sqlFor(tenant)`INSERT INTO todos (user_id, body) VALUES ('bob', 'bob''s secret')`;
  });

  async function run(queries: string[]): Promise<{ status: number; body: Record<string, unknown> }> {
    const answer = await asEndUser(
      tenant,
      token,
      queries.length === 1 ? { query: queries[0] } : { queries: queries.map((query) => ({ query })) },
    );
    return { status: answer.status, body: await answer.json() };
  }

  it("RESET ROLE leads to the end-user login, which holds nothing", async () => {
    const reset = await run(["RESET ROLE", "SELECT current_user, session_user"]);
    expect(reset.status).toBe(200);
    const results = (reset.body as { results: { rows: string[][] }[] }).results;
    expect(results[1]?.rows[0]).toEqual([`${tenant.role}_jwt`, `${tenant.role}_jwt`]);
    const read = await run(["RESET ROLE", "SELECT count(*) FROM todos"]);
    expect(read).toMatchObject({ status: 400, body: { code: "42501" } });
    // In one statement too: set_config('role', …) in a DO block, then reading the table.
    const inline = await run([
      "DO $$ BEGIN PERFORM set_config('role', 'none', true); PERFORM count(*) FROM todos; END $$",
    ]);
    expect(inline).toMatchObject({ status: 400, body: { code: "42501" } });
  });

  it("SET ROLE to the tenant role, or SET SESSION AUTHORIZATION, is refused", async () => {
    expect(await run([`SET ROLE ${tenant.role}`])).toMatchObject({ status: 400, body: { code: "42501" } });
    expect(await run([`SELECT set_config('role', '${tenant.role}', true)`])).toMatchObject({
      status: 400,
      body: { code: "42501" },
    });
    expect(await run([`SET SESSION AUTHORIZATION ${tenant.role}`])).toMatchObject({
      status: 400,
      body: { code: "42501" },
    });
  });

  it("claims set by a statement read as no claims: no impersonation", async () => {
    const forged = await run([
      `SELECT set_config('request.jwt.claims', '{"sub":"bob"}', true)`,
      "SELECT auth.user_id() AS uid, (SELECT count(*) FROM todos)::int AS n",
    ]);
    expect(forged.status).toBe(200);
    expect((forged.body as { results: { rows: unknown[][] }[] }).results[1]?.rows[0]).toEqual([null, "0"]);
    // Even with the MAC of the caller's own claims: it is bound to those claims.
    const replayed = await run([
      "SELECT set_config('request.jwt.claims', replace(current_setting('request.jwt.claims'), '\"eve\"', '\"bob\"'), true)",
      "SELECT auth.user_id() AS uid, (SELECT count(*) FROM todos)::int AS n",
    ]);
    expect((replayed.body as { results: { rows: unknown[][] }[] }).results[1]?.rows[0]).toEqual([null, "0"]);
    // The claims key itself is out of reach.
    expect(await run(["SELECT * FROM lessor_guard.claim_keys"])).toMatchObject({
      status: 400,
      body: { code: "42501" },
    });
    // …and the honest path still works.
    expect((await run(["SELECT auth.user_id()"])).body).toMatchObject({ rows: [["eve"]] });
  });

  it("a changed password of the end-user login is repaired, and nothing carries to the next request", async () => {
    const changed = await run(["RESET ROLE", "ALTER ROLE CURRENT_USER PASSWORD 'chosen-by-eve'"]);
    expect(changed.status).toBe(200);
    // Force new connections: the pool's next login meets the changed password and repairs it.
    await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: { force: true } });
    const after = await pollUntil(
      () => run(["SELECT auth.user_id(), current_user"]),
      (answer) => answer.status === 200,
      { attempts: 20, intervalMs: 250 },
    );
    expect(after.body).toMatchObject({ rows: [["eve", "authenticated"]] });
  });
});

describe("key sets", () => {
  it("picks up a rotated JWKS (a new kid) from a loopback JWKS URL, bounded", async () => {
    const rotating = await createTenant(uniqueTenantId("jwks"));
    const name = rotating.id;
    const jwksUrl = `${env.TEST_JWKS_SERVER_URL}/jwks/${name}`;
    const first = await signingKey("k1", "RS256");
    const second = await signingKey("k2", "RS256");
    const publish = (keys: JWK[]) => fetch(jwksUrl, { method: "PUT", body: JSON.stringify({ keys }) });
    const hits = async () =>
      (await (await fetch(`${env.TEST_JWKS_SERVER_URL}/hits/${name}`)).json<{ hits: number }>()).hits;
    await publish([first.jwk]);
    const configured = await configureJwt(rotating, { issuer, audience, jwksUrl, algorithms: ["RS256"] });
    expect(configured.status, await configured.clone().text()).toBe(200);

    const whoAmI = async (key: SigningKey) =>
      asEndUser(rotating, await tokenFor(key, { sub: key.kid }), { query: "SELECT auth.user_id()" });
    expect(await (await whoAmI(first)).json()).toMatchObject({ rows: [["k1"]] });
    // Cached: more requests fetch nothing more.
    for (let i = 0; i < 5; i++) expect((await whoAmI(first)).status).toBe(200);
    expect(await hits()).toBe(1);

    // Rotation: the provider now publishes k2 only. A k2 token makes Lessor fetch again.
    await publish([second.jwk]);
    const rotated = await pollUntil(
      () => whoAmI(second),
      (answer) => answer.status === 200,
      { attempts: 20, intervalMs: 250 },
    );
    expect(await rotated.json()).toMatchObject({ rows: [["k2"]] });
    // The retired k1 is gone from the cache with the set it belonged to.
    await expectRefusal(await whoAmI(first), 401, "jwt_key_unknown");
    // A flood of unknown kids costs at most a fetch per cooldown, not one per request.
    const before = await hits();
    const stranger = await signingKey("k-unknown", "RS256");
    for (let i = 0; i < 10; i++) expect((await whoAmI(stranger)).status).toBe(401);
    expect((await hits()) - before).toBeLessThanOrEqual(2);
  });

  it("a token of tenant A's issuer is refused by tenant B", async () => {
    const tenantB = await createTenant(uniqueTenantId("jwtb"));
    const keyB = await signingKey("b1");
    expect(
      (
        await configureJwt(tenantB, {
          issuer: "https://idp-b.example.test/",
          audience,
          jwks: { keys: [keyB.jwk] },
          algorithms: ["ES256"],
        })
      ).status,
    ).toBe(200);
    const tokenA = await tokenFor(keyA, { sub: "alice" });
    // B's key set does not hold A's key.
    await expectRefusal(await asEndUser(tenantB, tokenA, { query: "SELECT 1" }), 401, "jwt_key_unknown");
    // Even if B trusted A's keys, A's issuer is not B's.
    expect(
      (
        await configureJwt(tenantB, {
          issuer: "https://idp-b.example.test/",
          audience,
          jwks: { keys: [keyA.jwk, keyB.jwk] },
          algorithms: ["ES256"],
        })
      ).status,
    ).toBe(200);
    await expectRefusal(await asEndUser(tenantB, tokenA, { query: "SELECT 1" }), 401, "jwt_issuer_mismatch");
    // And B's own token works on B, not on A.
    const tokenB = await tokenFor(keyB, { sub: "bea", iss: "https://idp-b.example.test/" });
    expect((await asEndUser(tenantB, tokenB, { query: "SELECT auth.user_id()" })).status).toBe(200);
    await expectRefusal(await asEndUser(tenant, tokenB, { query: "SELECT 1" }), 401, "jwt_key_unknown");
  });
});

describe("end-user keys and the shared capacity", () => {
  it("an end-user key opens /sql only, and only with a token", async () => {
    const issued = await admin(`/v1/tenants/${tenant.id}/keys`, { method: "POST", json: { scope: "jwt" } });
    expect(issued.status).toBe(201);
    const { key, scope } = await issued.json<{ key: string; scope: string }>();
    expect(scope).toBe("jwt");
    const connectionString = tenant.connectionString.replace(tenant.key, key);
    await expectRefusal(
      await asEndUser(tenant, null, { query: "SELECT 1" }, connectionString),
      401,
      "jwt_required",
    );
    const token = await tokenFor(keyA, { sub: "browser-user" });
    const answer = await asEndUser(
      tenant,
      token,
      { query: "SELECT auth.user_id(), current_user" },
      connectionString,
    );
    expect(await answer.json()).toMatchObject({ rows: [["browser-user", "authenticated"]] });
    // Nothing else: not the tenant's REST endpoints, not session leases.
    const rest = await lessor(`/v1/tenants/${tenant.id}/keys`, {
      headers: { Authorization: `Bearer ${key}` },
    });
    await expectRefusal(rest, 403, "key_scope_refused");
    const lease = await lessor(`/v1/tenants/${tenant.id}/leases`, {
      method: "POST",
      headers: { Authorization: `Bearer ${key}` },
      body: "{}",
    });
    await expectRefusal(lease, 403, "key_scope_refused");
  });

  it("end-user and tenant connections together stay within the pool size", async () => {
    const small = await createTenant(uniqueTenantId("jwtcap"), { tier: "free" });
    expect(
      (await configureJwt(small, { issuer, audience, jwks: { keys: [keyA.jwk] }, algorithms: ["ES256"] }))
        .status,
    ).toBe(200);
    const token = await tokenFor(keyA, { sub: "cap" });
    const seen: number[] = [];
    await mapConcurrent(
      Array.from({ length: 24 }, (_, i) => i),
      6,
      async (i) => {
        const sql = sqlFor(small, i % 2 === 0 ? { authToken: token } : {});
        await sql`SELECT pg_sleep(0.02)`;
        if (i % 4 === 0) seen.push((await tenantBackends(small)).length);
      },
    );
    seen.push((await tenantBackends(small)).length);
    // Tier free: 2 connections, whichever role they log in as.
    expect(Math.max(...seen)).toBeLessThanOrEqual(2);
    const logins = await asSuperuser(async (client) => {
      const { rows } = await client.query(
        "SELECT DISTINCT usename FROM pg_stat_activity WHERE starts_with(application_name, $1)",
        [`lessor:${small.role}:`],
      );
      return rows.map((row: { usename: string }) => row.usename).sort();
    });
    expect(logins.every((login) => login === small.role || login === `${small.role}_jwt`)).toBe(true);
  });

  it("switching JWT mode off refuses tokens again", async () => {
    const off = await createTenant(uniqueTenantId("jwtoff"));
    expect(
      (await configureJwt(off, { issuer, audience, jwks: { keys: [keyA.jwk] }, algorithms: ["ES256"] }))
        .status,
    ).toBe(200);
    const token = await tokenFor(keyA, { sub: "gone" });
    expect((await asEndUser(off, token, { query: "SELECT 1" })).status).toBe(200);
    expect((await admin(`/v1/tenants/${off.id}/jwt`, { method: "DELETE" })).status).toBe(204);
    await expectRefusal(await asEndUser(off, token, { query: "SELECT 1" }), 401, "jwt_not_configured");
    expect((await admin(`/v1/tenants/${off.id}/jwt`)).status).toBe(404);
  });
});
