/**
 * A tenant's keys in the catalog: issue, list, revoke. Every change takes the tenant's catalog row
 * `FOR UPDATE` first, so concurrent issues and revokes of one tenant are serialised and the limit
 * on usable keys holds under any interleaving.
 */
import { and, asc, eq, gt, isNull, or, sql } from "drizzle-orm";
import { LessorError } from "../errors/index.ts";
import type { ControlPlane } from "./index.ts";
import { tenantKeys, tenants } from "./schema.ts";

export type KeyRow = typeof tenantKeys.$inferSelect;

/** The condition of a key that still works. */
const usable = and(
  isNull(tenantKeys.revokedAt),
  or(isNull(tenantKeys.expiresAt), gt(tenantKeys.expiresAt, sql`now()`)),
);

/**
 * Locks the tenant's catalog row for the rest of the transaction; refuses an unknown tenant, and
 * one being erased (its gate is closed: no key is issued for it any more).
 */
async function lockTenant(tx: Pick<ControlPlane, "select">, tenantId: string): Promise<void> {
  const [row] = await tx
    .select({ status: tenants.status })
    .from(tenants)
    .where(and(eq(tenants.id, tenantId), sql`${tenants.status} <> 'provisioning'`))
    .for("update");
  if (!row) throw new LessorError("tenant_not_found");
  if (row.status === "erasing") throw new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
  // A key is issued where the tenant lives: not while it moves, not in the region it left.
  if (row.status === "moving") throw new LessorError("tenant_moving", { retryAfterSeconds: 5 });
  if (row.status === "moved") throw new LessorError("tenant_moved");
}

/** Adds a key, unless the tenant already holds `limit` usable keys. */
export async function issueKey(
  db: ControlPlane,
  key: { tenantId: string; keyId: string; keyHash: string; expiresAt: Date | null; scope: "full" | "jwt" },
  limit: number,
): Promise<KeyRow> {
  return db.transaction(async (tx) => {
    await lockTenant(tx, key.tenantId);
    const [counted] = await tx
      .select({ n: sql<number>`count(*)::int` })
      .from(tenantKeys)
      .where(and(eq(tenantKeys.tenantId, key.tenantId), usable));
    if ((counted?.n ?? 0) >= limit) {
      throw new LessorError("key_limit", {
        publicMessage: `A tenant holds at most ${limit} keys (LESSOR_MAX_KEYS_PER_TENANT); revoke one first.`,
      });
    }
    const [row] = await tx.insert(tenantKeys).values(key).returning();
    if (!row) throw new LessorError("internal", { internal: "key insert returned nothing" });
    return row;
  });
}

/** The tenant's keys that are not revoked (expired ones too, so an operator sees them), oldest first. */
export function listKeys(db: ControlPlane, tenantId: string): Promise<KeyRow[]> {
  return db
    .select()
    .from(tenantKeys)
    .where(and(eq(tenantKeys.tenantId, tenantId), isNull(tenantKeys.revokedAt)))
    .orderBy(asc(tenantKeys.createdAt));
}

/**
 * Revokes a key. Revoking the tenant's last usable key is refused unless `force` (the tenant
 * would be locked out until an operator issues a new one). Revoking a revoked key changes nothing
 * and succeeds, so a revoke whose answer was lost can be sent again.
 */
export async function revokeKey(
  db: ControlPlane,
  tenantId: string,
  keyId: string,
  force: boolean,
): Promise<void> {
  await db.transaction(async (tx) => {
    await lockTenant(tx, tenantId);
    const [key] = await tx
      .select({ revokedAt: tenantKeys.revokedAt })
      .from(tenantKeys)
      .where(and(eq(tenantKeys.tenantId, tenantId), eq(tenantKeys.keyId, keyId)));
    if (!key) throw new LessorError("key_not_found");
    if (key.revokedAt) return;
    const [others] = await tx
      .select({ n: sql<number>`count(*)::int` })
      .from(tenantKeys)
      .where(and(eq(tenantKeys.tenantId, tenantId), usable, sql`${tenantKeys.keyId} <> ${keyId}`));
    if ((others?.n ?? 0) === 0 && !force) throw new LessorError("last_key");
    await tx
      .update(tenantKeys)
      .set({ revokedAt: sql`now()` })
      .where(and(eq(tenantKeys.tenantId, tenantId), eq(tenantKeys.keyId, keyId)));
  });
}
