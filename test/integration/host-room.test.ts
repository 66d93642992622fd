/**
 * A host's room in tenants (docs/adr/028-a-fleet-that-sleeps.md, issue 44), on hosts whose limits
 * the test configuration lowers (test/global-setup.ts: `room-a` two databases, `room-j` three
 * roles, `room-1` one database): a full host refuses a create with `507 host_full`, two creates
 * racing for the last place get one place between them, JWT mode takes a role and is refused on a
 * host whose roles are taken, `/v1/capacity` shows databases and roles against the limits, and a
 * create that names no host records how its host was chosen in its audit row.
 */
import { exportJWK, generateKeyPair } from "jose";
import { describe, expect, it } from "vitest";
import { admin, uniqueTenantId } from "./harness.ts";

async function create(id: string, host?: string): Promise<Response> {
  return admin("/v1/tenants", { method: "POST", json: host === undefined ? { id } : { id, host } });
}

async function refusal(response: Response): Promise<{ status: number; code: string; message: string }> {
  const body = await response.json<{ code: string; message: string }>();
  return { status: response.status, code: body.code, message: body.message };
}

interface Tenancy {
  tenants: number;
  jwtTenants: number;
  databases: { used: number; limit: number | null };
  roles: { used: number; limit: number | null };
  tenantsLeft: number | null;
}

async function tenancyOf(host: string): Promise<Tenancy | undefined> {
  const response = await admin("/v1/capacity");
  expect(response.status).toBe(200);
  const body = await response.json<{ hosts: { host: string; tenancy?: Tenancy }[] }>();
  return body.hosts.find((h) => h.host === host)?.tenancy;
}

describe("a host's room in tenants", () => {
  it("a full host refuses a create with 507 host_full, and /v1/capacity shows why", async () => {
    expect(await tenancyOf("room-a")).toEqual({
      tenants: 0,
      jwtTenants: 0,
      databases: { used: 0, limit: 2 },
      roles: { used: 0, limit: null },
      tenantsLeft: 2,
    });
    expect((await create(uniqueTenantId("room"), "room-a")).status).toBe(201);
    expect((await create(uniqueTenantId("room"), "room-a")).status).toBe(201);
    const refused = await refusal(await create(uniqueTenantId("room"), "room-a"));
    expect(refused).toMatchObject({ status: 507, code: "host_full" });
    expect(refused.message).toContain("Host room-a holds 2 of 2 databases");
    expect(await tenancyOf("room-a")).toMatchObject({
      tenants: 2,
      databases: { used: 2, limit: 2 },
      tenantsLeft: 0,
    });
  });

  it("two creates racing for a host's last place: one gets it, the other 507", async () => {
    const answers = await Promise.all([
      create(uniqueTenantId("race"), "room-1"),
      create(uniqueTenantId("race"), "room-1"),
    ]);
    expect(answers.map((a) => a.status).sort()).toEqual([201, 507]);
    expect(await tenancyOf("room-1")).toMatchObject({ tenants: 1, databases: { used: 1, limit: 1 } });
  });

  it("JWT mode takes a second role; a host whose roles are taken refuses it with 507", async () => {
    const { publicKey } = await generateKeyPair("ES256", { extractable: true });
    const jwk = { ...(await exportJWK(publicKey)), kid: "k1", alg: "ES256", use: "sig" };
    const jwt = {
      issuer: "https://issuer.test",
      audience: "room",
      jwks: { keys: [jwk] },
      algorithms: ["ES256"],
    };
    const first = uniqueTenantId("jwt-room");
    const second = uniqueTenantId("jwt-room");
    expect((await create(first, "room-j")).status).toBe(201);
    const configured = await admin(`/v1/tenants/${first}/jwt`, { method: "PUT", json: jwt });
    expect(configured.status, await configured.clone().text()).toBe(200);
    // Configured again: it has its role already, nothing more is taken.
    expect((await admin(`/v1/tenants/${first}/jwt`, { method: "PUT", json: jwt })).status).toBe(200);
    expect(await tenancyOf("room-j")).toMatchObject({
      tenants: 1,
      jwtTenants: 1,
      roles: { used: 2, limit: 3 },
    });
    expect((await create(second, "room-j")).status).toBe(201);
    const refused = await refusal(await admin(`/v1/tenants/${second}/jwt`, { method: "PUT", json: jwt }));
    expect(refused).toMatchObject({ status: 507, code: "host_full" });
    expect(await tenancyOf("room-j")).toMatchObject({
      tenants: 2,
      jwtTenants: 1,
      roles: { used: 3, limit: 3 },
    });
    // The roles are taken: a new tenant does not fit either.
    expect(await refusal(await create(uniqueTenantId("jwt-room"), "room-j"))).toMatchObject({
      status: 507,
      code: "host_full",
    });
  });

  it("a create that names no host is placed by room, and its audit row says how", async () => {
    const id = uniqueTenantId("placed");
    const created = await create(id);
    expect(created.status).toBe(201);
    const audit = await (await admin(`/v1/audit?tenant=${id}&action=tenant.create`)).json<{
      entries: { detail: Record<string, unknown> }[];
    }>();
    // The test configuration opens one host to placement (LESSOR_PLACEMENT_HOSTS=local).
    expect(audit.entries[0]?.detail).toMatchObject({
      host: "local",
      placement: { policy: "room", candidates: 1, tenantsLeft: null },
    });
  });
});
