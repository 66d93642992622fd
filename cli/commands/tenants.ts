/** `lessorctl tenants …`: the catalog and each tenant's operator actions. */
import type { Command } from "commander";
import type { TenantRuntimeStatus } from "../../src/rpc/tenant.ts";
import type { CommandContext } from "../context.ts";
import { kv } from "../output.ts";
import type { PublicTenant } from "./tenant.ts";

interface Usage {
  queries: number;
  rowsReturned: number;
  errors: number;
  leaseMs: number;
  poolStarts: number;
}

function tenantLine(t: PublicTenant, region?: string): string {
  return kv("", {
    tenant: t.id,
    ...(t.region !== undefined || region !== undefined ? { region: t.region ?? region } : {}),
    status: t.status,
    tier: t.tier,
    host: t.host,
    schema_version: t.schemaVersion,
    created_at: t.createdAt,
  });
}

function runtimeLine(id: string, r: TenantRuntimeStatus): string {
  return kv("", {
    tenant: id,
    generation: r.generation,
    state: r.state,
    leases: r.leases,
    sessions: r.sessions,
    pinned: r.pinned,
    migrating: r.migrating,
    drain_overdue: r.drain?.overdue ?? null,
    held_leases: r.drain?.heldLeases.length ?? null,
  });
}

function usageFields(u: Usage) {
  return {
    queries: u.queries,
    rows_returned: u.rowsReturned,
    errors: u.errors,
    lease_ms: u.leaseMs,
    pool_starts: u.poolStarts,
  };
}

/** `POST /v1/tenants/:id/move` and `GET /v1/tenants/:id/move`. */
interface MoveView {
  state: "moving" | "moved";
  from: string;
  to: string;
  stage?: string;
  startedAt: string;
  attempts?: number;
  lastError?: string | null;
  movedAt?: string;
}

function moveLine(tenantId: string, m: MoveView): string {
  return m.state === "moved"
    ? kv("", { tenant: tenantId, state: m.state, from: m.from, to: m.to, moved_at: m.movedAt })
    : kv("", {
        tenant: tenantId,
        state: m.state,
        from: m.from,
        to: m.to,
        stage: m.stage,
        started_at: m.startedAt,
        attempts: m.attempts,
        last_error: m.lastError ?? "-",
      });
}

/** `DELETE /v1/tenants/:id` and `GET /v1/tenants/:id/erase`. */
interface EraseView {
  state: "erasing" | "erased";
  stage?: string;
  startedAt?: string;
  attempts?: number;
  lastError?: string | null;
  erasedAt?: string;
}

function eraseLine(tenantId: string, e: EraseView): string {
  return e.state === "erased"
    ? kv("", { tenant: tenantId, state: e.state, erased_at: e.erasedAt })
    : kv("", {
        tenant: tenantId,
        state: e.state,
        stage: e.stage,
        started_at: e.startedAt,
        attempts: e.attempts,
        last_error: e.lastError ?? null,
      });
}

const pageOptions = (command: Command) =>
  command
    .option("--limit <n>", "page size, 1 to 200", "50")
    .option("--cursor <cursor>", "the next_cursor of the previous page");

function pageQuery(options: { limit: string; cursor?: string }): string {
  const query = new URLSearchParams({ limit: options.limit });
  if (options.cursor !== undefined) query.set("cursor", options.cursor);
  return query.toString();
}

