/**
 * `lessorctl capacity` and `lessorctl evict --dry-run`: each host's budget (and each customer
 * tunnel's, beside them), and what an admission would evict.
 */
import { type Command, Option } from "commander";
import type { HostReport } from "../../src/core/host-capabilities.ts";
import type { CapacityStatus, EvictionReport, TunnelStatus } from "../../src/rpc/budget.ts";
import { ApiError } from "../client.ts";
import type { CommandContext } from "../context.ts";
import { formatDuration, kv } from "../output.ts";

interface FailingAnswer {
  windowSeconds: number;
  count: number;
  byHost: Record<string, number>;
}

/**
 * Capacity lines of one host: the seed's three lines, then one line per eviction candidate. A
 * customer's tunnel (docs/customer-databases.md) prints the same lines under `tunnel=<name>`, and its
 * health where a host prints its capabilities. The first line names the region the answer is of.
 */
export function capacityLines(
  status: CapacityStatus & { connection?: { path: string; sslmode: string } },
  failed: number | null,
  region?: string,
): string[] {
  const connection = status.connection;
  const tunnel = status.tunnel ?? null;
  return [
    kv("pools", {
      ...(tunnel ? { tunnel: tunnel.name } : { host: status.host }),
      ...(region === undefined ? {} : { region }),
      ready: status.pools.allocated,
      starting: status.pools.reserved,
      draining: status.pools.draining,
      failed: failed ?? "unknown",
    }),
    kv("connections", {
      allocated: status.allocated,
      budget: status.budget,
      pool_capacity: status.poolCapacity,
      startup_reserved: status.reserved,
      waiters: status.waiters,
      draining: status.draining,
      reserve: status.reserve,
      leases: status.leases,
    }),
    // The host's room in tenants (databases and roles against its limits), when the catalog answered.
    ...(status.tenancy
      ? [
          kv("tenancy", {
            tenants: status.tenancy.tenants,
            jwt_tenants: status.tenancy.jwtTenants,
            databases: `${status.tenancy.databases.used}/${status.tenancy.databases.limit ?? "unlimited"}`,
            roles: `${status.tenancy.roles.used}/${status.tenancy.roles.limit ?? "unlimited"}`,
            tenants_left: status.tenancy.tenantsLeft ?? "unlimited",
          }),
        ]
      : []),
    // A host's pools by use (adaptive admission); a tunnel's pools keep their size.
    ...(tunnel ? [] : [pooledLine(status)]),
    kv("maintenance", {
      in_use: status.maintenance?.inUse ?? 0,
      reserve: status.reserve,
      waiting: status.maintenance?.waiting ?? 0,
    }),
    ...(tunnel ? [tunnelLine(tunnel)] : hostLines(status.capabilities ?? null)),
    // How the host is reached (docs/adr/027): tcp with verify-full, or what is weaker, said plainly.
    ...(connection ? [kv("connection", { path: connection.path, sslmode: connection.sslmode })] : []),
    ...status.candidates.map((c) =>
      kv("", {
        eviction_candidate: c.tenantId,
        idle: formatDuration(c.idleMs),
        leases: c.leases,
        pinned: c.pinned,
        generation: c.generation,
        size: c.size,
      }),
    ),
  ];
}

/** A host's pooled connections by use, and what adaptive admission did on it. */
function pooledLine(status: CapacityStatus): string {
  return kv("pooled", {
    adaptive: status.adaptive?.enabled ? "on" : "off",
    in_use: status.pooled?.inUse ?? 0,
    idle: status.pooled?.idle ?? 0,
    grown: status.pooled?.grown ?? 0,
    shrunk: status.pooled?.shrunk ?? 0,
    growths: status.adaptive?.growths ?? 0,
    growths_refused: status.adaptive?.growthsRefused ?? 0,
    shrinks: status.adaptive?.shrinks ?? 0,
    reclaim_shrinks: status.adaptive?.reclaimShrinks ?? 0,
    evictions: status.evictions,
  });
}

/**
 * The host's kind and what its admin role can do, as last probed: a line, then one per missing
 * capability (with the provider's remedy) and per warning.
 */
