/**
 * What crosses RPC between the Worker (routes, cron jobs, campaigns) and a TenantObject. Both sides
 * import these shapes from here, so no lower layer imports a Durable Object's module.
 */
import type { CredentialPolicy } from "../core/adoption.ts";
import type { TenantJwt } from "../core/jwt-config.ts";
import type { PostgresErrorBody } from "../core/neon-protocol.ts";
import type { WireError } from "../errors/index.ts";

/** One usable key of a tenant (neither revoked nor, at load time, expired). */
export interface TenantKeyRecord {
  keyId: string;
  /** Hex SHA-256 of the key. */
  hash: string;
  /** Epoch ms after which the key no longer works; null: never. */
  expiresAt: number | null;
  /** `full`: every route, as the tenant role. `jwt`: `/sql` only, with a valid end-user token. */
  scope: KeyScope;
}

export type KeyScope = "full" | "jwt";

/**
 * What a caller proves to a tenant's object: which of the tenant's keys it holds (the Worker has
 * already checked the key's MAC) and the key's hash, which the object compares.
 */
export interface KeyProof {
  keyId: string;
  keyHash: string;
  /** The tenant's region, as its key names it inside the MAC (docs/adr/023-regions.md). */
  region: string;
}

/** What a TenantObject knows about its tenant: enough to authenticate and to start its pool. */
export interface TenantRecord {
  tenantId: string;
  status: "active" | "disabled";
  keys: TenantKeyRecord[];
  tier: string;
  poolSize: number;
  host: string;
  databaseName: string;
  roleName: string;
  /** Schema version Lessor last applied; the database's own ledger is the truth. */
  schemaVersion: number;
  /** End-user JWT mode (docs/adr/012-end-user-jwts.md); null: a Bearer token is refused. */
  jwt: TenantJwt | null;
  /**
   * A customer's database Lessor did not create, behind a tunnel (docs/adr/018): then `host` is the
   * tunnel's budget name, `databaseName` and `roleName` the customer's. Absent or null: a database
   * Lessor created on one of its hosts.
   */
  adopted?: AdoptedPlacement | null;
}

/** Where an adopted database is, as its tunnel reaches it, and who changes its credential. */
export interface AdoptedPlacement {
  tunnel: string;
  hostname: string;
  port: number;
  credentials: CredentialPolicy;
}

/** The runtime half of `GET /v1/tenants/:id`. */
export interface TenantRuntimeStatus {
  state: "stopped" | "starting" | "ready" | "draining" | "failed";
  generation: number;
  poolSize: number | null;
  leases: number;
  lastUsedAt: string | null;
  idleSince: string | null;
  failureReason: string | null;
  retryAt: string | null;
  pendingEvents: number;
  sessions: number;
  pinned: boolean;
  migrating: boolean;
  schemaVersion: number | null;
  /** While draining: leases held longer than the maximum drain time (never killed unless forced). */
  drain: { startedAt: string; overdue: boolean; heldLeases: { lease: string; ageMs: number }[] } | null;
  reclaimedLeases: number;
  /** A credential rotation's old generation, serving only the leases it still holds. */
  retiring: { generation: number; leases: number } | null;
  /** The generation a credential rotation is preparing, if one is. */
  rotatingTo: number | null;
  /** An erase holds the gate closed. */
  erasing: boolean;
  /** A move to another region: `moving` while its fence holds, `moved` once this object is a pointer. */
  move: { state: "moving" | "moved"; to: string } | null;
  /** Rows this object instance's storage has written since it started (Cloudflare bills rows written). */
  storageRowsWritten: number;
  /** The pool's size against its floor and maximum, and what the object observed (adaptive admission). */
  pool: PoolSizeStatus | null;
}

