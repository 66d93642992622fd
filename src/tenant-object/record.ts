/** What a TenantObject knows about its tenant: enough to authenticate and to start its pool. */
export interface TenantRecord {
  tenantId: string;
  status: "active" | "disabled";
  keyHash: string;
  tier: string;
  poolSize: number;
  host: string;
  databaseName: string;
  roleName: string;
  /** Schema version Lessor last applied; the database's own ledger is the truth. */
  schemaVersion: number;
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
}