function hostLines(report: HostReport | null): string[] {
  if (report === null)
    return [kv("capabilities", { probed: "never", note: "probed on the next admin connection" })];
  const { facts, verdict } = report;
  return [
    kv("capabilities", {
      kind: report.kind,
      fit: verdict.fit,
      containment: verdict.containment,
      passwords: verdict.passwordMode,
      event_triggers: facts.eventTriggers,
      server: Math.floor(facts.serverVersionNum / 10_000),
      admin: facts.role,
      probed: new Date(report.probedAt).toISOString(),
    }),
    ...verdict.missing.map((m) => kv("", { missing: m.capability, remedy: m.remedy })),
    ...verdict.warnings.map((w) => kv("", { warning: w })),
  ];
}

/** A tunnel's health: up, or slow or down since its last failed connect, and its breaker. */
function tunnelLine(tunnel: TunnelStatus): string {
  return kv("tunnel", {
    health: tunnel.health,
    breaker: tunnel.breaker,
    failures_slow: tunnel.failures.slow,
    failures_down: tunnel.failures.down,
    refused_by_breaker: tunnel.refusedByBreaker,
    last_failure: tunnel.lastFailureAt ?? "-",
  });
}

/** Lines of one host's eviction dry run. */
export function evictionLines(report: EvictionReport, region?: string): string[] {
  const lines = [
    kv("evict_dry_run", {
      host: report.host,
      ...(region === undefined ? {} : { region }),
      size: report.size,
      outcome: report.outcome,
      used: report.used,
      pool_capacity: report.poolCapacity,
      draining: report.draining,
      waiters: report.waiters,
    }),
  ];
  for (const p of report.pools) {
    const facts = {
      tenant: p.tenantId,
      generation: p.generation,
      size: p.size,
      idle: formatDuration(p.idleMs),
    };
    if (p.verdict === "shrink") lines.push(kv("shrink", { order: p.order, ...facts, take: p.take }));
    else if (p.verdict === "evict") lines.push(kv("evict", { order: p.order, ...facts }));
    else if (p.verdict === "eligible_not_needed") lines.push(kv("eligible_not_needed", facts));
    else lines.push(kv("not_eligible", { ...facts, reason: p.reason, leases: p.leases }));
  }
  return lines;
}

