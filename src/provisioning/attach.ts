/**
 * Attaching a tenant to a database Lessor did not create (docs/adr/018-customer-databases-behind-tunnels.md):
 * a customer's database, reached through a named tunnel, with a credential the customer issued.
 *
 * The probe comes first, through the tunnel and within a slot of its maintenance reserve: Lessor
 * connects as the customer's role, reads what it may do there (catalogs and settings only: nothing
 * is created, no DDL runs), and decides (src/core/adoption.ts). A database it cannot serve is
 * refused with the reason, and nothing is kept. Then one control-plane transaction writes
 * everything at once: the catalog row (its `host` the tunnel's budget name), where the database is,
 * the sealed credential, the first key and the audit row. An attach is all or nothing, so sending
 * it again after a failure is safe.
 */
import { eq } from "drizzle-orm";
import { writeAudit } from "../audit/index.ts";
import type { LessorConfig, Tunnel } from "../config/index.ts";
import { tenantRecordFromRow, withControlPlane } from "../control-plane/index.ts";
import { adoptedDatabases, tenantCredentials, tenantKeys, tenants } from "../control-plane/schema.ts";
import {
  type AdoptedFacts,
  type AdoptionReport,
  type AdoptionUrl,
  type CredentialPolicy,
  describeRefusal,
  evaluateAdoption,
  parseAdoptionUrl,
} from "../core/adoption.ts";
import { poolCapacity } from "../core/budget.ts";
import { classifyStartFailure } from "../core/lifecycle.ts";
import type { TenantId } from "../core/tenant-id.ts";
import { type TunnelOutcome, tunnelFaultOf } from "../core/tunnel.ts";
import { hashKey } from "../crypto/keys.ts";
import { seal } from "../crypto/seal.ts";
import { mintTenantKey } from "../crypto/tenant-keys.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { budgetObject, tenantObjectNear } from "../placement/index.ts";
import type { AdoptedPlacement } from "../rpc/tenant.ts";
import {
  customerTarget,
  probeAdoptedFacts,
  tunnelUnavailable,
  withCustomerSession,
} from "../tenant-db/customer.ts";
import type { CatalogRow } from "./index.ts";

export interface AttachInput {
  id: TenantId;
  tier: string;
  tunnel: string;
  /** `postgres://user:password@host:port/database`, as the tunnel's proxy reaches the database. */
  url: string;
  credentials: CredentialPolicy;
}

export interface Attached {
  row: CatalogRow;
  /** The first key, shown once. */
  key: string;
  placement: AdoptedPlacement;
  report: AdoptionReport;
}

