/**
 * lessorctl driven in-process with a fake `fetch`: the output formats (the seed's capacity lines,
 * status, eviction dry run, campaign progress), `--json`, error codes and exit codes, and help.
 * tests/browser and the captured output in docs/operating.md run it against a real Lessor.
 */
import { mkdtempSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createLocalJWKSet, type JSONWebKeySet, jwtVerify } from "jose";
import { describe, expect, it } from "vitest";
import { devAudience, devIssuer } from "../../cli/jwt-dev.ts";
import { formatDuration, formatValue, kv } from "../../cli/output.ts";
import { runCli } from "../../cli/program.ts";
import type { CapacityStatus, EvictionReport } from "../../src/rpc/budget.ts";

type Route = (request: Request) => unknown | Response;

interface Run {
  code: number;
  stdout: string[];
  stderr: string[];
  requests: Request[];
}

async function lessorctl(
  argv: string[],
  routes: Record<string, Route>,
  env: Record<string, string> = {},
  cwd = "/nonexistent",
): Promise<Run> {
  const stdout: string[] = [];
  const stderr: string[] = [];
  const requests: Request[] = [];
  const fakeFetch = (async (input: RequestInfo | URL, init?: RequestInit) => {
    const request = new Request(input, init);
    requests.push(request);
    const url = new URL(request.url);
    const route = routes[`${request.method} ${url.pathname}`];
    if (!route) return Response.json({ code: "not_found", message: "No such route." }, { status: 404 });
    const answer = await route(request);
    return answer instanceof Response ? answer : Response.json(answer);
  }) as typeof fetch;
  const code = await runCli(argv, {
    out: {
      line: (text) => stdout.push(text),
      error: (text) => stderr.push(text),
      isTTY: false,
      redraw: (text) => stdout.push(text),
    },
    fetch: fakeFetch,
    env: { LESSOR_URL: "http://lessor.test", LESSOR_ADMIN_KEY: "admin", ...env },
    cwd,
    sleep: async () => undefined,
  });
  return { code, stdout, stderr, requests };
}

const capacity: CapacityStatus = {
  host: "local",
  budget: 60,
  reserve: 10,
  rotationReserve: 6,
  poolCapacity: 50,
  rotations: { admitted: 0, refused: 0, waiting: 0 },
  allocated: 40,
  reserved: 5,
  draining: 5,
  pools: { reserved: 1, allocated: 8, draining: 1 },
  maintenance: { inUse: 2, waiting: 1, byPurpose: { migrate: 2 } },
  capabilities: {
    kind: "neon",
    probedAt: Date.parse("2026-12-01T10:00:00Z"),
    facts: {
      serverVersionNum: 170005,
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
    },
    verdict: {
      fit: true,
      containment: "full",
      passwordMode: "plaintext-over-tls",
      missing: [],
      warnings: ["temp_file_limit cannot be set per tenant role"],
    },
  },
  reconciled: {
    allocationsReleased: 0,
    orphansTerminated: 0,
    maintenanceExpired: 0,
    lease_count_corrected: 0,
    phase_corrected: 0,
    lease_reclaimed: 0,
    close_forced: 0,
  },
  waiters: 3,
  evictions: 16,
  saturations: 2,
  admissions: 40,
  leases: 7,
  pooled: { inUse: 7, idle: 33, grown: 4, shrunk: 11, adaptivePools: 8 },
  adaptive: {
    enabled: true,
    policy: { floor: 1, growthStep: 1, windowMs: 60_000 },
    growths: 9,
    growthsRefused: 1,
    shrinks: 6,
    reclaimShrinks: 5,
  },
  candidates: [
    { tenantId: "t-099", generation: 4, size: 5, idleMs: 43 * 60_000 + 5_000, leases: 0, pinned: false },
  ],
};

const failing = { windowSeconds: 86_400, count: 2, byHost: { local: 2 }, tenants: [] };

