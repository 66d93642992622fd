/**
 * `Lessor-Schema-Version` on `/sql`: the schema version an app needs.
 *
 * - The tenant's object refuses the request with 409 `schema_too_old` when the tenant's recorded
 *   version is older; with `LESSOR_UPGRADE_ON_DEMAND = "true"` Lessor migrates that tenant to the
 *   version first (expand steps at once; a contract step only when the guard allows it) and then
 *   runs the request.
 * - Each version an app asks for is recorded for the contract guard, off the hot path: an isolate
 *   reports a version at most once a minute, in `waitUntil` after the answer is sent, and the
 *   record is insert-only (one row per version per minute). The request itself opens no
 *   control-plane connection.
 *
 * The `/sql` call itself is the SQL path's (src/routes/sql-call.ts); this is what a named version
 * adds to it.
 */
import { loadConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import {
  campaignDefaults,
  contractGuard,
  contractStepsBetween,
  parseSchemaVersionHeader,
  recordedAppVersion,
} from "../core/campaign.ts";
import type { SqlRequest } from "../core/neon-protocol.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { tenantMigrations } from "../migrations/tenant.gen.ts";
import { tenantObject } from "../placement/index.ts";
import type { KeyProof, SqlOutcome } from "../rpc/tenant.ts";
import { appVersionsSeenSince, noteAppVersionSeen } from "./store.ts";

export const schemaVersionHeader = "Lessor-Schema-Version";

/** An isolate reports each version at most this often. */
const reportIntervalMs = 60_000;
/** (tenant, version) pairs one isolate remembers having reported; bounded, cleared when full. */
const maxRemembered = 4_096;
const reportedAt = new Map<string, number>();

/** Hands `promise` to the request's `waitUntil`, or lets it run on its own where there is none. */
export function waitUntil(
  c: { readonly executionCtx: { waitUntil(promise: Promise<unknown>): void } },
  promise: Promise<unknown>,
): void {
  try {
    c.executionCtx.waitUntil(promise);
  } catch {
    // No execution context (app.request in a plain test): the promise still runs, it is just not awaited.
  }
}

/** Reads the header: null when absent; a malformed value is 400 `invalid_request`. */
export function requiredSchemaVersion(raw: string | undefined): number | null {
  const parsed = parseSchemaVersionHeader(raw);
  if (parsed === "malformed") {
    throw new LessorError("invalid_request", {
      publicMessage: `${schemaVersionHeader} must be a positive integer (the schema version the app needs).`,
    });
  }
  return parsed;
}

/** Whether `LESSOR_UPGRADE_ON_DEMAND` is on (wrangler.toml [vars]). */
export function upgradeOnDemand(env: Env): boolean {
  return Reflect.get(env, "LESSOR_UPGRADE_ON_DEMAND") === "true";
}

/**
 * Records that an authenticated app of `tenantId` needing `required` was seen, unless this isolate
 * did so for that tenant and version within the last minute. Only a caller the tenant's object
 * authenticated gets here: a made-up connection string records nothing (it could otherwise hold
 * back every contract step of the fleet). The write is handed to `waitUntil`; a failed write is
 * forgotten so a later request reports again.
 */
export function noteAppSchemaVersion(
  env: Env,
  region: string,
  tenantId: string,
  required: number,
  waitUntil: (promise: Promise<unknown>) => void,
  now: number = Date.now(),
): void {
  const version = recordedAppVersion(required, tenantMigrations.length);
  const seen = `${tenantId}:${version}`;
  const last = reportedAt.get(seen);
  if (last !== undefined && now - last < reportIntervalMs) return;
  if (reportedAt.size >= maxRemembered) reportedAt.clear();
  reportedAt.set(seen, now);
  const write = withControlPlane(loadConfig(env), env, region, (db) => noteAppVersionSeen(db, version)).catch(
    (error: unknown) => {
      reportedAt.delete(seen);
      logEvent("warn", "app_schema_version_report_failed", { version, failure: describeFailure(error) });
    },
  );
  waitUntil(write);
}

/** Whether this isolate has reported `tenantId` needing `version` within the last minute. */
export function appSchemaVersionReported(
  tenantId: string,
  version: number,
  now: number = Date.now(),
): boolean {
  const last = reportedAt.get(`${tenantId}:${version}`);
  return last !== undefined && now - last < reportIntervalMs;
}

/** A `/sql` call that named the schema version its app needs, as the SQL path made it (routes/sql-call.ts). */
export interface VersionedSqlCall {
  tenantId: string;
  /** The key's proof as the tenant's owner took it (its region: where the tenant is now). */
  owner: KeyProof;
  request: SqlRequest;
  required: number;
  bearer: string | null;
}

/**
 * What a `/sql` answer needs when its app named a schema version: the version is recorded for the
 * contract guard (an authenticated caller only), and a `schema_too_old` answer becomes an upgrade
 * and a second call when `LESSOR_UPGRADE_ON_DEMAND` is on. Every other answer is returned as it is.
 */
export async function afterSchemaVersion(
  env: Env,
  waitUntil: (promise: Promise<unknown>) => void,
  call: VersionedSqlCall,
  outcome: SqlOutcome,
): Promise<SqlOutcome> {
  const { tenantId, owner, request, required, bearer } = call;
  const authenticated = outcome.ok || outcome.authenticated;
  if (authenticated) noteAppSchemaVersion(env, owner.region, tenantId, required, waitUntil);
  if (
    outcome.ok ||
    !("error" in outcome) ||
    outcome.error.code !== "schema_too_old" ||
    // A customer's database is never migrated on demand (docs/customer-databases.md).
    outcome.error.details?.database === "adopted" ||
    !upgradeOnDemand(env)
  ) {
    return outcome;
  }
  // Only an authenticated caller gets `schema_too_old`, so only it can trigger an upgrade.
  await upgradeTenantFor(env, owner.region, tenantId, required, outcome.error.message);
  // A stub only here: making one is a measurable share of the warm path's CPU (issue 25).
  return tenantObject(env, owner.region, tenantId).sql(tenantId, owner, request, required, bearer);
}

/**
 * Migrates one tenant to the version a request needs, or says why not. A contract step is subject
 * to the same guard as in a campaign (never forced here).
 */
async function upgradeTenantFor(
  env: Env,
  region: string,
  tenantId: string,
  required: number,
  tooOldMessage: string,
): Promise<void> {
  if (required > tenantMigrations.length) {
    throw new LessorError("schema_version_unknown", {
      publicMessage: `${tooOldMessage} This deployment bundles schema versions up to ${tenantMigrations.length}.`,
    });
  }
  const config = loadConfig(env);
  // Contract steps up to the required version; steps at or below the recorded version are applied.
  if (contractStepsBetween(tenantMigrations, 0, required).length > 0) {
    const now = Date.now();
    const verdict = await withControlPlane(config, env, region, async (db) => {
      const recorded = await db.query.tenants.findFirst({
        columns: { schemaVersion: true },
        where: (t, { eq }) => eq(t.id, tenantId),
      });
      return contractGuard({
        contractSteps: contractStepsBetween(tenantMigrations, recorded?.schemaVersion ?? 0, required),
        seen: await appVersionsSeenSince(db, now - campaignDefaults.stabilityWindowMs),
        now,
        stabilityWindowMs: campaignDefaults.stabilityWindowMs,
        force: false,
      });
    });
    if (!verdict.ok) {
      throw new LessorError("schema_too_old", {
        publicMessage: `${tooOldMessage} The upgrade includes a contract step that waits for older apps: run a campaign when they are gone.`,
      });
    }
  }
  const answer = await tenantObject(env, region, tenantId).migrate(
    tenantId,
    required,
    config.admissionWaitMs,
  );
  switch (answer.outcome) {
    case "migrated":
      logEvent("info", "tenant_upgraded_on_demand", {
        tenant: tenantId,
        fromVersion: answer.fromVersion,
        toVersion: answer.toVersion,
      });
      return;
    case "skipped":
      if (answer.reason === "maintenance_busy")
        throw new LessorError("maintenance_busy", { retryAfterSeconds: 1 });
      // Another upgrade is running, or leases did not drain in time: the usual migrating answer.
      throw new LessorError("tenant_migrating", { retryAfterSeconds: 2 });
    case "failed":
      logEvent("warn", "tenant_upgrade_on_demand_failed", { tenant: tenantId, version: answer.version });
      throw new LessorError("schema_upgrade_failed");
  }
}
