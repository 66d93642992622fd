/** `lessorctl status`, `acquire` and `release`: one tenant's runtime, and a debugging session lease. */
import type { Command } from "commander";
import type { TenantRuntimeStatus } from "../../src/rpc/tenant.ts";
import type { CommandContext } from "../context.ts";
import { kv } from "../output.ts";

/** The catalog half of `GET /v1/tenants/:id`, as lessorctl reads it. */
export interface PublicTenant {
  /** The tenant's region (answers that name one: a create, a read). */
  region?: string;
  id: string;
  status: string;
  tier: string;
  host: string;
  schemaVersion?: number;
  createdAt?: string;
}

/** `tenant=… generation=… state=… …`: the line `status` prints. */
export function statusLine(tenant: PublicTenant, runtime: TenantRuntimeStatus): string {
  return kv("", {
    tenant: tenant.id,
    generation: runtime.generation,
    state: runtime.state,
    // The pool's size now, or (no pool open) what a start reserves.
    pool_size: runtime.pool ? (runtime.pool.size ?? runtime.pool.start) : runtime.poolSize,
    pool_floor: runtime.pool?.floor,
    pool_max: runtime.pool?.max ?? runtime.poolSize,
    peak: runtime.pool?.observed?.peak ?? runtime.pool?.lastObserved?.peak,
    adaptive: runtime.pool ? runtime.pool.adaptive : undefined,
    leases: runtime.leases,
    sessions: runtime.sessions,
    schema_version: runtime.schemaVersion ?? tenant.schemaVersion,
    last_used: runtime.lastUsedAt,
    failure: runtime.failureReason,
    retry_at: runtime.retryAt,
    status: tenant.status,
    tier: tenant.tier,
    host: tenant.host,
    pinned: runtime.pinned,
    migrating: runtime.migrating,
  });
}

export function register(program: Command, ctx: CommandContext): void {
  program
    .command("status")
    .description(
      "one tenant's pool: generation, state, leases, sessions, schema version, failure and retry time",
    )
    .argument("<tenant>", "tenant id")
    .addHelpText(
      "after",
      `
Output:
  tenant=acme generation=8 state=ready pool_size=3 pool_floor=1 pool_max=6 peak=2 adaptive=true
    leases=1 sessions=0 schema_version=3
    last_used=2026-11-30T14:02:31.412Z failure=- retry_at=- status=active tier=standard host=local
    pinned=false migrating=false   (one line)

  pool_size is the pool's size now (its allowance on the host), between pool_floor and pool_max;
  peak is the most leases in use at once in the current window (adaptive hosts; on a fixed host
  the size is the tier's, floor = max = size). failure and retry_at are set while the pool is
  failed (see docs/troubleshooting.md). With
  --json, the whole answer of GET /v1/tenants/:id, including drain progress.`,
    )
    .action(async (tenantId: string, _options: unknown, command: Command) => {
      const answer = await ctx
        .client(command)
        .call<{ tenant: PublicTenant; runtime: TenantRuntimeStatus }>(
          "GET",
          `/v1/tenants/${encodeURIComponent(tenantId)}`,
        );
      ctx.print(command, answer, () => ctx.out.line(statusLine(answer.tenant, answer.runtime)));
    });

  program
    .command("acquire")
    .description("open a session lease on the tenant's pool with the tenant's key (for debugging)")
    .argument("<tenant>", "tenant id")
    .requiredOption("--key <tenant-key>", "the tenant's key (lsk_…), as POST /v1/tenants returned it")
    .option("--ttl <ms>", "lease TTL in milliseconds, renewed by each use", "30000")
    .addHelpText(
      "after",
      `
Output:
  tenant=acme generation=8 state=ready lease=lsl_acme_… expires_at=2026-11-30T14:03:01.412Z

  The lease pins one connection of the pool (the pool cannot be drained, migrated or evicted
  while it is held). End it with: lessorctl release <lease> --key <tenant-key>.`,
    )
    .action(async (tenantId: string, options: { key: string; ttl: string }, command: Command) => {
      const answer = await ctx
        .client(command)
        .call<{ lease: string; generation: number; expiresAt: string }>(
          "POST",
          `/v1/tenants/${encodeURIComponent(tenantId)}/leases`,
          { key: options.key, body: { ttlMs: Number(options.ttl) } },
        );
      ctx.print(command, { tenant: tenantId, state: "ready", ...answer }, () =>
        ctx.out.line(
          kv("", {
            tenant: tenantId,
            generation: answer.generation,
            state: "ready",
            lease: answer.lease,
            expires_at: answer.expiresAt,
          }),
        ),
      );
    });

  program
    .command("release")
    .description("end a session lease: rolls back anything open and returns its connection")
    .argument("<lease>", "the lease token (lsl_…) acquire printed")
    .requiredOption("--key <tenant-key>", "the key of the tenant that holds the lease")
    .action(async (lease: string, options: { key: string }, command: Command) => {
      await ctx
        .client(command)
        .call("DELETE", `/v1/leases/${encodeURIComponent(lease)}`, { key: options.key });
      ctx.print(command, { lease, released: true }, () => ctx.out.line(kv("", { lease, released: true })));
    });
}