describe("lessorctl capacity", () => {
  it("prints the seed's three lines per host, then the eviction candidates", async () => {
    const run = await lessorctl(["capacity"], {
      "GET /v1/capacity": () => ({ hosts: [capacity] }),
      "GET /v1/fleet/failing": () => failing,
    });
    expect(run.code).toBe(0);
    expect(run.stdout).toEqual([
      "pools host=local ready=8 starting=1 draining=1 failed=2",
      "connections allocated=40 budget=60 pool_capacity=50 startup_reserved=5 waiters=3 draining=5 reserve=10 leases=7",
      "pooled adaptive=on in_use=7 idle=33 grown=4 shrunk=11 growths=9 growths_refused=1 shrinks=6 reclaim_shrinks=5 evictions=16",
      "maintenance in_use=2 reserve=10 waiting=1",
      "capabilities kind=neon fit=true containment=full passwords=plaintext-over-tls event_triggers=direct server=17 admin=neondb_owner probed=2026-12-01T10:00:00.000Z",
      'warning="temp_file_limit cannot be set per tenant role"',
      "eviction_candidate=t-099 idle=43m leases=0 pinned=false generation=4 size=5",
    ]);
    expect(run.requests[0]?.headers.get("Authorization")).toBe("Bearer admin");
  });

  it("says failed is unknown when the control plane is down, and filters by --host", async () => {
    const run = await lessorctl(["capacity", "--host", "local"], {
      "GET /v1/capacity": () => ({ hosts: [capacity, { ...capacity, host: "other" }] }),
      "GET /v1/fleet/failing": () =>
        Response.json({ code: "control_plane_unavailable", message: "down" }, { status: 503 }),
    });
    expect(run.code).toBe(0);
    expect(run.stdout[0]).toBe("pools host=local ready=8 starting=1 draining=1 failed=unknown");
    expect(run.stdout.filter((l) => l.startsWith("pools"))).toHaveLength(1);
  });

  it("shows each customer tunnel beside the hosts, with its health, and filters by --tunnel", async () => {
    const tunnel: CapacityStatus = {
      ...capacity,
      host: "tunnel:acme-net",
      budget: 8,
      reserve: 1,
      rotationReserve: 0,
      poolCapacity: 7,
      allocated: 2,
      reserved: 0,
      draining: 0,
      pools: { reserved: 0, allocated: 1, draining: 0 },
      maintenance: { inUse: 0, waiting: 0, byPurpose: {} },
      capabilities: null,
      waiters: 0,
      leases: 1,
      candidates: [],
      tunnel: {
        name: "acme-net",
        health: "slow",
        breaker: "open",
        consecutiveFailures: 2,
        openUntil: "2026-12-01T10:00:02.000Z",
        lastOkAt: null,
        lastFailureAt: "2026-12-01T10:00:00.000Z",
        failures: { slow: 2, down: 0 },
        refusedByBreaker: 3,
      },
    };
    const answers = {
      "GET /v1/capacity": () => ({ hosts: [capacity], tunnels: [tunnel] }),
      "GET /v1/fleet/failing": () => ({ ...failing, byHost: { local: 2, "tunnel:acme-net": 1 } }),
    };
    const run = await lessorctl(["capacity"], answers);
    expect(run.code).toBe(0);
    expect(run.stdout.slice(-4)).toEqual([
      "pools tunnel=acme-net ready=1 starting=0 draining=0 failed=1",
      "connections allocated=2 budget=8 pool_capacity=7 startup_reserved=0 waiters=0 draining=0 reserve=1 leases=1",
      "maintenance in_use=0 reserve=1 waiting=0",
      "tunnel health=slow breaker=open failures_slow=2 failures_down=0 refused_by_breaker=3 last_failure=2026-12-01T10:00:00.000Z",
    ]);
    expect(run.stdout[0]).toBe("pools host=local ready=8 starting=1 draining=1 failed=2");
    const only = await lessorctl(["capacity", "--tunnel", "acme-net"], answers);
    expect(only.stdout.filter((l) => l.startsWith("pools"))).toEqual([
      "pools tunnel=acme-net ready=1 starting=0 draining=0 failed=1",
    ]);
    const unknown = await lessorctl(["capacity", "--tunnel", "nowhere"], answers);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr.join("\n")).toContain("unknown_tunnel");
  });

  it("means by budget= what /v1/capacity and the status page mean: the host's connections; pools share pool_capacity=", async () => {
    const run = await lessorctl(["capacity"], {
      "GET /v1/capacity": () => ({ hosts: [capacity] }),
      "GET /v1/fleet/failing": () => failing,
    });
    const fields = Object.fromEntries(
      (run.stdout.find((line) => line.startsWith("connections ")) ?? "")
        .split(" ")
        .slice(1)
        .map((field) => field.split("=")),
    );
    expect(capacity.budget).not.toBe(capacity.poolCapacity);
    expect(fields).toMatchObject({
      budget: String(capacity.budget),
      reserve: String(capacity.reserve),
      pool_capacity: String(capacity.budget - capacity.reserve),
    });
    expect(run.stdout.join("\n")).not.toMatch(new RegExp(`\\bbudget=${capacity.poolCapacity}\\b`));
  });

  it("prints JSON with --json", async () => {
    const run = await lessorctl(["--json", "capacity"], {
      "GET /v1/capacity": () => ({ hosts: [capacity] }),
      "GET /v1/fleet/failing": () => failing,
    });
    expect(JSON.parse(run.stdout.join("\n"))).toMatchObject({
      hosts: [{ host: "local" }],
      failing: { count: 2 },
    });
  });
});

