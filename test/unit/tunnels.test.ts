/**
 * Customers' databases behind tunnels, without a database (src/core/tunnel.ts, src/core/adoption.ts,
 * `LESSOR_TUNNELS` in src/config): a tunnel's budget name and health, the attach verdict, and what
 * configuration accepts.
 */
import { describe, expect, it } from "vitest";
import { budgetSubject, loadConfig } from "../../src/config/index.ts";
import {
  type AdoptedFacts,
  evaluateAdoption,
  minimumAdoptedServerVersion,
  parseAdoptionUrl,
} from "../../src/core/adoption.ts";
import { credentialReplaced, initialLifecycle, startFailed } from "../../src/core/lifecycle.ts";
import {
  breakerThreshold,
  initialTunnelHealth,
  tunnelAdmission,
  tunnelBudgetName,
  tunnelFaultOf,
  tunnelOfBudgetName,
  tunnelOutcome,
} from "../../src/core/tunnel.ts";
import { LessorError } from "../../src/errors/index.ts";
import { tunnelEndpoint } from "../../src/postgres/driver.ts";

describe("a tunnel's endpoint", () => {
  it("is the published wsproxy's path (/v1) when the proxy names none, and the proxy's own path otherwise", () => {
    expect(tunnelEndpoint("pg-tunnel.acme.example")).toBe("pg-tunnel.acme.example/v1");
    expect(tunnelEndpoint("127.0.0.1:9000")).toBe("127.0.0.1:9000/v1");
    expect(tunnelEndpoint("pg.example.com/ws")).toBe("pg.example.com/ws");
    expect(tunnelEndpoint("127.0.0.1:9000/v2")).toBe("127.0.0.1:9000/v2");
  });
});

describe("tunnel budget names", () => {
  it("are never a host's name, and name their tunnel back", () => {
    expect(tunnelBudgetName("acme-net")).toBe("tunnel:acme-net");
    expect(tunnelOfBudgetName("tunnel:acme-net")).toBe("acme-net");
    // Host names are slugs: no colon, so no host is ever taken for a tunnel.
    expect(tunnelOfBudgetName("local")).toBeNull();
  });
});

describe("tunnel health", () => {
  const t0 = 1_000_000;

  it("opens the breaker only after failures in a row, and names the last kind", () => {
    const once = tunnelOutcome(initialTunnelHealth, "slow", t0, 0);
    expect(once).toMatchObject({ state: "slow", consecutiveFailures: 1, openUntil: null });
    // One failure may be one tenant's bad luck: starts still try the tunnel.
    expect(tunnelAdmission(once, t0)).toEqual({ kind: "allow" });
    const twice = tunnelOutcome(once, "down", t0 + 10, 0);
    expect(twice.consecutiveFailures).toBe(breakerThreshold);
    expect(twice.state).toBe("down");
    const refused = tunnelAdmission(twice, t0 + 20);
    expect(refused).toMatchObject({ kind: "refuse", fault: "down" });
    expect(refused.kind === "refuse" && refused.retryAfterMs).toBeGreaterThan(0);
  });

  it("lets starts try again once the cool-down passed, longer after each further failure", () => {
    let health = initialTunnelHealth;
    const coolDowns: number[] = [];
    for (let failure = 1; failure <= 6; failure++) {
      health = tunnelOutcome(health, "down", t0, 0.999);
      if (health.openUntil !== null) coolDowns.push(health.openUntil - t0);
    }
    expect(coolDowns).toEqual([...coolDowns].sort((a, b) => a - b));
    expect(coolDowns.at(-1)).toBeLessThanOrEqual(30_000);
    expect(tunnelAdmission(health, (health.openUntil ?? 0) + 1)).toEqual({ kind: "allow" });
  });

  it("closes the breaker on the first success", () => {
    const open = tunnelOutcome(tunnelOutcome(initialTunnelHealth, "down", t0, 0), "down", t0, 0);
    const ok = tunnelOutcome(open, "ok", t0 + 5, 0);
    expect(ok).toMatchObject({ state: "up", consecutiveFailures: 0, openUntil: null, lastOkAt: t0 + 5 });
    expect(tunnelAdmission(ok, t0 + 6)).toEqual({ kind: "allow" });
  });

  it("blames the tunnel for a connect that timed out or was refused, never for a refused credential", () => {
    expect(tunnelFaultOf("timeout")).toBe("slow");
    expect(tunnelFaultOf("unreachable")).toBe("down");
    expect(tunnelFaultOf("credential_revoked")).toBeNull();
    expect(tunnelFaultOf("auth_failed")).toBeNull();
    expect(tunnelFaultOf("database_missing")).toBeNull();
  });
});

