/**
 * Host kinds and capabilities (src/core/host-capabilities.ts, src/config): the verdicts a probe's
 * facts lead to, and what configuration accepts, without a database.
 */
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import {
  evaluateHost,
  type HostFacts,
  impliedHostKind,
  isPoolerHostname,
  passwordModeFor,
  reportIsFresh,
} from "../../src/core/host-capabilities.ts";
import { LessorError } from "../../src/errors/index.ts";

/** What a Neon project's owner role can do (from a dump of a Neon project on Postgres 18). */
const neonOwner: HostFacts = {
  serverVersionNum: 180004,
  role: "neondb_owner",
  superuser: false,
  createRole: true,
  createDb: true,
  signalBackend: true,
  readAllStats: true,
  eventTriggers: "direct",
  tempFileLimit: false,
  maxPreparedTransactions: 0,
  publicConnectDatabases: [],
};

describe("evaluateHost", () => {
  it("runs a Neon owner role with full containment, passwords in plaintext over TLS", () => {
    expect(evaluateHost("neon", neonOwner, "full")).toEqual({
      fit: true,
      containment: "full",
      passwordMode: "plaintext-over-tls",
      missing: [],
      warnings: [expect.stringMatching(/temp_file_limit/)],
    });
  });

  it("refuses a superuser admin: Lessor never runs as one", () => {
    const verdict = evaluateHost("postgres", { ...neonOwner, superuser: true }, "full");
    expect(verdict.fit).toBe(false);
    expect(verdict.missing.map((m) => m.capability)).toEqual(["superuser"]);
    expect(verdict.missing[0]?.remedy).toMatch(/CREATEROLE and CREATEDB/);
  });

  it("names each missing privilege with the provider's way to grant it", () => {
    const verdict = evaluateHost(
      "postgres",
      { ...neonOwner, createRole: false, createDb: false, signalBackend: false, readAllStats: false },
      "full",
    );
    expect(verdict.fit).toBe(false);
    expect(verdict.missing.map((m) => m.capability)).toEqual([
      "createrole",
      "createdb",
      "pg_signal_backend",
      "pg_read_all_stats",
    ]);
    for (const missing of verdict.missing) expect(missing.remedy).toMatch(/Neon|RDS|self-hosted/);
  });

  it("refuses Postgres 15, and Postgres 16 without reduced containment (no login triggers before 17)", () => {
    const pg15 = evaluateHost("postgres", { ...neonOwner, serverVersionNum: 150010 }, "full");
    expect(pg15.missing.map((m) => m.capability)).toEqual(["version", "event_trigger"]);
    const pg16 = evaluateHost("postgres", { ...neonOwner, serverVersionNum: 160004 }, "full");
    expect(pg16).toMatchObject({ fit: false });
    expect(pg16.missing.map((m) => m.capability)).toEqual(["event_trigger"]);
    const pg16Reduced = evaluateHost("postgres", { ...neonOwner, serverVersionNum: 160004 }, "reduced");
    expect(pg16Reduced).toMatchObject({ fit: true, containment: "reduced" });
    expect(pg16Reduced.warnings.join(" ")).toMatch(/no login guard/);
  });

  it("never runs without the guard silently: no way to create it is refused unless reduced is configured", () => {
    const none = { ...neonOwner, eventTriggers: "none" as const };
    expect(evaluateHost("postgres", none, "full")).toMatchObject({ fit: false });
    expect(evaluateHost("postgres", none, "reduced")).toMatchObject({ fit: true, containment: "reduced" });
    expect(
      evaluateHost("postgres", { ...neonOwner, eventTriggers: "provider_function" }, "full"),
    ).toMatchObject({
      fit: true,
      containment: "full",
      passwordMode: "scram-verifier",
    });
  });

  it("warns about prepared transactions and databases PUBLIC may connect to, without refusing", () => {
    const verdict = evaluateHost(
      "postgres",
      { ...neonOwner, maxPreparedTransactions: 10, publicConnectDatabases: ["postgres"] },
      "full",
    );
    expect(verdict.fit).toBe(true);
    expect(verdict.warnings.join("\n")).toMatch(/max_prepared_transactions is 10/);
    expect(verdict.warnings.join("\n")).toMatch(/PUBLIC may connect to postgres/);
  });

  it("keeps a report ten minutes", () => {
    const report = {
      kind: "neon" as const,
      probedAt: 1_000_000,
      facts: neonOwner,
      verdict: evaluateHost("neon", neonOwner, "full"),
    };
    expect(reportIsFresh(report, 1_000_000 + 9 * 60_000)).toBe(true);
    expect(reportIsFresh(report, 1_000_000 + 11 * 60_000)).toBe(false);
    expect(reportIsFresh(null, 0)).toBe(false);
  });
});