describe("lessorctl errors", () => {
  it("prints the API's code and message and exits non-zero", async () => {
    const run = await lessorctl(["status", "nobody"], {
      "GET /v1/tenants/nobody": () =>
        Response.json({ code: "tenant_not_found", message: "No such tenant." }, { status: 404 }),
    });
    expect(run.code).toBe(1);
    expect(run.stderr).toEqual(['error code=tenant_not_found status=404 message="No such tenant."']);
    expect(run.stdout).toEqual([]);
  });

  it("says so when Lessor cannot be reached or no admin key is known", async () => {
    const errors: string[] = [];
    const unreachable = await runCli(["capacity"], {
      out: { line: () => undefined, error: (t) => errors.push(t), isTTY: false, redraw: () => undefined },
      fetch: (async () => {
        throw new TypeError("fetch failed");
      }) as typeof fetch,
      env: { LESSOR_URL: "http://127.0.0.1:1", LESSOR_ADMIN_KEY: "k" },
      cwd: "/nonexistent",
      sleep: async () => undefined,
    });
    expect(unreachable).toBe(1);
    expect(errors[0]).toMatch(
      /^error code=unreachable status=0 message="Could not reach Lessor at http:\/\/127.0.0.1:1/,
    );
    const noKey = await lessorctl(["capacity"], {}, { LESSOR_ADMIN_KEY: "" });
    expect(noKey.code).toBe(1);
    expect(noKey.stderr[0]).toMatch(/^error code=missing_admin_key status=0 /);
    expect(noKey.requests).toEqual([]);
  });

  it("refuses evict without --dry-run and an unknown command, with usage on stderr", async () => {
    const evict = await lessorctl(["evict"], {});
    expect(evict.code).not.toBe(0);
    expect(evict.stderr.join("\n")).toContain("--dry-run");
    expect(evict.requests).toEqual([]);
    const unknown = await lessorctl(["frobnicate"], {});
    expect(unknown.code).not.toBe(0);
  });
});

describe("lessorctl status, acquire, release", () => {
  it("prints one key=value line with - for what is not set", async () => {
    const run = await lessorctl(["status", "acme"], {
      "GET /v1/tenants/acme": () => ({
        tenant: { id: "acme", status: "active", tier: "standard", host: "local", schemaVersion: 3 },
        runtime: {
          state: "failed",
          generation: 8,
          poolSize: null,
          leases: 0,
          lastUsedAt: null,
          idleSince: null,
          failureReason: "unreachable",
          retryAt: "2026-11-30T14:02:31.412Z",
          pendingEvents: 0,
          sessions: 0,
          pinned: false,
          migrating: false,
          schemaVersion: null,
          drain: null,
          reclaimedLeases: 0,
        },
      }),
    });
    expect(run.stdout).toEqual([
      "tenant=acme generation=8 state=failed pool_size=- pool_floor=- pool_max=- peak=- adaptive=- leases=0 sessions=0 schema_version=3 last_used=- failure=unreachable retry_at=2026-11-30T14:02:31.412Z status=active tier=standard host=local pinned=false migrating=false",
    ]);
  });

  it("shows an adaptive pool's size, floor, maximum and observed peak", async () => {
    const run = await lessorctl(["status", "acme"], {
      "GET /v1/tenants/acme": () => ({
        tenant: { id: "acme", status: "active", tier: "standard", host: "local", schemaVersion: 3 },
        runtime: {
          state: "ready",
          generation: 9,
          poolSize: 6,
          leases: 2,
          lastUsedAt: null,
          idleSince: null,
          failureReason: null,
          retryAt: null,
          pendingEvents: 0,
          sessions: 0,
          pinned: false,
          migrating: false,
          schemaVersion: 3,
          drain: null,
          reclaimedLeases: 0,
          pool: {
            adaptive: true,
            size: 3,
            start: 2,
            floor: 1,
            max: 6,
            observed: {
              windowMs: 60_000,
              coveredMs: 60_000,
              peak: 3,
              recentPeak: 2,
              mean: 1.5,
              waits: 4,
              meanWaitMs: 12,
              maxWaitMs: 30,
              refusals: 0,
            },
            lastObserved: null,
            lastDecision: null,
          },
        },
      }),
    });
    expect(run.stdout[0]).toMatch(
      /^tenant=acme generation=9 state=ready pool_size=3 pool_floor=1 pool_max=6 peak=3 adaptive=true leases=2 /,
    );
  });

  it("acquires with the tenant's key, not the admin key, and releases", async () => {
    const run = await lessorctl(["acquire", "acme", "--key", "lsk_tenant", "--ttl", "5000"], {
      "POST /v1/tenants/acme/leases": async (request) => {
        expect(request.headers.get("Authorization")).toBe("Bearer lsk_tenant");
        expect(await request.json()).toEqual({ ttlMs: 5000 });
        return { lease: "lsl_acme_ab", generation: 8, expiresAt: "2026-11-30T14:03:01.000Z" };
      },
    });
    expect(run.stdout).toEqual([
      "tenant=acme generation=8 state=ready lease=lsl_acme_ab expires_at=2026-11-30T14:03:01.000Z",
    ]);
    const released = await lessorctl(["release", "lsl_acme_ab", "--key", "lsk_tenant"], {
      "DELETE /v1/leases/lsl_acme_ab": () => new Response(null, { status: 204 }),
    });
    expect(released.stdout).toEqual(["lease=lsl_acme_ab released=true"]);
  });
});

