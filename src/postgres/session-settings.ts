/**
 * The settings a session starts with, pinned in its startup options: a tenant connection's soft
 * limits and the settings Lessor's own statements on it depend on, and the fully pinned session of
 * every connection with more rights than a tenant.
 */
import type { TunnelRoute } from "./driver.ts";

/**
 * Settings a tenant connection starts with. They are Postgres's own (soft) limits: the tenant can
 * `SET` them for a statement, so Lessor's timers enforce the hard bounds (src/tenant-object).
 */
export interface SessionLimits {
  statementTimeoutMs: number;
  lockTimeoutMs: number;
  idleInTransactionMs: number;
}

import type { OpeningGate } from "./opening-gate.ts";

export interface TenantConnectionOptions {
  applicationName: string;
  limits: SessionLimits;
  /**
   * Mints the one-time login token each new connection presents to the tenant database's guard;
   * null for a customer's database, which has no guard of Lessor's.
   */
  loginToken: (() => Promise<string>) | null;
  /** A customer's database: its tunnel. */
  route?: TunnelRoute;
  /** More pinned settings (a migration pins its `search_path`). */
  extraSettings?: readonly string[];
  /** The object's bound on connections opening at once (opening-gate.ts); none for a one-off connection. */
  openingGate?: OpeningGate;
}

/**
 * The libpq `options` startup parameter: `-c name=value` pairs. Startup parameters win over every
 * database- and role-level setting, so what is pinned here no tenant can change for the session
 * (it can still `SET` it inside its own statements). A space in a value is escaped, as libpq does.
 */
export function startupOptions(settings: readonly string[]): string {
  return settings.map((setting) => `-c ${setting.replaceAll("\\", "\\\\").replaceAll(" ", "\\ ")}`).join(" ");
}

/**
 * The session defaults of every connection as a tenant role (its pool, its migrations): the soft
 * limits, and the two settings Lessor's own statements on it depend on, whatever the tenant set
 * for its role. Its `search_path` stays the tenant's own: Lessor's statements there name every
 * object with its schema.
 */
export function tenantSessionSettings(limits: SessionLimits): string[] {
  return [
    `statement_timeout=${limits.statementTimeoutMs}`,
    `lock_timeout=${limits.lockTimeoutMs}`,
    `idle_in_transaction_session_timeout=${limits.idleInTransactionMs}`,
    // A backend whose client vanished notices within a second even while it computes.
    "client_connection_check_interval=1000",
    "default_transaction_read_only=off",
    "standard_conforming_strings=on",
  ];
}

/**
 * The pinned session of every connection Lessor opens with more rights than a tenant (the host's
 * admin role, in its own database or a tenant's): nothing a database or role setting says can
 * reach it. Only `pg_catalog` resolves names (`pg_temp` last, so no temporary object shadows one),
 * literals parse one way, transactions are read-write and read committed, and every wait is bounded
 * by the work's deadline (docs/adr/007-tenant-containment.md, "Pinning").
 */
export function privilegedSessionSettings(deadlineMs: number): string[] {
  return [
    "search_path=pg_catalog,pg_temp",
    "standard_conforming_strings=on",
    "default_transaction_read_only=off",
    "default_transaction_isolation=read committed",
    "default_table_access_method=heap",
    "check_function_bodies=on",
    "array_nulls=on",
    "transform_null_equals=off",
    "row_security=on",
    `statement_timeout=${deadlineMs}`,
    `lock_timeout=${deadlineMs}`,
    `idle_in_transaction_session_timeout=${deadlineMs}`,
    "idle_session_timeout=0",
    "client_connection_check_interval=1000",
  ];
}
