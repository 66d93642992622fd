/**
 * Issue 30: Lessor runs with the role a provider gives, never a superuser, and says clearly when a
 * host's admin cannot do what it needs (docs/adr/016-host-kinds.md).
 *
 * The test stack's hosts share one cluster under admins of different rights (test/global-setup.ts):
 * `local` (the stack's admin: Neon's role layout plus the provider function), `nocreatedb`,
 * `notrigger` (no way to create the login guard's trigger), `reduced` (the same admin, configured
 * for reduced containment), `neonlike` (kind neon) and `logged` (kind postgres), whose DDL the
 * server logs, so what a password statement sent can be read back.
 */
import { env } from "cloudflare:test";
import { afterEach, describe, expect, it } from "vitest";
import type { HostReport } from "../../src/core/host-capabilities.ts";
import { unseal } from "../../src/crypto/seal.ts";
import { setLogSink } from "../../src/log/index.ts";
import type { CapacityStatus } from "../../src/rpc/budget.ts";
import { probeHostFacts } from "../../src/tenant-db/capabilities.ts";
import { admin, asSuperuser, createTenant, sqlRequest, uniqueTenantId } from "./harness.ts";
import { serverLogLinesSoFar } from "./server-log.ts";

async function capacityOf(host: string): Promise<CapacityStatus> {
  const response = await admin("/v1/capacity");
  const { hosts } = await response.json<{ hosts: CapacityStatus[] }>();
  const found = hosts.find((h) => h.host === host);
  if (!found) throw new Error(`no host ${host}`);
  return found;
}

async function provisionOn(host: string, id = uniqueTenantId(`hk-${host}`)): Promise<Response> {
  return admin("/v1/tenants", { method: "POST", json: { id, host } });
}

const serverLog = serverLogLinesSoFar;

async function passwordOf(id: string): Promise<string> {
  const sealed = await asSuperuser(async (client) => {
    const { rows } = await client.query(
      "SELECT sealed_password FROM tenant_credentials WHERE tenant_id = $1",
      [id],
    );
    return String(rows[0]?.sealed_password);
  }, "lessor");
  return unseal(env.LESSOR_SEAL_KEY, id, sealed);
}

let restoreLogs: (() => void) | null = null;
afterEach(() => {
  restoreLogs?.();
  restoreLogs = null;
});

describe("capabilities", () => {
  it("refuses to provision on a host whose admin cannot create databases, naming what is missing and how to grant it", async () => {
    const refused = await provisionOn("nocreatedb");
    expect(refused.status).toBe(503);
    expect(refused.headers.get("Retry-After")).toBeTruthy();
    const body = await refused.json<{ code: string; message: string }>();
    expect(body.code).toBe("host_unfit");
    expect(body.message).toMatch(/createdb/);
    expect(body.message).toMatch(/CREATEDB/);
    const report = (await capacityOf("nocreatedb")).capabilities;
    expect(report?.verdict).toMatchObject({ fit: false });
    expect(report?.verdict.missing.map((m) => m.capability)).toEqual(["createdb"]);
  });

  it("refuses a host with no way to create the login guard, and runs one configured for reduced containment, saying so", async () => {
    const refused = await provisionOn("notrigger");
    expect(refused.status).toBe(503);
    const body = await refused.json<{ code: string; message: string }>();
    expect(body).toMatchObject({ code: "host_unfit" });
    expect(body.message).toMatch(/event_trigger/);

    const id = uniqueTenantId("hk-reduced");
    const created = await provisionOn("reduced", id);
    expect(created.status).toBe(201);
    const { connectionString } = await created.json<{ connectionString: string }>();
    const answer = await sqlRequest(connectionString, { query: "SELECT 1", params: [] });
    expect(answer.status).toBe(200);
    const report = (await capacityOf("reduced")).capabilities as HostReport;
    expect(report.verdict).toMatchObject({ fit: true, containment: "reduced" });
    expect(report.facts.eventTriggers).toBe("none");
    expect(report.verdict.warnings.join(" ")).toMatch(/no login guard/);
    // Reduced means it: there is no trigger in that tenant's database, and the operator was told.
    const database = await asSuperuser(async (client) => {
      const { rows } = await client.query("SELECT database_name FROM tenants WHERE id = $1", [id]);
      return String(rows[0]?.database_name);
    }, "lessor");
    const triggers = await asSuperuser(async (client) => {
      const { rows } = await client.query("SELECT count(*)::int AS n FROM pg_event_trigger");
      return Number(rows[0]?.n);
    }, database);
    expect(triggers).toBe(0);
  });

  it("shows each host's kind and what its admin can do, on /v1/capacity and /v1/maintenance", async () => {
    // An admin connection on each host probes it (a create here; the cron's hygiene pass otherwise).
    const made = await createTenant(uniqueTenantId("hk-local"));
    expect(made.id).toBeTruthy();
    const local = (await capacityOf("local")).capabilities as HostReport;
    expect(local).toMatchObject({
      kind: "postgres",
      facts: {
        role: "lessor_admin",
        superuser: false,
        createRole: true,
        createDb: true,
        signalBackend: true,
        readAllStats: true,
        eventTriggers: "provider_function",
        tempFileLimit: true,
        maxPreparedTransactions: 10,
      },
      verdict: { fit: true, containment: "full", passwordMode: "scram-verifier", missing: [] },
    });
    expect(local.facts.serverVersionNum).toBeGreaterThanOrEqual(170000);
    const maintenance = await (await admin("/v1/maintenance")).json<{
      hosts: { host: string; kind: string; capabilities: HostReport | null }[];
    }>();
    expect(maintenance.hosts.find((h) => h.host === "local")).toMatchObject({
      kind: "postgres",
      capabilities: { verdict: { fit: true } },
    });
    expect(maintenance.hosts.find((h) => h.host === "neonlike")?.kind).toBe("neon");
  });
});