/** Attaches a tenant to a customer's database, or refuses and keeps nothing. */
export async function attachTenant(
  env: Env,
  config: LessorConfig,
  input: AttachInput,
  actor: string,
): Promise<Attached> {
  const poolSize = config.poolSizes.get(input.tier);
  if (poolSize === undefined) {
    throw new LessorError("unknown_tier", {
      publicMessage: `No tier "${input.tier}"; the configured tiers are ${[...config.poolSizes.keys()].join(", ")}.`,
    });
  }
  const tunnel = config.tunnels.get(input.tunnel);
  if (!tunnel) {
    const known = [...config.tunnels.keys()];
    throw new LessorError("unknown_tunnel", {
      publicMessage: `No tunnel "${input.tunnel}"; ${known.length === 0 ? "LESSOR_TUNNELS declares none" : `the configured tunnels are ${known.join(", ")}`}.`,
    });
  }
  const url = parseAdoptionUrl(input.url);
  if ("problem" in url) throw new LessorError("invalid_request", { publicMessage: url.problem });
  const placement: AdoptedPlacement = {
    tunnel: tunnel.name,
    hostname: url.hostname,
    port: url.port,
    credentials: input.credentials,
  };

  const facts = await probe(env, config, tunnel, placement, url, input.id);
  const probedAt = Date.now();
  const report: AdoptionReport = {
    probedAt,
    facts,
    verdict: evaluateAdoption(facts, {
      poolSize,
      tunnelPoolCapacity: poolCapacity(tunnel.budget),
      credentials: input.credentials,
      now: probedAt,
    }),
  };
  if (!report.verdict.fit) {
    throw new LessorError("attach_refused", { publicMessage: describeRefusal(report.verdict) });
  }

  const sealed = await seal(env.LESSOR_SEAL_KEY, input.id, url.password);
  const minted = await mintTenantKey(config.keyMacRing, input.id);
  const keyHash = await hashKey(minted.key);
  const row = await withControlPlane(config, env, config.defaultRegion, (db) =>
    db.transaction(async (tx) => {
      const [existing] = await tx
        .select({ status: tenants.status })
        .from(tenants)
        .where(eq(tenants.id, input.id))
        .for("update");
      if (existing?.status === "erasing") throw new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
      if (existing?.status === "provisioning") {
        throw new LessorError("provisioning_in_progress", { retryAfterSeconds: 2 });
      }
      if (existing) throw new LessorError("tenant_exists");
      const [inserted] = await tx
        .insert(tenants)
        .values({
          id: input.id,
          status: "active",
          tier: input.tier,
          host: tunnel.budgetName,
          databaseName: url.database,
          roleName: url.user,
          // Lessor knows nothing of a customer's schema: no migration is recorded as applied.
          schemaVersion: 0,
        })
        .onConflictDoNothing()
        .returning();
      // A create of the same id won the race between the check and the insert.
      if (!inserted) throw new LessorError("tenant_exists");
      await tx.insert(adoptedDatabases).values({
        tenantId: input.id,
        tunnel: tunnel.name,
        hostname: url.hostname,
        port: url.port,
        credentialPolicy: input.credentials,
        report,
      });
      await tx.insert(tenantCredentials).values({ tenantId: input.id, sealedPassword: sealed });
      await tx.insert(tenantKeys).values({ tenantId: input.id, keyId: minted.keyId, keyHash });
      await writeAudit(tx, {
        actor,
        action: "tenant.attach",
        tenantId: input.id,
        detail: {
          ordinal: inserted.ordinal,
          tier: input.tier,
          tunnel: tunnel.name,
          database: url.database,
          role: url.user,
          credentials: input.credentials,
          server: report.facts.serverVersion,
          warnings: report.verdict.warnings.length,
        },
      });
      return inserted;
    }),
  );
  logEvent("info", "tenant_attached", { tenant: input.id, tunnel: tunnel.name });
  const record = tenantRecordFromRow(
    row,
    [{ keyId: minted.keyId, hash: keyHash, expiresAt: null, scope: "full" }],
    config,
    null,
    placement,
  );
  if (record) {
    await tenantObjectNear(env, input.id, row.host)
      .configure(record)
      .catch(() => undefined);
  }
  return { row, key: minted.key, placement, report };
}

/**
 * Connects through the tunnel as the customer's role and reads what it may do there. A failure is
 * told apart: the tunnel (slow or down: `tunnel_unavailable`, and the tunnel's health learns it),
 * the credential (`credential_rejected`), the database (`attach_refused`).
 */
async function probe(
  env: Env,
  config: LessorConfig,
  tunnel: Tunnel,
  placement: AdoptedPlacement,
  url: AdoptionUrl,
  tenantId: string,
): Promise<AdoptedFacts> {
  const target = customerTarget(config, placement, url.database, url.user, url.password);
  const budget = budgetObject(env, tunnel.budgetName);
  const learn = (outcome: TunnelOutcome) =>
    budget.recordTunnelOutcome(tunnel.budgetName, outcome).catch(() => undefined);
  try {
    const facts = await withCustomerSession(
      env,
      config,
      tunnel,
      target,
      { purpose: "attach", tenantId },
      probeAdoptedFacts,
    );
    await learn("ok");
    return facts;
  } catch (error) {
    if (error instanceof LessorError) throw error;
    const reason = classifyStartFailure(error);
    const fault = tunnelFaultOf(reason);
    if (fault) {
      await learn(fault);
      throw tunnelUnavailable(fault, 5);
    }
    await learn("ok");
    if (reason === "auth_failed") {
      throw new LessorError("credential_rejected", {
        internal: "attach probe: the server refused the credential",
      });
    }
    if (reason === "database_missing" || (error as { code?: unknown }).code === "42501") {
      throw new LessorError("attach_refused", {
        publicMessage: `The server has no database "${url.database}" (or the role may not connect to it).`,
      });
    }
    logEvent("warn", "attach_probe_failed", { tenant: tenantId, failure: describeFailure(error) });
    throw new LessorError("attach_refused", {
      publicMessage: `The probe could not read what the role may do on the server (${(error as { code?: unknown }).code ?? "no code"}).`,
    });
  }
}