describe("lessorctl tenants usage", () => {
  it("prints the fleet's totals, counting as tenants_with_usage the tenants whose usage is recorded", async () => {
    const run = await lessorctl(["tenants", "usage"], {
      "GET /v1/usage": () => ({
        region: "default",
        tenantsWithUsage: 1,
        usage: { queries: 8, rowsReturned: 7, errors: 1, leaseMs: 178, poolStarts: 7 },
        unfoldedDeltas: 3,
        asOf: "2026-11-30T15:54:41.789Z",
      }),
    });
    expect(run.code).toBe(0);
    expect(run.stdout).toEqual([
      "fleet tenants_with_usage=1 queries=8 rows_returned=7 errors=1 lease_ms=178 pool_starts=7 unfolded_deltas=3 as_of=2026-11-30T15:54:41.789Z",
    ]);
  });
});

describe("lessorctl evict --dry-run", () => {
  it("prints the victims in order and why each other pool is spared", async () => {
    const report: EvictionReport = {
      host: "local",
      budget: 60,
      reserve: 10,
      waiters: 0,
      size: 5,
      poolCapacity: 50,
      used: 50,
      draining: 0,
      outcome: "evicts",
      pools: [
        {
          tenantId: "old",
          generation: 2,
          size: 5,
          phase: "allocated",
          idleMs: 3_600_000,
          leases: 0,
          pinned: false,
          migrating: false,
          verdict: "evict",
          order: 1,
          reason: null,
        },
        {
          tenantId: "new",
          generation: 1,
          size: 5,
          phase: "allocated",
          idleMs: 60_000,
          leases: 0,
          pinned: false,
          migrating: false,
          verdict: "eligible_not_needed",
          order: null,
          reason: null,
        },
        {
          tenantId: "busy",
          generation: 9,
          size: 5,
          phase: "allocated",
          idleMs: null,
          leases: 2,
          pinned: false,
          migrating: false,
          verdict: "not_eligible",
          order: null,
          reason: "leased",
        },
      ],
    };
    const run = await lessorctl(["evict", "--dry-run", "--host", "local", "--tier", "standard"], {
      "GET /v1/capacity/evictions": (request) => {
        expect(new URL(request.url).search).toBe("?host=local&tier=standard");
        return { tier: "standard", hosts: [report] };
      },
    });
    expect(run.stdout).toEqual([
      "evict_dry_run host=local size=5 outcome=evicts used=50 pool_capacity=50 draining=0 waiters=0",
      "evict order=1 tenant=old generation=2 size=5 idle=1h",
      "eligible_not_needed tenant=new generation=1 size=5 idle=1m",
      "not_eligible tenant=busy generation=9 size=5 idle=- reason=leased leases=2",
    ]);
  });
});

