/**
 * How Lessor connects as a tenant role: the address of its database, its password, the one-time
 * login tokens its database's guard demands, and the limits every such connection starts with.
 * Shared by provisioning and the TenantObject, so both connect the same way.
 */
import type { LessorConfig } from "../config/index.ts";
import { toHex } from "../crypto/encoding.ts";
import { loginGuardKey, loginTokenMinter } from "../crypto/login-guard.ts";
import { LessorError } from "../errors/index.ts";
import type { ConnectionTarget, SessionLimits } from "../postgres/index.ts";
import type { AdoptedPlacement } from "../rpc/tenant.ts";
import { customerTarget } from "./customer.ts";
import type { RoleLimits } from "./host-admin.ts";

/** Where a tenant's database lives (a catalog record has these). */
export interface TenantPlacement {
  host: string;
  roleName: string;
  databaseName: string;
  /** A customer's database behind a tunnel (docs/adr/018); absent or null: one of Lessor's hosts. */
  adopted?: AdoptedPlacement | null;
}

export interface TenantCredential {
  target: ConnectionTarget;
  /**
   * Mints a one-time login token for the next connection; null for a customer's database, where
   * Lessor installs no guard (docs/customer-databases.md).
   */
  loginToken: (() => Promise<string>) | null;
}

/**
 * The credential to connect as the tenant role whose password is `password`: on Lessor's host with
 * a login token, or on a customer's server through its tunnel, as the role the customer issued.
 */
export async function tenantCredential(
  config: LessorConfig,
  placement: TenantPlacement,
  password: string,
): Promise<TenantCredential> {
  if (placement.adopted) {
    return {
      target: customerTarget(config, placement.adopted, placement.databaseName, placement.roleName, password),
      loginToken: null,
    };
  }
  const host = config.hosts.get(placement.host);
  if (!host) {
    throw new LessorError("misconfigured", { internal: `tenant host ${placement.host} is not configured` });
  }
  const mint = await loginTokenMinter(placement.roleName, await loginGuardKey(password));
  return {
    target: {
      host: host.hostname,
      port: host.port,
      user: placement.roleName,
      password,
      database: placement.databaseName,
    },
    loginToken: () => mint(),
  };
}

/** The id under which a password's guard key is kept in the tenant database (a fingerprint, not a secret). */
export async function guardKeyId(guardKey: Uint8Array<ArrayBuffer>): Promise<string> {
  return toHex(await crypto.subtle.digest("SHA-256", guardKey)).slice(0, 16);
}

/** The soft limits every tenant connection starts with (Lessor's timers enforce the hard ones). */
export function sessionLimits(config: LessorConfig): SessionLimits {
  return {
    // Postgres's own timeout is the backstop for a statement whose object died; while the object
    // lives, its watchdog (at the bound itself) stops the statement first, and says why.
    statementTimeoutMs: config.statementTimeoutMs + 1_000,
    lockTimeoutMs: config.statementTimeoutMs,
    // A session lease idle in a transaction is reclaimed by Lessor at its TTL; this is the backstop.
    idleInTransactionMs: config.leaseMaxTtlMs + 10_000,
  };
}

/**
 * The limits of a migration's connection: its statements may run up to the migration deadline
 * (Lessor cancels it there; Postgres's own timeout is the backstop), while lock waits stay as short
 * as a tenant statement's, so a step that cannot get its lock fails rather than queueing traffic.
 */
export function migrationLimits(config: LessorConfig): SessionLimits {
  return {
    statementTimeoutMs: config.migrationTimeoutMs + 1_000,
    lockTimeoutMs: config.statementTimeoutMs,
    idleInTransactionMs: config.leaseMaxTtlMs + 10_000,
  };
}

/**
 * What a migration's connection pins beyond every tenant connection's defaults: the bundled
 * migrations are the application's schema code, the same for every tenant, so they resolve names
 * the same way everywhere (`public`, with pg_catalog searched first), whatever the tenant set for its
 * role.
 */
export const migrationSettings: readonly string[] = ["search_path=public"];

/** The limits a tenant role gets on its host: its pool plus one migration connection. */
export function roleLimits(config: LessorConfig, poolSize: number): RoleLimits {
  return { connectionLimit: poolSize + 1, tempFileLimit: config.tempFileLimit };
}
