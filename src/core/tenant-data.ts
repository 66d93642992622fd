/**
 * Every control-plane table that holds a tenant's rows, declared once, with what a move and an
 * erase do with it (docs/adr/026-tenant-object-kernel.md, docs/invariants.md invariant 20). The
 * move's copy and cleanup (src/move/store.ts), its placement refusal (src/tenant-object/move.ts)
 * and the erase's commit re-check (src/erase/store.ts, core/erase.ts) are driven by this table, and
 * test/integration/tenant-data.test.ts reads the control plane's own schema: a table with a tenant
 * column that is not declared here fails it.
 *
 * Move:
 * - `stub`: the catalog row; copied (marked `moving`), the old region keeps it as the `moved` stub;
 * - `copy`: copied in `copy` (what an earlier attempt wrote is replaced), removed at `cleanup`;
 * - `append`: copied once each (no key to replace by), removed at `cleanup`;
 * - `leave`: stays in the region it was written in (it is that region's record, not the tenant's state);
 * - `refuse`: a row here refuses the move with `code` (a placement rule: what it points at is the
 *   region's own, as a tunnel is the default region's).
 *
 * Erase: `delete` at `stage` (the commit re-checks that none is left, and resumes at the earliest
 * stage that removes what it finds); `keep` (the tombstone, the audit trail, the move history).
 */
import type { EraseStage } from "./erase.ts";

export type MoveAction =
  | { do: "stub" }
  | { do: "copy" }
  | { do: "append" }
  | { do: "leave"; why: string }
  | { do: "refuse"; code: "tenant_attached" };

export type EraseAction = { do: "delete"; stage: EraseStage } | { do: "keep"; why: string };

export interface TenantTable {
  /** The table's name in the control plane. */
  table: string;
  /** The column that names the tenant. */
  column: string;
  move: MoveAction;
  erase: EraseAction;
}

const copy = { do: "copy" } as const;
const del = <S extends EraseStage>(stage: S) => ({ do: "delete", stage }) as const;

/** Keyed by the drizzle schema's export name (src/control-plane/schema.ts). */
export const tenantData = {
  tenants: { table: "tenants", column: "id", move: { do: "stub" }, erase: del("commit") },
  tenantKeys: { table: "tenant_keys", column: "tenant_id", move: copy, erase: del("keys") },
  tenantJwt: { table: "tenant_jwt", column: "tenant_id", move: copy, erase: del("keys") },
  tenantCredentials: {
    table: "tenant_credentials",
    column: "tenant_id",
    move: copy,
    erase: del("credentials"),
  },
  adoptedDatabases: {
    table: "adopted_databases",
    column: "tenant_id",
    move: { do: "refuse", code: "tenant_attached" },
    erase: del("database"),
  },
  generationLedger: { table: "generation_ledger", column: "tenant_id", move: copy, erase: del("events") },
  lifecycleEvents: { table: "lifecycle_events", column: "tenant_id", move: copy, erase: del("events") },
  usageDeltas: { table: "usage_deltas", column: "tenant_id", move: copy, erase: del("usage") },
  usageRollups: { table: "usage_rollups", column: "tenant_id", move: copy, erase: del("usage") },
  campaignTenants: {
    table: "campaign_tenants",
    column: "tenant_id",
    move: { do: "leave", why: "a campaign migrates its own region's tenants; the moved tenant is skipped" },
    erase: del("campaigns"),
  },
  auditLog: {
    table: "audit_log",
    column: "tenant_id",
    move: { do: "append" },
    erase: { do: "keep", why: "the audit trail outlives the tenant (it names no secret)" },
  },
  tenantErasures: {
    table: "tenant_erasures",
    column: "tenant_id",
    move: { do: "leave", why: "the tombstones of earlier incarnations stay where they were erased" },
    erase: { do: "keep", why: "the job's row becomes the tombstone" },
  },
  tenantMoves: {
    table: "tenant_moves",
    column: "tenant_id",
    move: { do: "leave", why: "the move's own progress row, in the region it leaves" },
    erase: { do: "keep", why: "the move history of an id" },
  },
} as const satisfies Record<string, TenantTable>;

export type TenantDataTable = keyof typeof tenantData;

/** The declared tables whose rows a move `do`es (`copy`, `append`, `refuse`…). */
export function tablesMoved<A extends MoveAction["do"]>(action: A): TenantDataTable[] {
  return (Object.keys(tenantData) as TenantDataTable[]).filter((name) => tenantData[name].move.do === action);
}

/** The tables an erase deletes from before its commit (the commit deletes the catalog row itself). */
export type ErasedTable = {
  [K in TenantDataTable]: (typeof tenantData)[K]["erase"] extends { do: "delete"; stage: infer S }
    ? S extends "commit"
      ? never
      : K
    : never;
}[TenantDataTable];

/** The erase stage that deletes each table's rows, for the commit's re-check (core/erase.ts). */
export function eraseStageOf(table: ErasedTable): EraseStage {
  const action: EraseAction = tenantData[table].erase;
  return action.do === "delete" ? action.stage : "keys";
}

/** Every table an erase deletes from before its commit. */
export const erasedTables = (Object.keys(tenantData) as TenantDataTable[]).filter(
  (name): name is ErasedTable => {
    const action: EraseAction = tenantData[name].erase;
    return action.do === "delete" && action.stage !== "commit";
  },
);

/**
 * The tables an erase deletes from at `stage`, in the declaration's order (which is the order they
 * are deleted in: `usageDeltas` before `usageRollups`).
 */
export function tablesErasedAt(stage: EraseStage): ErasedTable[] {
  return erasedTables.filter((name) => eraseStageOf(name) === stage);
}