describe("lessorctl campaign", () => {
  const cohort = (o: Partial<Record<string, number>> = {}) => ({
    pending: 0,
    running: 0,
    succeeded: 0,
    failed: 0,
    skippedRetry: 0,
    skippedFinal: 0,
    ...o,
  });
  const answer = (state: string, canary: ReturnType<typeof cohort>, rollout: ReturnType<typeof cohort>) => ({
    campaign: {
      id: "cmp_0123456789abcdef",
      state,
      toVersion: 3,
      concurrency: 4,
      blockedReason: null,
      reason: null,
    },
    counts: { pending: 0, running: 0, succeeded: 0, failed: 0, skipped: 0, total: 10 },
    cohorts: { canary, rollout },
    tenants: [],
  });

  it("--watch prints progress until the campaign is done, and exits 0", async () => {
    const answers = [
      answer("canary", cohort({ running: 2 }), cohort({ pending: 8 })),
      answer("rollout", cohort({ succeeded: 2 }), cohort({ pending: 4, running: 4 })),
      answer("done", cohort({ succeeded: 2 }), cohort({ succeeded: 7, skippedFinal: 1 })),
    ];
    let read = 0;
    const run = await lessorctl(["campaign", "status", "cmp_0123456789abcdef", "--watch"], {
      "GET /v1/campaigns/cmp_0123456789abcdef": () => answers[Math.min(read++, answers.length - 1)],
    });
    expect(run.code).toBe(0);
    // Three progress lines (one per change), then the final status: the summary and each cohort.
    expect(run.stdout).toHaveLength(6);
    expect(run.stdout[4]).toBe(
      "cohort=canary pending=0 running=0 succeeded=2 failed=0 skipped_retry=0 skipped_final=0",
    );
    expect(run.stdout[0]).toMatch(
      /^\[░+\] {3}0% campaign=cmp_0123456789abcdef state=canary .*remaining=10 total=10 batch=2 canary=running/,
    );
    expect(run.stdout[1]).toMatch(/ 20% .*done=2 .*batch=4 canary=passed/);
    expect(run.stdout[2]).toMatch(/^\[█+\] 100% .*state=done .*done=9 failed=0 skipped=1 remaining=0/);
    // A finished campaign has no batch: `-`, not 0.
    expect(run.stdout[2]).toContain(" batch=- ");
  });

  it("--watch exits 1 when the campaign fails; cancel (and its old name abort) cancels", async () => {
    const run = await lessorctl(["campaign", "status", "cmp_0123456789abcdef", "--watch"], {
      "GET /v1/campaigns/cmp_0123456789abcdef": () =>
        answer("failed", cohort({ failed: 1 }), cohort({ pending: 9 })),
    });
    expect(run.code).toBe(1);
    expect(run.stdout[0]).toContain("canary=failed");
    const aborted = await lessorctl(["campaign", "abort", "cmp_0123456789abcdef"], {
      "POST /v1/campaigns/cmp_0123456789abcdef/cancel": () => ({
        campaign: {
          id: "cmp_0123456789abcdef",
          state: "cancelled",
          toVersion: 3,
          reason: "cancelled by the operator",
        },
      }),
    });
    expect(aborted.stdout).toEqual([
      'campaign=cmp_0123456789abcdef state=cancelled to_version=3 reason="cancelled by the operator"',
    ]);
    const cancelled = await lessorctl(["campaign", "cancel", "cmp_0123456789abcdef"], {
      "POST /v1/campaigns/cmp_0123456789abcdef/cancel": () => ({
        campaign: { id: "cmp_0123456789abcdef", state: "cancelled", toVersion: 3, reason: null },
      }),
    });
    expect(cancelled.code).toBe(0);
    expect(cancelled.stdout).toEqual(["campaign=cmp_0123456789abcdef state=cancelled to_version=3 reason=-"]);
  });

  it("create --id prints only the new campaign's id, for $(…)", async () => {
    const run = await lessorctl(
      ["campaign", "create", "--to-version", "4", "--canary-percent", "5", "--id"],
      {
        "POST /v1/campaigns": () =>
          Response.json(
            {
              campaign: { id: "cmp_0123456789abcdef", state: "pending", toVersion: 4 },
              enrolled: 3,
              canary: ["a"],
              alreadyCurrent: 0,
            },
            { status: 201 },
          ),
      },
    );
    expect(run.stdout).toEqual(["cmp_0123456789abcdef"]);
    expect(await run.requests[0]?.json()).toEqual({ toVersion: 4, canaryPercent: 5 });
  });

  it("create sends only the options given", async () => {
    const run = await lessorctl(
      ["campaign", "create", "--to-version", "3", "--canary", "a,b", "--concurrency", "2"],
      {
        "POST /v1/campaigns": async (request) => {
          expect(await request.json()).toEqual({ toVersion: 3, concurrency: 2, canary: ["a", "b"] });
          return {
            campaign: { id: "cmp_0123456789abcdef", state: "pending", toVersion: 3 },
            enrolled: 12,
            canary: ["a", "b"],
            alreadyCurrent: 0,
          };
        },
      },
    );
    expect(run.stdout).toEqual([
      "campaign=cmp_0123456789abcdef state=pending to_version=3 enrolled=12 canary=a,b already_current=0",
    ]);
  });
});

describe("lessorctl tenants create and key", () => {
  const created = {
    tenant: {
      id: "acme",
      status: "active",
      tier: "standard",
      host: "local",
      schemaVersion: 3,
      createdAt: "2026-11-30T14:00:00.000Z",
    },
    key: "lsk_new",
    connectionString: "postgres://acme:lsk_new@127.0.0.1:8787/acme",
  };

  it("create --connection-string prints only the connection string, for $(…)", async () => {
    const run = await lessorctl(["tenants", "create", "acme", "--connection-string"], {
      "POST /v1/tenants": () => Response.json(created, { status: 201 }),
    });
    expect(run.code).toBe(0);
    expect(run.stdout).toEqual(["postgres://acme:lsk_new@127.0.0.1:8787/acme"]);
    expect(await run.requests[0]?.json()).toEqual({ id: "acme" });
  });

  it("create of a tenant that exists prints the API's refusal on stderr, nothing on stdout, exit 1", async () => {
    const message = "A tenant with this id already exists; pick another id, or mint a new key for it.";
    const run = await lessorctl(["tenants", "create", "acme", "--connection-string"], {
      "POST /v1/tenants": () => Response.json({ code: "tenant_exists", message }, { status: 409 }),
    });
    expect(run).toMatchObject({ code: 1, stdout: [] });
    expect(run.stderr).toEqual([`error code=tenant_exists status=409 message=${JSON.stringify(message)}`]);
  });

  it("key mints another key with the admin key and prints it with its connection string", async () => {
    const minted = {
      keyId: "k_0123456789abcdef",
      key: "lsk_second",
      scope: "full",
      createdAt: "2026-11-30T14:00:00.000Z",
      expiresAt: null,
      connectionString: "postgres://acme:lsk_second@127.0.0.1:8787/acme",
    };
    const run = await lessorctl(["tenants", "key", "acme"], {
      "POST /v1/tenants/acme/keys": () => Response.json(minted, { status: 201 }),
    });
    expect(run.code).toBe(0);
    expect(run.stdout).toEqual([
      "tenant=acme key_id=k_0123456789abcdef scope=full expires_at=- key=lsk_second connection_string=postgres://acme:lsk_second@127.0.0.1:8787/acme",
    ]);
    expect(run.requests[0]?.headers.get("Authorization")).toBe("Bearer admin");
    expect(await run.requests[0]?.json()).toEqual({ scope: "full" });
    const only = await lessorctl(["tenants", "key", "acme", "--scope", "jwt", "--connection-string"], {
      "POST /v1/tenants/acme/keys": () => Response.json({ ...minted, scope: "jwt" }, { status: 201 }),
    });
    expect(only.stdout).toEqual([minted.connectionString]);
    expect(await only.requests[0]?.json()).toEqual({ scope: "jwt" });
  });
});

