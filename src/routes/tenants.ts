/** Operator endpoints for the tenant catalog (admin key). */
import { and, asc, eq, gt, inArray, sql } from "drizzle-orm";
import { Hono } from "hono";
import * as v from "valibot";
import { type AuditAction, writeAudit } from "../audit/index.ts";
import { type LessorConfig, loadConfig, regionNamed } from "../config/index.ts";
import {
  type ControlPlane,
  credentialSetAt,
  listLifecycleEvents,
  loadTenantRecord,
  withControlPlane,
} from "../control-plane/index.ts";
import { adoptedDatabases, tenants } from "../control-plane/schema.ts";
import { type AdoptionReport, credentialPolicies, isCustomerRoleName } from "../core/adoption.ts";
import { tenantFootprint } from "../core/host-room.ts";
import { parseTenantId, type TenantId } from "../core/tenant-id.ts";
import { loadEraseOf } from "../erase/store.ts";
import { LessorError } from "../errors/index.ts";
import { tenantObject } from "../placement/index.ts";
import { placeByRoom } from "../placement/room.ts";
import { attachTenant } from "../provisioning/attach.ts";
import { provisionTenant, publicTenant } from "../provisioning/index.ts";
import type { AdoptedPlacement } from "../rpc/tenant.ts";
import { requireAdmin } from "./auth.ts";
import { type AppContext, type AppEnv, regionParam } from "./context.ts";
import {
  badCursor,
  integerCursor,
  jsonBody,
  jsonObject,
  pageLimit,
  query,
  tenantIdSchema,
} from "./validation.ts";

export const tenantRoutes = new Hono<AppEnv>();

// Every route here is the operator's: the admin key is checked per route (not by a wildcard), so
// tenant-key routes under /v1/tenants/:id/… (leases, usage) stay reachable with a tenant key.

/** Validates the `:id` path segment before anything (an object, a catalog read) is derived from it. */
function tenantParam(c: AppContext): TenantId {
  const id = parseTenantId(c.req.param("id"));
  if (!id) throw new LessorError("invalid_tenant_id");
  return id;
}

/**
 * `attach`: the tenant's database is a customer's, reached through a named tunnel with a credential
 * the customer issued (docs/customer-databases.md), instead of one Lessor creates on a host.
 */
const attachBody = v.object({
  tunnel: v.string("attach.tunnel must name a tunnel (LESSOR_TUNNELS)."),
  url: v.string("attach.url must be postgres://user:password@host:port/database."),
  credentials: v.optional(
    v.picklist(credentialPolicies, 'attach.credentials must be "customer" or "lessor".'),
    "customer",
  ),
});

const createTenantBody = jsonObject({
  id: tenantIdSchema,
  tier: v.optional(v.string()),
  host: v.optional(v.string()),
  region: v.optional(v.string()),
  attach: v.optional(attachBody),
});

/**
 * Where a new tenant goes: the host named (its region is the tenant's), or else a host of the
 * region named (the default region without one) chosen by room (src/placement/room.ts,
 * docs/adr/028-a-fleet-that-sleeps.md) among those open to new tenants (`LESSOR_PLACEMENT_HOSTS`).
 * A host and a region that disagree are `host_not_in_region`; a region whose open hosts are all
 * full is `507 host_full`.
 */
async function placeNewTenant(
  env: Env,
  config: LessorConfig,
  body: { host?: string | undefined; region?: string | undefined },
): Promise<{ host: string; region: string; placement: Record<string, unknown> | null }> {
  const region = body.region === undefined ? null : regionNamed(config, body.region);
  if (body.host === undefined) {
    const home = region ?? regionNamed(config, config.defaultRegion);
    const open = home.hosts.filter((host) => config.placementHosts.has(host));
    const choice = await withControlPlane(config, env, home.name, (db) =>
      placeByRoom(db, config, open, tenantFootprint(false)),
    );
    if (choice.kind === "full") {
      throw new LessorError("host_full", {
        publicMessage: `Every host of region ${home.name} open to new tenants (${open.length}: ${open.join(", ") || "none"}) is full; add a host (docs/operating.md, "When a region fills").`,
      });
    }
    return {
      host: choice.host,
      region: home.name,
      placement: {
        policy: "room",
        candidates: open.length,
        tenantsLeft: choice.tenantsLeft,
        connectionsLeft: choice.connectionsLeft,
      },
    };
  }
  const host = config.hosts.get(body.host);
  if (host && region !== null && host.region !== region.name) {
    throw new LessorError("host_not_in_region", {
      publicMessage: `Host ${host.name} is in region ${host.region}, not ${region.name}; region ${region.name} has ${region.hosts.join(", ")}.`,
    });
  }
  return { host: body.host, region: host?.region ?? config.defaultRegion, placement: null };
}