describe("a replaced credential", () => {
  it("lets a tenant backing off after a refused credential start again at once", () => {
    const failed = startFailed(
      { ...initialLifecycle, state: "starting", generation: 3 },
      "credential_revoked",
      0,
      0,
    );
    expect(failed).toMatchObject({ state: "failed", failureReason: "credential_revoked" });
    expect(credentialReplaced(failed)).toMatchObject({ state: "stopped", failures: 0, retryAt: null });
    const ready = { ...initialLifecycle, state: "ready" as const, generation: 2 };
    expect(credentialReplaced(ready)).toBe(ready);
  });
});

describe("parseAdoptionUrl", () => {
  it("takes the customer's URL apart, port 5432 by default", () => {
    expect(parseAdoptionUrl("postgres://app:s%40cret@10.0.0.5/appdb")).toEqual({
      hostname: "10.0.0.5",
      port: 5432,
      database: "appdb",
      user: "app",
      password: "s@cret",
    });
  });

  it.each([
    ["mysql://app:x@h/db", /postgres:\/\//],
    ["postgres://app@h/db", /password/],
    ["postgres://app:x@h/", /database/],
    ["postgres://:x@h/db", /user/],
    ["postgres://app:x@h/db;drop", /database/],
  ])("refuses %s without echoing the password", (url, problem) => {
    const parsed = parseAdoptionUrl(url);
    expect("problem" in parsed && parsed.problem).toMatch(problem);
    expect(JSON.stringify(parsed)).not.toContain(":x@");
  });
});

describe("evaluateAdoption", () => {
  const tight: AdoptedFacts = {
    serverVersionNum: 180004,
    serverVersion: "18.4",
    role: "app",
    superuser: false,
    createRole: false,
    createDb: false,
    connectionLimit: 3,
    validUntil: null,
    ownsDatabase: false,
    otherDatabases: [],
    maxPreparedTransactions: 0,
    loginGuardPossible: false,
  };
  const context = { poolSize: 2, tunnelPoolCapacity: 7, credentials: "customer" as const, now: 0 };

  it("serves a tight role with the customer's containment, no guard, no warning", () => {
    expect(evaluateAdoption(tight, context)).toEqual({
      fit: true,
      refused: [],
      warnings: [],
      containment: "customer",
      loginGuard: "not_possible",
      credentials: "customer",
    });
  });

  it("refuses a superuser, a server too old and a pool larger than the tunnel, each with its remedy", () => {
    const verdict = evaluateAdoption(
      { ...tight, superuser: true, serverVersionNum: minimumAdoptedServerVersion - 1, serverVersion: "13.9" },
      { ...context, poolSize: 8 },
    );
    expect(verdict.fit).toBe(false);
    expect(verdict.refused.map((r) => r.reason)).toEqual(["superuser", "version", "pool_size"]);
    expect(verdict.refused[1]?.remedy).toContain("13.9");
  });

  it("warns of every right a tenant key would inherit from a loose role", () => {
    const verdict = evaluateAdoption(
      {
        ...tight,
        createRole: true,
        createDb: true,
        connectionLimit: -1,
        ownsDatabase: true,
        otherDatabases: ["postgres"],
        maxPreparedTransactions: 5,
        validUntil: "2030-01-01T00:00:00Z",
        loginGuardPossible: true,
      },
      context,
    );
    expect(verdict.fit).toBe(true);
    expect(verdict.loginGuard).toBe("possible");
    expect(verdict.warnings).toEqual([
      expect.stringMatching(/CONNECTION LIMIT is unlimited/),
      expect.stringMatching(/CREATEROLE/),
      expect.stringMatching(/CREATEDB/),
      expect.stringMatching(/owns its database/),
      expect.stringMatching(/other databases \(postgres\)/),
      expect.stringMatching(/max_prepared_transactions is 5/),
      expect.stringMatching(/expires at 2030/),
    ]);
  });
});

describe("LESSOR_TUNNELS", () => {
  function env(tunnels: unknown): Env {
    return {
      LESSOR_POOL_SIZES: JSON.stringify({ free: 2, standard: 5 }),
      LESSOR_BUDGETS: JSON.stringify({ "*": { connections: 20, reserve: 2 } }),
      LESSOR_HOSTS: JSON.stringify({ main: "postgres://admin:pw@127.0.0.1:5432/postgres" }),
      LESSOR_ADMIN_KEY: "unit-admin",
      LESSOR_SEAL_KEY: "unit-seal",
      LESSOR_KEY_MAC_KEYS: btoa(String.fromCharCode(...new Uint8Array(32).fill(5))),
      ...(tunnels === undefined ? {} : { LESSOR_TUNNELS: JSON.stringify(tunnels) }),
    } as unknown as Env;
  }

  function refusal(value: unknown): string {
    try {
      loadConfig(env(value));
    } catch (error) {
      if (error instanceof LessorError) return error.message;
      throw error;
    }
    throw new Error("loadConfig accepted the configuration");
  }

  it("declares none by default", () => {
    expect(loadConfig(env(undefined)).tunnels.size).toBe(0);
  });

  it("reads a tunnel's proxy, capacity, reserve and connect bound; its budget has no overlap beyond it", () => {
    const config = loadConfig(
      env({
        acme: { proxy: "wss://pg.acme.example", capacity: 10, connectTimeoutMs: 3000, locationHint: "weur" },
        local: { proxy: "127.0.0.1:9000", capacity: 4 },
      }),
    );
    expect(config.tunnels.get("acme")).toEqual({
      name: "acme",
      budgetName: "tunnel:acme",
      proxy: "pg.acme.example",
      secure: true,
      budget: { connections: 10, reserve: 1, rotationReserve: 0 },
      connectTimeoutMs: 3000,
      locationHint: "weur",
    });
    expect(config.tunnels.get("local")).toMatchObject({
      proxy: "127.0.0.1:9000",
      secure: false,
      connectTimeoutMs: 5000,
    });
    // A BudgetObject finds what it budgets by name, host or tunnel.
    expect(budgetSubject(config, "tunnel:acme")?.tunnel?.name).toBe("acme");
    expect(budgetSubject(config, "main")?.tunnel).toBeNull();
    expect(budgetSubject(config, "acme")).toBeNull();
  });

  it.each([
    [{ acme: { proxy: "ws://pg.acme.example", capacity: 4 } }, /TLS/],
    [{ acme: { proxy: "pg.acme.example", capacity: 1 } }, /capacity/],
    [{ acme: { proxy: "pg.acme.example", capacity: 4, reserve: 4 } }, /reserve/],
    [{ acme: { capacity: 4 } }, /proxy/],
    [{ acme: { proxy: "pg.acme.example", capacity: 4, size: 2 } }, /unknown fields \(size\)/],
    [{ main: { proxy: "pg.acme.example", capacity: 4 } }, /host's name/],
    [{ "Acme Net": { proxy: "pg.acme.example", capacity: 4 } }, /slugs/],
  ])("refuses %j, naming LESSOR_TUNNELS", (value, problem) => {
    const message = refusal(value);
    expect(message).toContain("LESSOR_TUNNELS");
    expect(message).toMatch(problem);
  });
});
