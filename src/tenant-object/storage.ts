/**
 * The TenantObject's own SQLite storage: the tenant record and lifecycle (`kv`), the two outboxes
 * (lifecycle events, usage) and the session-lease tokens. The schema is storage-schema.ts,
 * versioned by drizzle-kit migrations (drizzle/tenant-object/).
 *
 * The tables are created only once the object knows its tenant exists (`open`), so an object that
 * a request conjured for an id that was never provisioned leaves no storage behind. Until then
 * every read answers "nothing stored" and a write is a programming error.
 */
import { asc, eq, lte, sql } from "drizzle-orm";
import { type DrizzleSqliteDODatabase, drizzle } from "drizzle-orm/durable-sqlite";
import { migrate } from "drizzle-orm/durable-sqlite/migrator";
import type { LifecycleEventRow } from "../control-plane/index.ts";
import { tenantObjectMigrations } from "../migrations/tenant-object.gen.ts";
import type { UsageCounters, UsageDeltaRow } from "../usage/index.ts";
import {
  kv,
  outbox,
  type StoredValues,
  sessionTokens,
  tenantObjectSchema,
  usageOutbox,
} from "./storage-schema.ts";

/** Rows one flush sends to the control plane, at most. */
const flushBatch = 500;
/**
 * Rows each outbox keeps while the control plane is away. Past it, the oldest rows no flush has
 * tried yet are summarised into one (usage summed; events counted), never silently dropped.
 */
export const outboxBound = 1_000;

export interface SessionTokenRow {
  generation: number;
  /** How the lease ended, if it ended in a way its owner must be told about. */
  ended: "lost" | "expired" | null;
}

/** `session_tokens.lost`: 0 live (or ended by a stop), 1 the connection died, 2 it expired and was reclaimed. */
const endedCodes = { lost: 1, expired: 2 } as const;

export class TenantStorage {
  private db: DrizzleSqliteDODatabase<typeof tenantObjectSchema> | null = null;
  private written = 0;
  /** What the tables are written through: the object's storage, counting the rows each statement writes. */
  private readonly counting: DurableObjectStorage;

  constructor(private readonly storage: DurableObjectStorage) {
    this.counting = countingRowsWritten(storage, (rows) => {
      this.written += rows;
    });
  }

  /**
   * Rows this instance's statements have written (inserted, updated or deleted): what Cloudflare
   * bills a SQLite-backed object's storage by. For the status and the bench's price of a cold start.
   */
  get rowsWritten(): number {
    return this.written;
  }

  /** Whether this object has served a tenant before (its tables exist). Reading creates nothing. */
  hasTables(): boolean {
    return (
      this.storage.sql.exec("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'kv'").toArray()
        .length > 0
    );
  }

  get isOpen(): boolean {
    return this.db !== null;
  }

  /** Creates or upgrades the tables. Call only for a tenant known to exist. Idempotent. */
  async open(): Promise<void> {
    if (this.db) return;
    const db = drizzle(this.counting, { schema: tenantObjectSchema });
    await migrate(db, tenantObjectMigrations);
    this.db = db;
  }

  /**
   * Forgets the tables after the object's storage was wiped (`deleteAll`, an erase): from here on
   * every read answers "nothing stored" until `open` creates them again for a new tenant.
   */
  forgetTables(): void {
    this.db = null;
  }

  /** Rows of every table but `kv`, for the erase's counts. */
  rowCounts(): { outbox: number; usageOutbox: number; sessionTokens: number } {
    if (!this.db) return { outbox: 0, usageOutbox: 0, sessionTokens: 0 };
    const row = this.db.get<{ outbox: number; usage: number; tokens: number }>(
      sql`SELECT (SELECT count(*) FROM ${outbox}) AS outbox, (SELECT count(*) FROM ${usageOutbox}) AS usage,
                 (SELECT count(*) FROM ${sessionTokens}) AS tokens`,
    );
    return { outbox: row.outbox, usageOutbox: row.usage, sessionTokens: row.tokens };
  }

  private get tables(): DrizzleSqliteDODatabase<typeof tenantObjectSchema> {
    if (!this.db) throw new Error("tenant object storage written before the tenant was known");
    return this.db;
  }

  /** Runs `work` in one storage transaction (all its writes commit together, or none). */
  transaction(work: () => void): void {
    this.storage.transactionSync(work);
  }

  // ── kv ─────────────────────────────────────────────────────────────────────────────────────────

  read<K extends keyof StoredValues>(key: K): StoredValues[K] | null {
    if (!this.db) return null;
    const row = this.db.select({ v: kv.v }).from(kv).where(eq(kv.k, key)).get();
    return row ? (JSON.parse(row.v) as StoredValues[K]) : null;
  }