export function register(program: Command, ctx: CommandContext): void {
  program
    .command("capacity")
    .description(
      "each host's budget, and each customer tunnel's beside them: pools by state, connections held, waiters and eviction candidates",
    )
    .option("--host <host>", "only this host")
    .option("--tunnel <tunnel>", "only this customer tunnel")
    .addHelpText(
      "after",
      `
Output, per host:
  pools host=local region=default ready=8 starting=1 draining=1 failed=2
  connections allocated=45 budget=54 pool_capacity=50 startup_reserved=5 waiters=3 draining=5 reserve=4 leases=7
  pooled adaptive=on in_use=7 idle=38 grown=4 shrunk=11 growths=9 growths_refused=1 shrinks=6 reclaim_shrinks=5 evictions=16
  maintenance in_use=1 reserve=4 waiting=0
  capabilities kind=neon fit=true containment=full passwords=plaintext-over-tls event_triggers=direct server=17 …
  warning="…"   (what the host allows that is weaker than ideal; missing=… remedy=… if it cannot run Lessor)
  connection path=tcp sslmode=verify-full   (docs/adr/027: tcp for postgres hosts, websocket for neon ones)
  eviction_candidate=t-099 idle=43m leases=0 pinned=false generation=4 size=5   (up to 5, least recently used first)

  pooled: allocated pools' connections in use (leases, as last reported) against idle; connections
  grown past and shrunk below pools' start sizes now; and since the ledger was created, connections
  added by growths, growths refused, connections pools gave back on their own (shrinks) and taken
  back for a waiting start or growth (reclaim_shrinks), pools evicted (adaptive admission:
  docs/capacity.md).

Then per customer tunnel (LESSOR_TUNNELS), the same three lines apart from every host:
  pools tunnel=acme-net region=default ready=1 starting=0 draining=0 failed=0
  connections allocated=2 budget=8 pool_capacity=7 startup_reserved=0 waiters=0 draining=0 reserve=1 leases=1
  maintenance in_use=0 reserve=1 waiting=0
  tunnel health=up breaker=closed failures_slow=0 failures_down=0 refused_by_breaker=0 last_failure=-

  budget is the tunnel's capacity, pool_capacity that minus its reserve; leases are those held
  through the tunnel.
  health is up, or slow (a connect timed out) or down (refused or cut) since the last failure;
  breaker=open refuses the tunnel's starts at once with 503 tunnel_unavailable until it cools down.

  region is the region asked (--region; the default region without it): only its hosts are
  listed, and customer tunnels only with the default region, whose tenants they serve.
  ready/starting/draining and the connections come from the host's BudgetObject ledger;
  budget is the host's connections (LESSOR_BUDGETS), as in GET /v1/capacity and on the status page;
  reserve is the part of it kept for maintenance; pool_capacity is budget minus reserve (what pools
  may hold: allocated, startup_reserved and draining count against it).
  failed is not in the ledger (a failed pool holds no capacity): it counts tenants whose latest
  lifecycle event in the last 24 h moved them to failed, from the control plane ("unknown" if the
  control plane is unreachable).`,
    )
    .action(async (options: { host?: string; tunnel?: string }, command: Command) => {
      const client = ctx.client(command);
      const answer = await client.call<{
        region?: string;
        hosts: CapacityStatus[];
        tunnels?: CapacityStatus[];
      }>("GET", "/v1/capacity");
      const hosts = options.tunnel !== undefined ? [] : answer.hosts;
      const tunnels = options.host !== undefined ? [] : (answer.tunnels ?? []);
      const shownHosts = options.host === undefined ? hosts : hosts.filter((h) => h.host === options.host);
      const shownTunnels =
        options.tunnel === undefined ? tunnels : tunnels.filter((t) => t.tunnel?.name === options.tunnel);
      const inRegion =
        answer.region === undefined ? "" : ` in region ${answer.region} (--region names another)`;
      if (options.host !== undefined && shownHosts.length === 0)
        throw new ApiError("unknown_host", `No database host with that name is configured${inRegion}.`, 400);
      if (options.tunnel !== undefined && shownTunnels.length === 0)
        throw new ApiError(
          "unknown_tunnel",
          `No tunnel with that name is configured (LESSOR_TUNNELS)${inRegion}.`,
          400,
        );
      const shown = [...shownHosts, ...shownTunnels];
      let failing: FailingAnswer | null = null;
      try {
        failing = await client.call<FailingAnswer>("GET", "/v1/fleet/failing?limit=1");
      } catch (error) {
        if (!(error instanceof ApiError) || error.status < 500) throw error;
      }
      ctx.print(command, { region: answer.region, hosts: shownHosts, tunnels: shownTunnels, failing }, () => {
        for (const status of shown) {
          const failed = failing ? (failing.byHost[status.host] ?? 0) : null;
          for (const line of capacityLines(status, failed, answer.region)) ctx.out.line(line);
        }
      });
    });

  program
    .command("evict")
    .description("which pools an admission would evict now, in order, and why every other pool is spared")
    .addOption(
      new Option(
        "--dry-run",
        "report only (required: Lessor evicts only to admit a start)",
      ).makeOptionMandatory(),
    )
    .option("--host <host>", "only this host")
    .option("--tier <tier>", "size the admission as a pool of this tier (default: the default tier)")
    .option("--size <connections>", "size the admission in connections instead of a tier")
    .addHelpText(
      "after",
      `
Output, per host:
  evict_dry_run host=local region=default size=5 outcome=evicts used=56 pool_capacity=56 draining=0 waiters=0
  evict order=1 tenant=t-099 generation=4 size=5 idle=43m
  eligible_not_needed tenant=t-120 generation=2 size=5 idle=12m
  not_eligible tenant=t-007 generation=9 size=5 idle=- reason=leased leases=2

  shrink order=1 tenant=t-042 generation=3 size=6 idle=- take=4   (adaptive hosts: idle connections taken back)

  outcome: fits (no eviction needed), shrinks (taking idle connections back from adaptive pools makes
  room), evicts (with the evict lines, they make room; shrinks come first), saturated (evicting every
  eligible pool would not: the start would wait, then get 503 capacity_saturated).
  reason: starting, draining, pinned, migrating, leased, or not_idle (in use, no idle time reported).
  Nothing is evicted: this reads the ledger with the same functions a real admission uses.`,
    )
    .action(async (options: { host?: string; tier?: string; size?: string }, command: Command) => {
      const query = new URLSearchParams();
      if (options.host !== undefined) query.set("host", options.host);
      if (options.tier !== undefined) query.set("tier", options.tier);
      if (options.size !== undefined) query.set("size", options.size);
      const answer = await ctx
        .client(command)
        .call<{ region?: string; hosts: EvictionReport[] }>(
          "GET",
          `/v1/capacity/evictions?${query.toString()}`,
        );
      ctx.print(command, answer, () => {
        for (const report of answer.hosts)
          for (const line of evictionLines(report, answer.region)) ctx.out.line(line);
      });
    });
}