tenantRoutes.post(
  "/v1/tenants",
  requireAdmin,
  jsonBody(createTenantBody, {
    id: "invalid_tenant_id",
    tier: "unknown_tier",
    host: "unknown_host",
    region: "region_unknown",
  }),
  async (c) => {
    const config = loadConfig(c.env);
    const body = c.req.valid("json");
    const { id, tier = config.defaultTier } = body;
    const lessorHost = new URL(c.req.url).host;
    const connectionString = (key: string) => `postgres://${id}:${key}@${lessorHost}/${id}`;
    if (body.attach) {
      // A customer's tunnel names no region: its tenants are the default region's (ADR 023).
      if (body.region !== undefined && body.region !== config.defaultRegion) {
        throw new LessorError("invalid_request", {
          publicMessage: `An attached database's tenant lives in the default region (${config.defaultRegion}); leave region out.`,
        });
      }
      if (body.host !== undefined) {
        throw new LessorError("invalid_request", {
          publicMessage:
            "Give host (Lessor creates the database) or attach (the customer's database), not both.",
        });
      }
      const attached = await attachTenant(c.env, config, { id, tier, ...body.attach }, c.var.actor);
      return c.json(
        {
          tenant: { ...publicTenant(attached.row), region: config.defaultRegion },
          key: attached.key,
          connectionString: connectionString(attached.key),
          adopted: publicAdoption(attached.row, attached.placement, attached.report),
        },
        201,
      );
    }
    // A host chosen by room may fill between the choice and the create (another create took its
    // last place, under the host's room lock): choose again, a bounded number of times.
    let created: Awaited<ReturnType<typeof provisionTenant>> | undefined;
    let region = config.defaultRegion;
    for (let attempt = 0; created === undefined; attempt++) {
      const placed = await placeNewTenant(c.env, config, body);
      region = placed.region;
      try {
        created = await provisionTenant(
          c.env,
          config,
          { id, tier, host: placed.host, ...(placed.placement ? { placement: placed.placement } : {}) },
          c.var.actor,
        );
      } catch (error) {
        const raced = error instanceof LessorError && error.code === "host_full" && placed.placement !== null;
        if (!raced || attempt >= 2) throw error;
      }
    }
    const { row, key } = created;
    return c.json(
      { tenant: { ...publicTenant(row), region }, key, connectionString: connectionString(key) },
      201,
    );
  },
);

/** What an operator sees of an adopted database: where, as whom, what the probe found. Never the password. */
function publicAdoption(
  row: { databaseName: string; roleName: string },
  placement: AdoptedPlacement,
  report: AdoptionReport,
) {
  return {
    tunnel: placement.tunnel,
    database: row.databaseName,
    role: row.roleName,
    credentials: placement.credentials,
    containment: report.verdict.containment,
    loginGuard: report.verdict.loginGuard,
    server: report.facts.serverVersion,
    facts: report.facts,
    warnings: report.verdict.warnings,
    probedAt: new Date(report.probedAt).toISOString(),
  };
}

const tenantPage = v.object({
  limit: pageLimit,
  cursor: v.optional(
    v.pipe(
      v.string(),
      v.check((raw) => parseTenantId(raw) !== null, badCursor),
    ),
  ),
});

tenantRoutes.get("/v1/tenants", requireAdmin, query(tenantPage), async (c) => {
  const config = loadConfig(c.env);
  const { limit, cursor } = c.req.valid("query");
  const region = regionParam(c);
  const rows = await withControlPlane(config, c.env, region, (db) =>
    db
      .select()
      .from(tenants)
      .where(cursor === undefined ? undefined : gt(tenants.id, cursor))
      .orderBy(asc(tenants.id))
      .limit(limit + 1),
  );
  const page = rows.slice(0, limit);
  return c.json({
    region,
    tenants: page.map(publicTenant),
    nextCursor: rows.length > limit ? (page.at(-1)?.id ?? null) : null,
  });
});