export function register(program: Command, ctx: CommandContext): void {
  const tenants = program
    .command("tenants")
    .description(
      "the tenant catalog: list, search, create, key, disable/enable, drain, pin/unpin, events, usage, erase, move",
    );
  const id = (tenantId: string) => encodeURIComponent(tenantId);

  pageOptions(
    tenants.command("list").description("one page of the catalog, by id (next_cursor=… if more)"),
  ).action(async (options: { limit: string; cursor?: string }, command: Command) => {
    const answer = await ctx
      .client(command)
      .call<{ region?: string; tenants: PublicTenant[]; nextCursor: string | null }>(
        "GET",
        `/v1/tenants?${pageQuery(options)}`,
      );
    ctx.print(command, answer, () => {
      for (const t of answer.tenants) ctx.out.line(tenantLine(t, answer.region));
      if (answer.nextCursor !== null) ctx.out.line(kv("", { next_cursor: answer.nextCursor }));
    });
  });

  tenants
    .command("search")
    .description("tenants whose id starts with a prefix (at most --limit, 1 to 50)")
    .argument("<prefix>", "start of a tenant id")
    .option("--limit <n>", "at most this many", "20")
    .action(async (prefix: string, options: { limit: string }, command: Command) => {
      const query = new URLSearchParams({ q: prefix, limit: options.limit });
      const answer = await ctx
        .client(command)
        .call<{ tenants: PublicTenant[] }>("GET", `/v1/fleet/tenants?${query}`);
      ctx.print(command, answer, () => {
        for (const t of answer.tenants) ctx.out.line(tenantLine(t));
      });
    });

  tenants
    .command("create")
    .description(
      "provision a tenant; prints its key and connection string once (send again to resume a failed create)",
    )
    .argument("<tenant>", "tenant id: 1-40 lowercase letters, digits, inner hyphens")
    .option("--tier <tier>", "pool size tier (LESSOR_POOL_SIZES; default: standard)")
    .option(
      "--host <host>",
      "database host (LESSOR_HOSTS; default: the host of its region with the most room, among LESSOR_PLACEMENT_HOSTS)",
    )
    .option(
      "--in <region>",
      "the region the tenant lives in (LESSOR_REGIONS; default: the host's, or the default region)",
    )
    .option("--connection-string", "print only the connection string (for $(…))")
    .addHelpText(
      "after",
      `
Output:
  tenant=acme status=active tier=standard host=local schema_version=3 created_at=…
    key=lsk_… connection_string=postgres://acme:lsk_…@127.0.0.1:8787/acme   (one line)

  The key is shown this once. For a tenant that exists (409 tenant_exists), mint another key:
    npx lessorctl tenants key acme --connection-string`,
    )
    .action(
      async (
        tenantId: string,
        options: { tier?: string; host?: string; in?: string; connectionString?: boolean },
        command: Command,
      ) => {
        const { connectionString: only, in: region, ...placement } = options;
        const answer = await ctx
          .client(command)
          .call<{ tenant: PublicTenant; key: string; connectionString: string }>("POST", "/v1/tenants", {
            body: { id: tenantId, ...placement, ...(region === undefined ? {} : { region }) },
          });
        if (only === true) return ctx.out.line(answer.connectionString);
        ctx.print(command, answer, () =>
          ctx.out.line(
            `${tenantLine(answer.tenant)} ${kv("", { key: answer.key, connection_string: answer.connectionString })}`,
          ),
        );
      },
    );

  tenants
    .command("key")
    .description(
      "mint another key for a tenant (shown once), with its connection string; the old keys keep working",
    )
    .argument("<tenant>", "tenant id")
    .option(
      "--scope <scope>",
      "full (the tenant role, every route) or jwt (an end-user key: /sql with a token)",
      "full",
    )
    .option("--expires-at <time>", "ISO 8601 time the key stops working (default: never)")
    .option("--connection-string", "print only the connection string (for $(…))")
    .addHelpText(
      "after",
      `
Output:
  tenant=acme key_id=k_0123456789abcdef scope=full expires_at=- key=lsk_…
    connection_string=postgres://acme:lsk_…@127.0.0.1:8787/acme   (one line)

  At most LESSOR_MAX_KEYS_PER_TENANT usable keys (409 key_limit): revoke one first with
  DELETE /v1/tenants/<tenant>/keys/<key_id>.`,
    )
    .action(
      async (
        tenantId: string,
        options: { scope: string; expiresAt?: string; connectionString?: boolean },
        command: Command,
      ) => {
        const answer = await ctx.client(command).call<{
          keyId: string;
          key: string;
          scope: string;
          expiresAt: string | null;
          connectionString: string;
        }>("POST", `/v1/tenants/${id(tenantId)}/keys`, {
          body: {
            scope: options.scope,
            ...(options.expiresAt === undefined ? {} : { expiresAt: options.expiresAt }),
          },
        });
        if (options.connectionString === true) return ctx.out.line(answer.connectionString);
        ctx.print(command, answer, () =>
          ctx.out.line(
            kv("", {
              tenant: tenantId,
              key_id: answer.keyId,
              scope: answer.scope,
              expires_at: answer.expiresAt,
              key: answer.key,
              connection_string: answer.connectionString,
            }),
          ),
        );
      },
    );

  for (const action of ["disable", "enable"] as const) {
    tenants
      .command(action)
      .description(
        action === "disable"
          ? "refuse the tenant's requests with 423 tenant_disabled"
          : "let a disabled tenant's requests through again",
      )
      .argument("<tenant>", "tenant id")
      .action(async (tenantId: string, _options: unknown, command: Command) => {
        const answer = await ctx
          .client(command)
          .call<{ tenant: PublicTenant }>("POST", `/v1/tenants/${id(tenantId)}/${action}`);
        ctx.print(command, answer, () => ctx.out.line(tenantLine(answer.tenant)));
      });
  }

  tenants
    .command("drain")
    .description(
      "drain the pool: no new leases, stop when leases reach zero (held leases are reported, not killed)",
    )
    .argument("<tenant>", "tenant id")
    .option("--force", "end leases held past LESSOR_MAX_DRAIN_MS (their transactions roll back)")
    .action(async (tenantId: string, options: { force?: boolean }, command: Command) => {
      const answer = await ctx
        .client(command)
        .call<{ runtime: TenantRuntimeStatus }>("POST", `/v1/tenants/${id(tenantId)}/drain`, {
          body: { force: options.force === true },
        });
      ctx.print(command, answer, () => ctx.out.line(runtimeLine(tenantId, answer.runtime)));
    });

  for (const action of ["pin", "unpin"] as const) {
    tenants
      .command(action)
      .description(
        action === "pin" ? "never evict the tenant's pool" : "let the budget evict the pool when idle again",
      )
      .argument("<tenant>", "tenant id")
      .action(async (tenantId: string, _options: unknown, command: Command) => {
        const answer = await ctx
          .client(command)
          .call<{ runtime: TenantRuntimeStatus }>("POST", `/v1/tenants/${id(tenantId)}/${action}`);
        ctx.print(command, answer, () => ctx.out.line(runtimeLine(tenantId, answer.runtime)));
      });
  }

  tenants
    .command("erase")
    .description(
      "erase the tenant: everything Lessor and its host hold for it, as a resumable job (docs/erase.md)",
    )
    .argument("<tenant>", "tenant id")
    .requiredOption("--confirm <tenant>", "the same tenant id again: an erase cannot be undone")
    .option("--force", "erase a pinned tenant too")
    .addHelpText(
      "after",
      `
Output:
  tenant=acme state=erasing stage=keys started_at=2026-11-30T14:02:31.412Z attempts=0 last_error=-

  The answer comes once the tenant's gate is closed (its new requests get 503 tenant_erasing); the
  stages run on. Follow them with: lessorctl tenants erase-status <tenant>.`,
    )
    .action(async (tenantId: string, options: { confirm: string; force?: boolean }, command: Command) => {
      const query = new URLSearchParams({ confirm: options.confirm });
      if (options.force === true) query.set("force", "true");
      const answer = await ctx
        .client(command)
        .call<EraseView>("DELETE", `/v1/tenants/${id(tenantId)}?${query.toString()}`);
      ctx.print(command, answer, () => ctx.out.line(eraseLine(tenantId, answer)));
    });

  tenants
    .command("move")
    .description(
      "move the tenant to another region, as a resumable, audited job (fence, drain, copy, switch, start, cleanup); its database stays on its host",
    )
    .argument("<tenant>", "tenant id")
    .requiredOption("--to <region>", "the region to move it to")
    .option("--force", "move a pinned tenant too")
    .addHelpText(
      "after",
      `
The tenant is in the region --region names (default: the default region).

Output:
  tenant=acme state=moving from=us to=eu stage=drain started_at=2026-12-01T18:02:31.412Z attempts=0 last_error=-

  The answer comes once the fence is closed (new requests get 503 tenant_moving until the switch);
  the stages run on. Follow them with: lessorctl tenants move-status <tenant>.`,
    )
    .action(async (tenantId: string, options: { to: string; force?: boolean }, command: Command) => {
      const answer = await ctx.client(command).call<MoveView>("POST", `/v1/tenants/${id(tenantId)}/move`, {
        body: { region: options.to, ...(options.force === true ? { force: true } : {}) },
      });
      ctx.print(command, answer, () => ctx.out.line(moveLine(tenantId, answer)));
    });

  tenants
    .command("move-status")
    .description(
      "where the tenant's move out of --region stands: its stage, attempts and last error, or when it was done",
    )
    .argument("<tenant>", "tenant id")
    .action(async (tenantId: string, _options: unknown, command: Command) => {
      const answer = await ctx.client(command).call<MoveView>("GET", `/v1/tenants/${id(tenantId)}/move`);
      ctx.print(command, answer, () => ctx.out.line(moveLine(tenantId, answer)));
    });

  tenants
    .command("erase-status")
    .description("where the tenant's erase stands: its stage, attempts and last error, or when it committed")
    .argument("<tenant>", "tenant id")
    .action(async (tenantId: string, _options: unknown, command: Command) => {
      const answer = await ctx.client(command).call<EraseView>("GET", `/v1/tenants/${id(tenantId)}/erase`);
      ctx.print(command, answer, () => ctx.out.line(eraseLine(tenantId, answer)));
    });

  pageOptions(
    tenants
      .command("events")
      .description("the tenant's lifecycle events, newest first: seq, generation, from, to, reason, at")
      .argument("<tenant>", "tenant id"),
  ).action(async (tenantId: string, options: { limit: string; cursor?: string }, command: Command) => {
    const answer = await ctx.client(command).call<{
      events: { seq: number; generation: number; from: string; to: string; reason: string; at: string }[];
      nextCursor: string | null;
    }>("GET", `/v1/tenants/${id(tenantId)}/events?${pageQuery(options)}`);
    ctx.print(command, answer, () => {
      for (const e of answer.events) ctx.out.line(kv("", { tenant: tenantId, ...e }));
      if (answer.nextCursor !== null) ctx.out.line(kv("", { next_cursor: answer.nextCursor }));
    });
  });

  tenants
    .command("usage")
    .description("exact usage of one tenant, or of the whole fleet without a tenant")
    .argument("[tenant]", "tenant id (omit for fleet totals)")
    .action(async (tenantId: string | undefined, _options: unknown, command: Command) => {
      const client = ctx.client(command);
      if (tenantId === undefined) {
        const fleet = await client.call<{
          tenantsWithUsage: number;
          usage: Usage;
          unfoldedDeltas: number;
          asOf: string;
        }>("GET", "/v1/usage");
        ctx.print(command, fleet, () =>
          ctx.out.line(
            kv("fleet", {
              tenants_with_usage: fleet.tenantsWithUsage,
              ...usageFields(fleet.usage),
              unfolded_deltas: fleet.unfoldedDeltas,
              as_of: fleet.asOf,
            }),
          ),
        );
        return;
      }
      const usage = await client.call<{
        tenantId: string;
        usage: Usage;
        unfoldedDeltas: number;
        asOf: string;
      }>("GET", `/v1/tenants/${id(tenantId)}/usage`);
      ctx.print(command, usage, () =>
        ctx.out.line(
          kv("", {
            tenant: usage.tenantId,
            ...usageFields(usage.usage),
            unfolded_deltas: usage.unfoldedDeltas,
            as_of: usage.asOf,
          }),
        ),
      );
    });
}