  write<K extends keyof StoredValues>(key: K, value: StoredValues[K]): void {
    const v = JSON.stringify(value);
    this.tables.insert(kv).values({ k: key, v }).onConflictDoUpdate({ target: kv.k, set: { v } }).run();
  }

  forget(key: keyof StoredValues): void {
    if (this.db) this.db.delete(kv).where(eq(kv.k, key)).run();
  }

  /**
   * Deletes everything the object holds but the named `kv` entries, in one transaction (a move's
   * cleanup keeps its pointer: there is no moment without it).
   */
  wipeExcept(keep: readonly string[]): { outbox: number; usageOutbox: number; sessionTokens: number } {
    const counts = this.rowCounts();
    this.transaction(() => {
      this.tables.delete(outbox).run();
      this.tables.delete(usageOutbox).run();
      this.tables.delete(sessionTokens).run();
      this.tables
        .delete(kv)
        .where(
          sql`${kv.k} NOT IN (${sql.join(
            keep.map((k) => sql`${k}`),
            sql`, `,
          )})`,
        )
        .run();
    });
    return counts;
  }

  /**
   * Makes the outboxes number on above `events` and `usage` (a tenant that moved here from another
   * region: the control plane already holds its rows up to those sequence numbers, and a replay
   * of the same (tenant, seq) is ignored there). AUTOINCREMENT never goes back below a number once
   * used, so a row written at the floor and deleted again is enough. Never lowers anything.
   */
  raiseSequences(events: number, usage: number): void {
    this.transaction(() => {
      const eventsAt = this.tables.get<{ n: number | null }>(sql`SELECT max(seq) AS n FROM ${outbox}`).n ?? 0;
      if (events > eventsAt) {
        this.tables
          .insert(outbox)
          .values({ seq: events, generation: 0, fromState: "", toState: "", reason: "", at: 0, attempted: 1 })
          .run();
        this.tables.delete(outbox).where(eq(outbox.seq, events)).run();
      }
      const usageAt =
        this.tables.get<{ n: number | null }>(sql`SELECT max(seq) AS n FROM ${usageOutbox}`).n ?? 0;
      if (usage > usageAt) {
        this.tables
          .insert(usageOutbox)
          .values({
            seq: usage,
            queries: 0,
            rowsReturned: 0,
            errors: 0,
            leaseMs: 0,
            poolStarts: 0,
            at: 0,
            attempted: 1,
          })
          .run();
        this.tables.delete(usageOutbox).where(eq(usageOutbox.seq, usage)).run();
      }
    });
  }

  // ── lifecycle outbox ───────────────────────────────────────────────────────────────────────────

  appendEvent(generation: number, fromState: string, toState: string, reason: string): void {
    this.tables.insert(outbox).values({ generation, fromState, toState, reason, at: Date.now() }).run();
    this.boundEvents();
  }

  /** Past the bound, the oldest untried half of the events becomes one event that counts them. */
  private boundEvents(): void {
    const count = this.tables.get<{ n: number }>(sql`SELECT count(*) AS n FROM ${outbox}`).n;
    if (count <= outboxBound) return;
    const oldest = this.tables
      .select()
      .from(outbox)
      .where(eq(outbox.attempted, 0))
      .orderBy(asc(outbox.seq))
      .limit(Math.floor(outboxBound / 2))
      .all();
    const first = oldest[0];
    const last = oldest.at(-1);
    if (!first || !last || oldest.length < 2) return;
    this.db?.transaction((tx) => {
      tx.delete(outbox)
        .where(sql`${outbox.seq} BETWEEN ${first.seq} AND ${last.seq} AND ${outbox.attempted} = 0`)
        .run();
      tx.insert(outbox)
        .values({
          seq: first.seq,
          generation: last.generation,
          fromState: first.fromState,
          toState: last.toState,
          reason: `outbox_summarised: ${oldest.length} events from ${new Date(first.at).toISOString()} to ${new Date(last.at).toISOString()} (control plane unreachable)`,
          at: last.at,
        })
        .run();
    });
  }

  /** What the next flush sends may be appended even if the flush then fails: never summarise it. */
  markAttempted(eventsUpTo: number | null, usageUpTo: number | null): void {
    if (eventsUpTo !== null)
      this.tables.update(outbox).set({ attempted: 1 }).where(lte(outbox.seq, eventsUpTo)).run();
    if (usageUpTo !== null) {
      this.tables.update(usageOutbox).set({ attempted: 1 }).where(lte(usageOutbox.seq, usageUpTo)).run();
    }
  }

  pendingEvents(): LifecycleEventRow[] {
    if (!this.db) return [];
    return this.db.select().from(outbox).orderBy(asc(outbox.seq)).limit(flushBatch).all();
  }

  forgetEvents(upTo: number): void {
    this.tables.delete(outbox).where(lte(outbox.seq, upTo)).run();
  }

  // ── usage outbox ───────────────────────────────────────────────────────────────────────────────