tenantRoutes.get("/v1/tenants/:id", requireAdmin, async (c) => {
  const id = tenantParam(c);
  const config = loadConfig(c.env);
  const region = regionParam(c);
  const { row, erase, credentialAt, adopted } = await withControlPlane(config, c.env, region, async (db) => {
    const [found] = await db.select().from(tenants).where(eq(tenants.id, id)).limit(1);
    const [adoptedRow] = found
      ? await db.select().from(adoptedDatabases).where(eq(adoptedDatabases.tenantId, id)).limit(1)
      : [];
    return {
      row: found,
      erase: found && found.status !== "erasing" ? null : await loadEraseOf(db, id),
      credentialAt: found ? await credentialSetAt(db, id) : null,
      adopted: adoptedRow ?? null,
    };
  });
  if (!row) {
    // Gone: erased (the tombstone says when), or never there.
    if (erase?.state === "erased") {
      throw new LessorError("tenant_erased", {
        details: { erasedAt: (erase.erasedAt ?? erase.updatedAt).toISOString() },
      });
    }
    throw new LessorError("tenant_not_found");
  }
  const runtime = await tenantObject(c.env, region, id).status();
  return c.json({
    tenant: { ...publicTenant(row), region, credentialRotatedAt: credentialAt?.toISOString() ?? null },
    runtime,
    ...(adopted
      ? {
          adopted: {
            ...publicAdoption(
              row,
              {
                tunnel: adopted.tunnel,
                hostname: adopted.hostname,
                port: adopted.port,
                credentials: adopted.credentialPolicy,
              },
              adopted.report as AdoptionReport,
            ),
            // The customer's server refused the credential at the last start: an operator must act.
            credential: runtime.failureReason === "credential_revoked" ? "revoked" : "ok",
          },
        }
      : {}),
    ...(erase?.state === "erasing"
      ? { erase: { stage: erase.stage, startedAt: erase.startedAt.toISOString() } }
      : {}),
  });
});

/**
 * Rotates the tenant's database credential through overlapping generations: answers once the new
 * generation serves (202: the old one is still finishing the leases it holds). A stopped tenant's
 * credential is simply replaced (`overlapped: false`).
 */
tenantRoutes.post("/v1/tenants/:id/rotate-credentials", requireAdmin, async (c) => {
  const id = tenantParam(c);
  const outcome = await tenantObject(c.env, regionParam(c), id).rotateCredentials(id);
  if (!outcome.ok) throw LessorError.fromWire(outcome.error);
  return c.json({ generation: outcome.generation, overlapped: outcome.overlapped }, 202);
});

const suppliedCredentialBody = jsonObject({
  user: v.optional(
    v.pipe(
      v.string("user must be a role name."),
      v.check(isCustomerRoleName, "user must be a plain role name (letters, digits, _ $ -)."),
    ),
  ),
  password: v.pipe(v.string("password is required."), v.minLength(1, "password is required.")),
});

/**
 * A credential the customer issued for their own database (an adopted tenant): proved through the
 * tunnel, then served through overlapping generations like a rotation, so no request fails. `user`
 * may name a new role (the customer's way to overlap two credentials). Answers once the new
 * generation serves; the customer revokes the old credential after `runtime.retiring` is null.
 */
tenantRoutes.put("/v1/tenants/:id/credentials", requireAdmin, jsonBody(suppliedCredentialBody), async (c) => {
  const id = tenantParam(c);
  await requireCatalogTenant(c, id);
  const { user, password } = c.req.valid("json");
  const outcome = await tenantObject(c.env, regionParam(c), id).supplyCredential(
    id,
    user ?? null,
    password,
    c.var.actor,
  );
  if (!outcome.ok) throw LessorError.fromWire(outcome.error);
  return c.json({ generation: outcome.generation, overlapped: outcome.overlapped }, 202);
});