describe("the probe of what an admin can do", () => {
  it("leaves no error in the server's log, in a database where the admin may not create a schema", async () => {
    // `postgres` is where the hosts' admin URLs point, and where the admins may only connect: the
    // probe once created its scratch schema there, and logged `permission denied for database
    // postgres` at every probe (npm start showed it at creates, erases and cron ticks).
    const app = `lessor-test-probe-${crypto.randomUUID()}`;
    const facts = await asSuperuser(async (client) => {
      await client.query(`SELECT pg_catalog.set_config('application_name', $1, false)`, [app]);
      const probeAs = async (role: string) => {
        await client.query(`SET ROLE ${role}`);
        try {
          const { rows } = await client.query(
            "SELECT pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE') AS may",
          );
          expect(rows[0]?.may, `${role} may not create in postgres`).toBe(false);
          return await probeHostFacts(client);
        } finally {
          await client.query("RESET ROLE");
        }
      };
      return { local: await probeAs("lessor_admin"), notrigger: await probeAs("lessor_notrigger") };
    });
    // The answers the probe gave before: the stack's admin goes through the provider function, and
    // an admin with neither that nor a way of its own has no way to create the login guard.
    expect(facts.local.eventTriggers).toBe("provider_function");
    expect(facts.notrigger.eventTriggers).toBe("none");
    const logged = await serverLog(`|${app}|`);
    // The session's own lines are there (its disconnection, at least): the search finds them.
    expect(logged.some((line) => line.includes("disconnection:"))).toBe(true);
    expect(logged.filter((line) => /\b(ERROR|FATAL):/.test(line))).toEqual([]);
  });
});

describe("passwords travel as the host takes them", () => {
  it("a verifier where the host takes one: the plaintext never reaches the server", async () => {
    const tenant = await createTenant(uniqueTenantId("hk-verifier"), { host: "logged" });
    const password = await passwordOf(tenant.id);
    const statements = await serverLog(`ALTER ROLE "${tenant.role}" PASSWORD`);
    expect(statements.length).toBeGreaterThanOrEqual(1);
    for (const line of statements) expect(line).toMatch(/PASSWORD 'SCRAM-SHA-256\$4096:/);
    expect((await serverLog(password)).length).toBe(0);
  });

  it("on Neon's kind, the plaintext over the link only: never in a log line, an answer or an error of Lessor's", async () => {
    const lines: string[] = [];
    restoreLogs = setLogSink((_level, line) => lines.push(line));
    const id = uniqueTenantId("hk-neon");
    const created = await provisionOn("neonlike", id);
    const createdText = await created.text();
    expect(created.status).toBe(201);
    const { connectionString } = JSON.parse(createdText) as { connectionString: string };
    const role = await asSuperuser(async (client) => {
      const { rows } = await client.query("SELECT role_name FROM tenants WHERE id = $1", [id]);
      return String(rows[0]?.role_name);
    }, "lessor");
    const first = await passwordOf(id);
    // Rotation takes the same path: the new password, in plaintext, and nothing else.
    const answers = [createdText];
    answers.push(await (await sqlRequest(connectionString, { query: "SELECT 1", params: [] })).text());
    const rotated = await admin(`/v1/tenants/${id}/rotate-credentials`, { method: "POST" });
    answers.push(await rotated.text());
    expect(rotated.status).toBe(202);
    answers.push(await (await sqlRequest(connectionString, { query: "SELECT 1", params: [] })).text());
    const second = await passwordOf(id);
    expect(second).not.toBe(first);
    // A failure on the way says nothing of it either.
    answers.push(
      await (await sqlRequest(connectionString, { query: "SELECT * FROM nowhere", params: [] })).text(),
    );

    const statements = await serverLog(`ALTER ROLE "${role}" PASSWORD`);
    expect(statements.some((line) => line.includes(`PASSWORD '${first}'`))).toBe(true);
    expect(statements.some((line) => line.includes(`PASSWORD '${second}'`))).toBe(true);
    expect(statements.some((line) => line.includes("SCRAM-SHA-256$"))).toBe(false);
    // The server stored a verifier of it all the same (it hashes what it is given).
    const stored = await asSuperuser(async (client) => {
      const { rows } = await client.query("SELECT rolpassword FROM pg_authid WHERE rolname = $1", [role]);
      return String(rows[0]?.rolpassword);
    });
    expect(stored).toMatch(/^SCRAM-SHA-256\$/);
    for (const secret of [first, second]) {
      expect(lines.filter((line) => line.includes(secret))).toEqual([]);
      expect(answers.filter((answer) => answer.includes(secret))).toEqual([]);
    }
  });
});