describe("lessorctl jwt dev", () => {
  const stored = (body: { issuer: string; audience: string; algorithms: string[] }) => ({
    jwt: {
      issuer: body.issuer,
      audiences: [body.audience],
      role: "authenticated",
      algorithms: body.algorithms,
      jwks: body,
      jwksUrl: null,
      clockSkewSeconds: 30,
      loginRole: "t_x_jwt",
    },
  });

  async function jwtDev(argv: string[], cwd: string, url = "http://127.0.0.1:8787") {
    const bodies: { issuer: string; audience: string; algorithms: string[]; jwks: JSONWebKeySet }[] = [];
    const run = await lessorctl(
      ["jwt", "dev", "acme", ...argv],
      {
        "PUT /v1/tenants/acme/jwt": async (request) => {
          const body = await request.json<(typeof bodies)[number]>();
          bodies.push(body);
          return stored(body);
        },
      },
      { LESSOR_URL: url },
      cwd,
    );
    return { run, bodies };
  }

  it("switches the tenant to JWT mode with a static key set and mints tokens that verify against it", async () => {
    const cwd = mkdtempSync(join(tmpdir(), "lessorctl-jwt-"));
    try {
      const { run, bodies } = await jwtDev([], cwd);
      expect(run.code).toBe(0);
      expect(bodies).toHaveLength(1);
      const body = bodies[0];
      expect(body).toMatchObject({ issuer: devIssuer, audience: devAudience, algorithms: ["ES256"] });
      expect(body?.jwks.keys).toHaveLength(1);
      expect(body?.jwks.keys[0]).not.toHaveProperty("d"); // never the private half
      expect(run.stdout[0]).toMatch(
        /^jwt tenant=acme issuer=https:\/\/lessorctl.invalid\/jwt-dev audience=lessor-dev algorithm=ES256 role=authenticated kid=dev-[0-9a-f]{8} key_file=.lessor\/jwt-dev\/acme.json key=new$/,
      );
      const keySet = createLocalJWKSet(body?.jwks ?? { keys: [] });
      for (const [i, user] of ["alice", "bob"].entries()) {
        const line = run.stdout[i + 1] ?? "";
        expect(line).toMatch(
          new RegExp(
            `^token user=${user} variable=LESSOR_${user.toUpperCase()}_TOKEN expires_at=\\S+ token=\\S+$`,
          ),
        );
        const token = line.split(" token=")[1] ?? "";
        const { payload } = await jwtVerify(token, keySet, { issuer: devIssuer, audience: devAudience });
        expect(payload.sub).toBe(user);
      }
      // The private key stays on this machine, owner-only.
      expect(statSync(join(cwd, ".lessor/jwt-dev/acme.json")).mode & 0o777).toBe(0o600);

      // Again: the same key (tokens minted before keep working), the --export form for eval.
      const again = await jwtDev(["--user", "carol-2", "--export"], cwd);
      expect(again.bodies[0]?.jwks).toEqual(body?.jwks);
      expect(again.run.stdout).toEqual([expect.stringMatching(/^export LESSOR_CAROL_2_TOKEN='ey[\w.-]+'$/)]);
    } finally {
      rmSync(cwd, { recursive: true, force: true });
    }
  });

  it("refuses a Lessor that is not on this machine, and a user a token cannot name", async () => {
    const cwd = mkdtempSync(join(tmpdir(), "lessorctl-jwt-"));
    try {
      const remote = await jwtDev([], cwd, "https://lessor.example.com");
      expect(remote.run.code).toBe(1);
      expect(remote.bodies).toEqual([]);
      expect(remote.run.stderr[0]).toMatch(
        /^error code=not_local status=0 message="jwt dev only talks to a Lessor on this machine/,
      );
      const badUser = await jwtDev(["--user", "rm -rf"], cwd);
      expect(badUser.run.code).toBe(1);
      expect(badUser.run.stderr[0]).toContain("code=invalid_option");
    } finally {
      rmSync(cwd, { recursive: true, force: true });
    }
  });
});