/** Writes one audit row for an operator action on a tenant. */
async function audit(
  c: AppContext,
  action: AuditAction,
  tenantId: TenantId,
  detail: Record<string, unknown> = {},
): Promise<void> {
  await withControlPlane(loadConfig(c.env), c.env, regionParam(c), (db) =>
    writeAudit(db, { actor: c.var.actor, action, tenantId, detail }),
  );
}

for (const [action, status] of [
  ["disable", "disabled"],
  ["enable", "active"],
] as const) {
  tenantRoutes.post(`/v1/tenants/:id/${action}`, requireAdmin, async (c) => {
    const id = tenantParam(c);
    const config = loadConfig(c.env);
    const region = regionParam(c);
    const { row, record } = await withControlPlane(config, c.env, region, (db) =>
      db.transaction(async (tx) => {
        // Never an erasing tenant: enabling it would reopen what the erase closed.
        const [updated] = await tx
          .update(tenants)
          .set({ status, updatedAt: sql`now()` })
          .where(and(eq(tenants.id, id), inArray(tenants.status, ["active", "disabled"])))
          .returning();
        if (!updated) {
          const [other] = await tx.select({ status: tenants.status }).from(tenants).where(eq(tenants.id, id));
          if (other?.status === "erasing") throw new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
          return { row: undefined, record: null };
        }
        await writeAudit(tx, { actor: c.var.actor, action: `tenant.${action}`, tenantId: id, detail: {} });
        return { row: updated, record: await loadTenantRecord(tx as unknown as ControlPlane, config, id) };
      }),
    );
    if (!row) throw new LessorError("tenant_not_found");
    if (record) await tenantObject(c.env, region, id).configure(record);
    return c.json({ tenant: { ...publicTenant(row), region } });
  });
}

const eventPage = v.object({ limit: pageLimit, cursor: integerCursor(1) });

tenantRoutes.get("/v1/tenants/:id/events", requireAdmin, query(eventPage), async (c) => {
  const id = tenantParam(c);
  const config = loadConfig(c.env);
  const { limit, cursor } = c.req.valid("query");
  const before = cursor ?? null;
  const rows = await withControlPlane(config, c.env, regionParam(c), (db) =>
    listLifecycleEvents(db, id, { before, limit: limit + 1 }),
  );
  const page = rows.slice(0, limit);
  return c.json({
    events: page.map((event) => ({
      seq: event.seq,
      generation: event.generation,
      from: event.fromState,
      to: event.toState,
      reason: event.reason,
      at: event.at.toISOString(),
    })),
    nextCursor: rows.length > limit ? (page.at(-1)?.seq.toString() ?? null) : null,
  });
});

/**
 * 404 unless the catalog has the tenant: operator actions never conjure an object for a
 * non-tenant. An erasing tenant is refused too: the erase owns it now.
 */
async function requireCatalogTenant(c: AppContext, id: TenantId): Promise<void> {
  const config = loadConfig(c.env);
  const [row] = await withControlPlane(config, c.env, regionParam(c), (db) =>
    db.select({ status: tenants.status }).from(tenants).where(eq(tenants.id, id)).limit(1),
  );
  if (!row || row.status === "provisioning") throw new LessorError("tenant_not_found");
  if (row.status === "erasing") throw new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
}

const drainBody = jsonObject({ force: v.optional(v.boolean("force must be true or false."), false) });

tenantRoutes.post("/v1/tenants/:id/drain", requireAdmin, jsonBody(drainBody), async (c) => {
  const id = tenantParam(c);
  await requireCatalogTenant(c, id);
  const { force } = c.req.valid("json");
  const runtime = await tenantObject(c.env, regionParam(c), id).drain(force);
  await audit(c, "tenant.drain", id, { force, generation: runtime.generation });
  return c.json({ runtime }, 202);
});

for (const [action, pinned] of [
  ["pin", true],
  ["unpin", false],
] as const) {
  tenantRoutes.post(`/v1/tenants/:id/${action}`, requireAdmin, async (c) => {
    const id = tenantParam(c);
    await requireCatalogTenant(c, id);
    const object = tenantObject(c.env, regionParam(c), id);
    await object.setPinned(pinned);
    await audit(c, `tenant.${action}`, id);
    return c.json({ runtime: await object.status() });
  });
}