/** A pool's size and observed use (docs/adr/022-adaptive-admission.md), for `lessorctl status`. */
export interface PoolSizeStatus {
  /** Whether the pool's host runs adaptive admission; if not, start = floor = max = the tier's size. */
  adaptive: boolean;
  /** Connections the pool may hold now (null while no pool is open). */
  size: number | null;
  start: number;
  floor: number;
  max: number;
  /** The current window, while a pool is open on an adaptive host. */
  observed: {
    windowMs: number;
    coveredMs: number;
    peak: number;
    recentPeak: number;
    mean: number;
    waits: number;
    meanWaitMs: number;
    maxWaitMs: number;
    refusals: number;
  } | null;
  /** The summary the last heartbeat kept (survives a restart of the object). */
  lastObserved: { at: string; size: number; peak: number; mean: number } | null;
  /** The size policy's last decision. */
  lastDecision: { at: string; target: number; reason: string } | null;
}

/** The answer of a credential rotation: the generation now serving, and whether two overlapped. */
export type RotateOutcome =
  | { ok: true; generation: number; overlapped: boolean }
  | { ok: false; error: WireError };

/** The answer to a statement. The answer is serialised once, in the object: the Worker passes the text through. */
/**
 * A `/sql` answer. A refusal says whether the caller was authenticated before it: said as a fact
 * the object established, never inferred from which refusal it was (anything that stopped the
 * request before its key was checked, a catalog outage say, counts as not authenticated).
 */
export type SqlOutcome =
  | { ok: true; json: string }
  | { ok: false; postgres: PostgresErrorBody; authenticated: boolean }
  | { ok: false; error: WireError; authenticated: boolean };

export type SessionOpened =
  | { ok: true; lease: string; generation: number; expiresAt: string }
  | { ok: false; error: WireError };

/** The answer of an RPC that returns nothing but may refuse. */
export type Verdict = { ok: true } | { ok: false; error: WireError };

export type MigrateOutcome =
  | { outcome: "migrated"; fromVersion: number; toVersion: number; applied: number[] }
  | {
      outcome: "skipped";
      reason:
        | "tenant_unknown"
        | "already_migrating"
        | "leases_held"
        | "maintenance_busy"
        | "tenant_erasing"
        /** A move to another region holds the tenant (docs/adr/023-regions.md): run again later. */
        | "tenant_moving"
        | "control_plane_unavailable"
        /** A transient fault (a killed backend, a restarted host, a cut network) stopped it: run again. */
        | "interrupted";
      leases?: number;
    }
  | { outcome: "failed"; version: number | null; summary: string };

/** Session lease tokens: `lsl_<tenant>_<random>`; the tenant part routes the request to the object. */
export const sessionTokenPrefix = "lsl_";

/** Where a tenant's erase stands (`GET /v1/tenants/:id/erase`). */
export type EraseStatus =
  | {
      state: "erasing";
      /** The stage running or next to run. */
      stage: string;
      startedAt: string;
      attempts: number;
      lastError: string | null;
    }
  | {
      state: "erased";
      erasedAt: string;
      /** Present for a customer's database: the erase detached it (never dropped) and forgot its credential. */
      database?: "detached";
    };

/** The answer of an erase request or resume. */
export type EraseAnswer = { ok: true; status: EraseStatus } | { ok: false; error: WireError };

/** Where a tenant's move to another region stands (docs/adr/023-regions.md). */
export type MoveStatus =
  | {
      state: "moving";
      from: string;
      to: string;
      /** The stage that runs next. */
      stage: string;
      startedAt: string;
      attempts: number;
      lastError: string | null;
    }
  | { state: "moved"; from: string; to: string; startedAt: string; movedAt: string };

export type MoveAnswer = { ok: true; status: MoveStatus } | { ok: false; error: WireError };

/** What the new region's object is handed at a move's `start` stage. */
export interface MovedIn {
  record: TenantRecord;
  /** The highest outbox sequence numbers the new region's control plane holds of the tenant. */
  eventSeq: number;
  usageSeq: number;
}