describe("lessorctl tenants erase", () => {
  it("sends the confirmation (and force) and prints where the erase stands", async () => {
    const run = await lessorctl(["tenants", "erase", "acme", "--confirm", "acme", "--force"], {
      "DELETE /v1/tenants/acme": (request) => {
        const url = new URL(request.url);
        expect(Object.fromEntries(url.searchParams)).toEqual({ confirm: "acme", force: "true" });
        return Response.json(
          {
            state: "erasing",
            stage: "keys",
            startedAt: "2026-11-30T14:02:31.412Z",
            attempts: 0,
            lastError: null,
          },
          { status: 202 },
        );
      },
    });
    expect(run.code).toBe(0);
    expect(run.stdout).toEqual([
      "tenant=acme state=erasing stage=keys started_at=2026-11-30T14:02:31.412Z attempts=0 last_error=-",
    ]);
  });

  it("needs --confirm, and prints the API's refusal", async () => {
    const missing = await lessorctl(["tenants", "erase", "acme"], {});
    expect(missing.code).not.toBe(0);
    expect(missing.requests).toEqual([]);
    const refused = await lessorctl(["tenants", "erase", "acme", "--confirm", "acme"], {
      "DELETE /v1/tenants/acme": () =>
        Response.json(
          { code: "tenant_pinned", message: "The tenant is pinned; pass ?force=true to erase it anyway." },
          { status: 409 },
        ),
    });
    expect(refused.code).not.toBe(0);
    expect(refused.stderr.join("\n")).toContain("tenant_pinned");
  });

  it("erase-status prints the stage and last error, or when it committed", async () => {
    const running = await lessorctl(["tenants", "erase-status", "acme"], {
      "GET /v1/tenants/acme/erase": () => ({
        state: "erasing",
        stage: "database",
        startedAt: "2026-11-30T14:02:31.412Z",
        attempts: 2,
        lastError: "database: host unreachable",
      }),
    });
    expect(running.stdout).toEqual([
      'tenant=acme state=erasing stage=database started_at=2026-11-30T14:02:31.412Z attempts=2 last_error="database: host unreachable"',
    ]);
    const done = await lessorctl(["tenants", "erase-status", "acme"], {
      "GET /v1/tenants/acme/erase": () => ({ state: "erased", erasedAt: "2026-11-30T14:03:01.000Z" }),
    });
    expect(done.stdout).toEqual(["tenant=acme state=erased erased_at=2026-11-30T14:03:01.000Z"]);
  });
});

describe("lessorctl reseal", () => {
  const answer = (over: Record<string, unknown>) => ({
    currentKeyId: "k2",
    resealed: 0,
    skipped: 0,
    failed: [],
    remaining: 0,
    cursor: null,
    done: true,
    ...over,
  });

  it("follows the cursor until done, retries a 503, and exits 0 once nothing remains", async () => {
    const bodies: unknown[] = [];
    let calls = 0;
    const run = await lessorctl(["reseal", "--batch", "2"], {
      "POST /v1/credentials/reseal": async (request) => {
        bodies.push(await request.json());
        calls++;
        if (calls === 2) {
          return Response.json({ code: "control_plane_unavailable", message: "down" }, { status: 503 });
        }
        return calls === 1
          ? answer({ resealed: 2, remaining: 1, cursor: "acme", done: false })
          : answer({ resealed: 1, remaining: 0 });
      },
    });
    expect(run.stderr).toEqual([]);
    expect(run.code).toBe(0);
    expect(bodies).toEqual([
      { limit: 2, after: null, prefix: "" },
      { limit: 2, after: "acme", prefix: "" },
      { limit: 2, after: "acme", prefix: "" },
    ]);
    expect(run.stdout).toEqual([
      "reseal batch=1 resealed=2 skipped=0 failed=0 remaining=1 cursor=acme",
      "reseal batch=2 resealed=1 skipped=0 failed=0 remaining=0 cursor=-",
      "reseal_done resealed=3 skipped=0 failed=0 remaining=0 current_key=k2",
    ]);
  });

  it("lists what it could not open and exits 1; refuses a bad --batch", async () => {
    const run = await lessorctl(["reseal"], {
      "POST /v1/credentials/reseal": () =>
        answer({ failed: [{ tenantId: "acme", keyId: "k1", problem: "key_missing" }], remaining: 1 }),
    });
    expect(run.code).toBe(1);
    expect(run.stderr).toEqual(["reseal_failed tenant=acme key=k1 problem=key_missing"]);
    const bad = await lessorctl(["reseal", "--batch", "0"], {});
    expect(bad.code).toBe(1);
    expect(bad.requests).toEqual([]);
  });
});