describe("host kinds", () => {
  it("a Neon host name implies Neon's kind; the password mode follows the kind", () => {
    expect(impliedHostKind("ep-cool-darkness-123456.us-east-2.aws.neon.tech")).toBe("neon");
    expect(impliedHostKind("db.internal.example")).toBe("postgres");
    expect(passwordModeFor("neon")).toBe("plaintext-over-tls");
    expect(passwordModeFor("postgres")).toBe("scram-verifier");
    expect(isPoolerHostname("ep-cool-darkness-123456-pooler.us-east-2.aws.neon.tech")).toBe(true);
    expect(isPoolerHostname("ep-cool-darkness-123456.us-east-2.aws.neon.tech")).toBe(false);
  });
});

describe("LESSOR_HOSTS", () => {
  function env(hosts: unknown, extra: Record<string, string> = {}): Env {
    return {
      LESSOR_POOL_SIZES: JSON.stringify({ standard: 5 }),
      LESSOR_BUDGETS: JSON.stringify({ "*": { connections: 20 } }),
      LESSOR_HOSTS: JSON.stringify(hosts),
      LESSOR_ADMIN_KEY: "unit-admin",
      LESSOR_SEAL_KEY: "unit-seal",
      LESSOR_KEY_MAC_KEYS: btoa(String.fromCharCode(...new Uint8Array(32).fill(5))),
      ...extra,
    } as unknown as Env;
  }

  function refusal(value: Env): string {
    try {
      loadConfig(value);
    } catch (error) {
      if (error instanceof LessorError) return error.message;
      throw error;
    }
    throw new Error("accepted");
  }

  const neonUrl = "postgres://neondb_owner:s3cret@ep-x-123.eu-central-1.aws.neon.tech/neondb";

  it("takes a connection string, or an object with a kind, a containment and a location hint", () => {
    const config = loadConfig(
      env({
        plain: "postgres://admin:pw@127.0.0.1:5432/postgres",
        neon: neonUrl,
        eu: {
          url: "postgres://admin:pw@10.0.0.1/postgres",
          kind: "postgres",
          containment: "reduced",
          locationHint: "weur",
        },
      }),
    );
    expect(config.hosts.get("plain")).toMatchObject({
      kind: "postgres",
      containment: "full",
      locationHint: null,
    });
    expect(config.hosts.get("neon")).toMatchObject({ kind: "neon", containment: "full" });
    expect(config.hosts.get("eu")).toMatchObject({
      kind: "postgres",
      containment: "reduced",
      locationHint: "weur",
    });
  });

  it("refuses a -pooler endpoint, naming why, never the secret", () => {
    const message = refusal(env({ main: neonUrl.replace("ep-x-123.", "ep-x-123-pooler.") }));
    expect(message).toMatch(/-pooler endpoint \(PgBouncer\)/);
    expect(message).not.toContain("s3cret");
  });

  it("refuses a plaintext-password host behind a WebSocket proxy that is not on loopback", () => {
    expect(refusal(env({ main: neonUrl }, { LESSOR_WS_PROXY: "proxy.example.com:443" }))).toMatch(
      /LESSOR_WS_PROXY.*TLS/,
    );
    expect(() => loadConfig(env({ main: neonUrl }, { LESSOR_WS_PROXY: "127.0.0.1:8787" }))).not.toThrow();
  });

  it("refuses unknown kinds, containments, location hints and fields", () => {
    const url = "postgres://a:b@127.0.0.1/postgres";
    expect(refusal(env({ main: { url, kind: "aurora" } }))).toMatch(/kind must be one of postgres, neon/);
    expect(refusal(env({ main: { url, containment: "none" } }))).toMatch(/containment must be/);
    expect(refusal(env({ main: { url, locationHint: "mars" } }))).toMatch(/locationHint must be one of/);
    expect(refusal(env({ main: { url, region: "eu" } }))).toMatch(/unknown fields \(region\)/);
    expect(refusal(env({ main: { kind: "neon" } }))).toMatch(/needs "url"/);
  });
});