  stageUsage(counters: UsageCounters): void {
    this.tables
      .insert(usageOutbox)
      .values({ ...counters, at: Date.now() })
      .run();
    this.boundUsage();
  }

  /** Past the bound, the oldest untried half of the usage rows is summed into one row. */
  private boundUsage(): void {
    const count = this.tables.get<{ n: number }>(sql`SELECT count(*) AS n FROM ${usageOutbox}`).n;
    if (count <= outboxBound) return;
    const oldest = this.tables
      .select()
      .from(usageOutbox)
      .where(eq(usageOutbox.attempted, 0))
      .orderBy(asc(usageOutbox.seq))
      .limit(Math.floor(outboxBound / 2))
      .all();
    const first = oldest[0];
    const last = oldest.at(-1);
    if (!first || !last || oldest.length < 2) return;
    const sum = (pick: (row: (typeof oldest)[number]) => number) =>
      oldest.reduce((n, row) => n + pick(row), 0);
    this.db?.transaction((tx) => {
      tx.delete(usageOutbox)
        .where(sql`${usageOutbox.seq} BETWEEN ${first.seq} AND ${last.seq} AND ${usageOutbox.attempted} = 0`)
        .run();
      // The summary takes the first row's seq: no flush ever tried it, so the control plane has none.
      tx.insert(usageOutbox)
        .values({
          seq: first.seq,
          queries: sum((r) => r.queries),
          rowsReturned: sum((r) => r.rowsReturned),
          errors: sum((r) => r.errors),
          leaseMs: sum((r) => r.leaseMs),
          poolStarts: sum((r) => r.poolStarts),
          at: first.at,
        })
        .run();
    });
  }

  pendingUsage(): UsageDeltaRow[] {
    if (!this.db) return [];
    return this.db.select().from(usageOutbox).orderBy(asc(usageOutbox.seq)).limit(flushBatch).all();
  }

  forgetUsage(upTo: number): void {
    this.tables.delete(usageOutbox).where(lte(usageOutbox.seq, upTo)).run();
  }

  /** Rows waiting in either outbox. */
  pendingOutboxRows(): number {
    if (!this.db) return 0;
    const row = this.db.get<{ n: number }>(
      sql`SELECT (SELECT count(*) FROM ${outbox}) + (SELECT count(*) FROM ${usageOutbox}) AS n`,
    );
    return row.n;
  }

  // ── session tokens ─────────────────────────────────────────────────────────────────────────────

  rememberSessionToken(tokenHash: string, generation: number, expiresAt: number): void {
    this.tables
      .insert(sessionTokens)
      .values({ tokenHash, generation, expiresAt })
      .onConflictDoUpdate({ target: sessionTokens.tokenHash, set: { generation, expiresAt, lost: 0 } })
      .run();
  }

  findSessionToken(tokenHash: string): SessionTokenRow | null {
    if (!this.db) return null;
    const row = this.db
      .select({ generation: sessionTokens.generation, lost: sessionTokens.lost })
      .from(sessionTokens)
      .where(eq(sessionTokens.tokenHash, tokenHash))
      .get();
    if (!row) return null;
    const ended = row.lost === endedCodes.lost ? "lost" : row.lost === endedCodes.expired ? "expired" : null;
    return { generation: row.generation, ended };
  }

  markSessionToken(tokenHash: string, ended: "lost" | "expired"): void {
    this.tables
      .update(sessionTokens)
      .set({ lost: endedCodes[ended] })
      .where(eq(sessionTokens.tokenHash, tokenHash))
      .run();
  }

  forgetSessionToken(tokenHash: string): void {
    this.tables.delete(sessionTokens).where(eq(sessionTokens.tokenHash, tokenHash)).run();
  }

  /** Forgets tokens that expired before `before` (nobody asks about them any more). */
  trimSessionTokens(before: number): void {
    if (!this.db) return;
    this.db.delete(sessionTokens).where(lte(sessionTokens.expiresAt, before)).run();
  }
}

/**
 * The object's storage as drizzle sees it, except that every statement's `rowsWritten` is counted
 * (drizzle's durable-sqlite driver runs everything through `sql.exec` and `transactionSync`). A
 * write statement without RETURNING has run by the time `exec` returns, so its count is final then.
 */
function countingRowsWritten(
  storage: DurableObjectStorage,
  count: (rows: number) => void,
): DurableObjectStorage {
  const sql = storage.sql;
  const countingSql = {
    exec(query: string, ...bindings: unknown[]) {
      const cursor = sql.exec(query, ...bindings);
      count(cursor.rowsWritten);
      return cursor;
    },
    get databaseSize() {
      return sql.databaseSize;
    },
  };
  return new Proxy(storage, {
    get(target, property) {
      if (property === "sql") return countingSql;
      const value: unknown = Reflect.get(target, property);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}
