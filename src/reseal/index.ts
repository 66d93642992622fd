/**
 * Reseal: brings every sealed credential in the catalog under the current key of the
 * `LESSOR_SEAL_KEY` ring, so an old key can leave it (docs/adr/015-seal-key-ring.md).
 *
 * One batch reads, keyset-paged by tenant id, the credentials not yet under the current key,
 * opens each with the key it names, seals it again under the current key, and writes it back only
 * if the row still holds what was read (a rotation or a create that wrote meanwhile wins: its
 * value is newer and already under the current key). `sealed_at` is left alone: a reseal changes
 * how a password is kept, not the password, so the rotation policy's clock does not move.
 *
 * Every step is idempotent: a value already under the current key is never selected, so a run
 * killed half way and started again from the beginning picks up exactly what is left. A value
 * that cannot be opened (its key already left the ring, or it was altered) is reported with its
 * key id and passed over, so one bad row never stops the fleet.
 */
import { and, asc, gt, sql } from "drizzle-orm";
import type { ControlPlane } from "../control-plane/index.ts";
import { tenantCredentials } from "../control-plane/schema.ts";
import { resealUnderCurrentKey, sealKeyIdOf, sealRingSummary } from "../crypto/seal.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";

/** Rows one batch reads at most: a few milliseconds of AES-GCM, one UPDATE. */
export const maxResealBatch = 500;

/** Which credentials a reseal covers: tenant ids starting with `prefix` ("" for all), after `after`. */
export interface ResealScope {
  prefix: string;
  after: string | null;
  limit: number;
}

export interface SealedRow {
  tenantId: string;
  sealed: string;
}

/** Why a credential could not be moved to the current key. */
export type ResealProblem = "key_missing" | "did_not_open" | "unknown_format";

export interface ResealFailure {
  tenantId: string;
  /** The key the value names (`k0` for a v1 value); null if it is not a sealed value at all. */
  keyId: string | null;
  problem: ResealProblem;
}

/** One batch's outcome, as `POST /v1/credentials/reseal` answers it. */
export interface ResealProgress {
  currentKeyId: string;
  /** Rewritten under the current key by this batch. */
  resealed: number;
  /** Changed by someone else (a rotation, a create) between this batch's read and its write: left as written. */
  skipped: number;
  /** Could not be opened: still under their old key (or broken). */
  failed: ResealFailure[];
  /** Credentials in the scope not under the current key after this batch (the failed ones included). */
  remaining: number;
  /** Pass as `after` for the next batch; null once the scope has been walked to its end. */
  cursor: string | null;
  done: boolean;
}

function inScope(scope: { prefix: string }) {
  return scope.prefix === "" ? undefined : sql`starts_with(${tenantCredentials.tenantId}, ${scope.prefix})`;
}

function notUnder(prefixes: readonly string[]) {
  return and(
    ...prefixes.map((prefix) => sql`NOT starts_with(${tenantCredentials.sealedPassword}, ${prefix})`),
  );
}

/** The next page of credentials in the scope that are not under the current key, by tenant id. */
export async function readResealPage(
  db: ControlPlane,
  secret: string,
  scope: ResealScope,
): Promise<{ currentKeyId: string; rows: SealedRow[] }> {
  const ring = await sealRingSummary(secret);
  const rows = await db
    .select({ tenantId: tenantCredentials.tenantId, sealed: tenantCredentials.sealedPassword })
    .from(tenantCredentials)
    .where(
      and(
        inScope(scope),
        scope.after === null ? undefined : gt(tenantCredentials.tenantId, scope.after),
        notUnder(ring.currentPrefixes),
      ),
    )
    .orderBy(asc(tenantCredentials.tenantId))
    .limit(scope.limit);
  return { currentKeyId: ring.current, rows };
}

/** A value to write: `next` replaces `previous` only if the row still holds `previous`. */
export interface Resealed {
  tenantId: string;
  previous: string;
  next: string;
}

/** Seals each row again under the current key (no I/O); what cannot be opened is a failure. */
export async function resealRows(
  secret: string,
  rows: readonly SealedRow[],
): Promise<{ resealed: Resealed[]; failed: ResealFailure[] }> {
  const ring = await sealRingSummary(secret);
  const resealed: Resealed[] = [];
  const failed: ResealFailure[] = [];
  for (const row of rows) {
    try {
      const next = await resealUnderCurrentKey(secret, row.tenantId, row.sealed);
      if (next !== null) resealed.push({ tenantId: row.tenantId, previous: row.sealed, next });
    } catch (error) {
      const keyId = sealKeyIdOf(row.sealed);
      const problem: ResealProblem =
        keyId === null ? "unknown_format" : ring.keyIds.includes(keyId) ? "did_not_open" : "key_missing";
      failed.push({ tenantId: row.tenantId, keyId, problem });
      logEvent("warn", "reseal_failed", {
        tenant: row.tenantId,
        keyId,
        problem,
        failure: describeFailure(error),
      });
    }
  }
  return { resealed, failed };
}

/**
 * Writes the resealed values in one statement, each only where the row still holds the value that
 * was read (compare-and-set), and leaves `sealed_at` alone.
 */
export async function writeResealed(
  db: ControlPlane,
  items: readonly Resealed[],
): Promise<{ resealed: number; skipped: number }> {
  if (items.length === 0) return { resealed: 0, skipped: 0 };
  const { rows } = await db.$client.query(
    `UPDATE tenant_credentials AS c
        SET sealed_password = v.next
       FROM unnest($1::text[], $2::text[], $3::text[]) AS v(tenant_id, previous, next)
      WHERE c.tenant_id = v.tenant_id AND c.sealed_password = v.previous
      RETURNING c.tenant_id`,
    [items.map((i) => i.tenantId), items.map((i) => i.previous), items.map((i) => i.next)],
  );
  return { resealed: rows.length, skipped: items.length - rows.length };
}

/** Credentials in the scope (from its beginning) not under the current key. */
export async function countNotUnderCurrentKey(
  db: ControlPlane,
  secret: string,
  scope: { prefix: string },
): Promise<number> {
  const ring = await sealRingSummary(secret);
  const [row] = await db
    .select({ n: sql<number>`count(*)::int` })
    .from(tenantCredentials)
    .where(and(inScope(scope), notUnder(ring.currentPrefixes)));
  return Number(row?.n ?? 0);
}

/** One bounded batch: read a page, reseal it, write it, count what is left. */
export async function resealBatch(
  db: ControlPlane,
  secret: string,
  scope: ResealScope,
): Promise<ResealProgress> {
  const page = await readResealPage(db, secret, scope);
  const { resealed, failed } = await resealRows(secret, page.rows);
  const written = await writeResealed(db, resealed);
  const remaining = await countNotUnderCurrentKey(db, secret, scope);
  const done = page.rows.length < scope.limit;
  return {
    currentKeyId: page.currentKeyId,
    resealed: written.resealed,
    skipped: written.skipped,
    failed,
    remaining,
    cursor: done ? null : (page.rows.at(-1)?.tenantId ?? null),
    done,
  };
}