describe("lessorctl help and output", () => {
  it("lists every command, and every command has help", async () => {
    const top = await lessorctl(["--help"], {});
    expect(top.code).toBe(0);
    for (const name of [
      "capacity",
      "evict",
      "status",
      "acquire",
      "release",
      "tenants",
      "campaign",
      "reseal",
      "jwt",
    ])
      expect(top.stdout.join("\n")).toMatch(new RegExp(`^  ${name}\\b`, "m"));
    const tenants = await lessorctl(["tenants", "--help"], {});
    for (const name of [
      "list",
      "search",
      "create",
      "key",
      "disable",
      "enable",
      "drain",
      "pin",
      "unpin",
      "events",
      "usage",
      "erase",
      "erase-status",
    ])
      expect(tenants.stdout.join("\n")).toMatch(new RegExp(`^  ${name}\\b`, "m"));
    const campaign = await lessorctl(["campaign", "--help"], {});
    for (const name of ["create", "list", "status", "pause", "resume", "cancel"])
      expect(campaign.stdout.join("\n")).toMatch(new RegExp(`^  ${name}\\b`, "m"));
    // The API says cancel; the old name still works but is listed only as an alias.
    expect(campaign.stdout.join("\n")).toMatch(/^ {2}cancel\|abort\b/m);
    const capacityHelp = await lessorctl(["capacity", "--help"], {});
    expect(capacityHelp.stdout.join("\n")).toContain("failed is not in the ledger");
  });

  it("quotes values that would break a key=value line, and writes durations as operators read them", () => {
    expect(formatValue("cancelled by the operator")).toBe('"cancelled by the operator"');
    expect(formatValue(null)).toBe("-");
    expect(formatValue(["a", "b"])).toBe("a,b");
    expect(kv("x", { a: 1, b: "two words" })).toBe('x a=1 b="two words"');
    expect([5_000, 43 * 60_000, 125 * 60_000, 3 * 86_400_000 + 3_600_000].map(formatDuration)).toEqual([
      "5s",
      "43m",
      "2h5m",
      "3d1h",
    ]);
  });
});

describe("lessorctl and regions", () => {
  it("tenants move asks the tenant's region to move it, prints the job, and move-status follows it", async () => {
    const moving = {
      state: "moving",
      from: "us",
      to: "eu",
      stage: "drain",
      startedAt: "2026-12-01T18:00:00.000Z",
      attempts: 0,
      lastError: null,
    };
    const run = await lessorctl(["--region", "us", "tenants", "move", "acme", "--to", "eu"], {
      "POST /v1/tenants/acme/move": () => Response.json(moving, { status: 202 }),
    });
    expect(run.code).toBe(0);
    expect(run.stdout).toEqual([
      "tenant=acme state=moving from=us to=eu stage=drain started_at=2026-12-01T18:00:00.000Z attempts=0 last_error=-",
    ]);
    const request = run.requests[0];
    expect(new URL(request?.url ?? "").searchParams.get("region")).toBe("us");
    expect(await request?.json()).toEqual({ region: "eu" });

    const done = await lessorctl(
      ["tenants", "move-status", "acme"],
      {
        "GET /v1/tenants/acme/move": () => ({
          state: "moved",
          from: "us",
          to: "eu",
          startedAt: "2026-12-01T18:00:00.000Z",
          movedAt: "2026-12-01T18:00:09.000Z",
        }),
      },
      { LESSOR_REGION: "us" },
    );
    expect(done.stdout).toEqual(["tenant=acme state=moved from=us to=eu moved_at=2026-12-01T18:00:09.000Z"]);
    expect(new URL(done.requests[0]?.url ?? "").searchParams.get("region")).toBe("us");
  });

  it("capacity asks the region named, and says on each host's first line which region it is", async () => {
    const run = await lessorctl(["--region", "eu", "capacity"], {
      "GET /v1/capacity": (request) => {
        expect(new URL(request.url).searchParams.get("region")).toBe("eu");
        return { region: "eu", hosts: [{ ...capacity, host: "eu-1" }], tunnels: [] };
      },
      "GET /v1/fleet/failing": () => ({ ...failing, byHost: { "eu-1": 1 } }),
    });
    expect(run.code).toBe(0);
    expect(run.stdout.filter((line) => line.startsWith("pools "))).toEqual([
      "pools host=eu-1 region=eu ready=8 starting=1 draining=1 failed=1",
    ]);
    expect(new URL(run.requests[1]?.url ?? "").searchParams.get("region")).toBe("eu");
    // A host of another region is not this region's: the message says which region was asked.
    const other = await lessorctl(["--region", "eu", "capacity", "--host", "local"], {
      "GET /v1/capacity": () => ({ region: "eu", hosts: [{ ...capacity, host: "eu-1" }], tunnels: [] }),
      "GET /v1/fleet/failing": () => failing,
    });
    expect(other.code).toBe(1);
    expect(other.stderr.join("\n")).toContain("region eu");
  });

  it("lists a region's tenants with a region column, and creates a tenant in a region", async () => {
    const list = await lessorctl(["--region", "eu", "tenants", "list"], {
      "GET /v1/tenants": () => ({
        region: "eu",
        tenants: [
          {
            id: "acme",
            status: "active",
            tier: "standard",
            host: "eu-1",
            schemaVersion: 3,
            createdAt: "2026-12-01T18:00:00.000Z",
          },
        ],
        nextCursor: null,
      }),
    });
    expect(list.stdout).toEqual([
      "tenant=acme region=eu status=active tier=standard host=eu-1 schema_version=3 created_at=2026-12-01T18:00:00.000Z",
    ]);
    const created = await lessorctl(["tenants", "create", "acme", "--in", "eu", "--connection-string"], {
      "POST /v1/tenants": () =>
        Response.json({ tenant: {}, key: "lsk_x", connectionString: "postgres://x" }, { status: 201 }),
    });
    expect(await created.requests[0]?.json()).toEqual({ id: "acme", region: "eu" });
  });
});
