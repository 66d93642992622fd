/**
 * Applies the bundled tenant migrations to one tenant database.
 *
 * The database keeps its own ledger, `lessor.schema_migrations`, written in the same transaction
 * as the migration it records: a crash can never fall between applying a migration and recording
 * it. The runner always reads the database's real version, takes a per-database advisory lock so
 * two runners never apply the same step, and refuses to run if an applied migration's checksum no
 * longer matches the bundle (someone edited an applied migration).
 */
import type { Queryable } from "../postgres/queryable.ts";

export interface TenantMigration {
  /** 1-based, dense: version N is the N-th migration. */
  version: number;
  name: string;
  kind: "expand" | "contract";
  checksum: string;
  statements: string[];
}

export class MigrationError extends Error {
  override readonly name = "MigrationError";
  constructor(
    message: string,
    readonly version: number | null,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** Key of the advisory lock every migration runner takes in a tenant database. */
export const migrationLockKey = 0x1e55_0001;

// Lessor's own statements here name every type and function with its schema: the migration runs
// as the tenant's role, in a database whose `public` the tenant fills.
const ledgerDdl = `
  CREATE SCHEMA IF NOT EXISTS lessor;
  CREATE TABLE IF NOT EXISTS lessor.schema_migrations (
    version pg_catalog.int4 PRIMARY KEY,
    name pg_catalog.text NOT NULL,
    kind pg_catalog.text NOT NULL,
    checksum pg_catalog.text NOT NULL,
    applied_at pg_catalog.timestamptz NOT NULL DEFAULT pg_catalog.now()
  )`;

/** The database's real schema version: the highest version its own ledger records (0 if none). */
export async function readSchemaVersion(db: Queryable): Promise<number> {
  const { rows } = await db.query(
    `SELECT CASE WHEN pg_catalog.to_regclass('lessor.schema_migrations') IS NULL THEN 0
            ELSE (SELECT COALESCE(pg_catalog.max(m.version), 0) FROM lessor.schema_migrations m) END AS version`,
  );
  return Number(rows[0]?.version ?? 0);
}

export interface MigrationRun {
  fromVersion: number;
  toVersion: number;
  applied: number[];
}

/**
 * Brings the database to `targetVersion` (default: the newest bundled). Holds a session advisory
 * lock for the duration; a second runner waits for it and then finds nothing left to do.
 */
export async function migrateTenantDatabase(
  db: Queryable,
  migrations: readonly TenantMigration[],
  targetVersion: number = migrations.length,
): Promise<MigrationRun> {
  if (targetVersion < 0 || targetVersion > migrations.length) {
    throw new MigrationError(`target version ${targetVersion} is not bundled`, null);
  }
  await db.query(ledgerDdl);
  // Waiting for another runner is bounded by the caller's deadline, not by the session's lock
  // timeout (which bounds the steps' own DDL lock waits, so tenant traffic never queues long).
  await db.query("SET lock_timeout = 0");
  await db.query("SELECT pg_catalog.pg_advisory_lock($1::pg_catalog.int8)", [migrationLockKey]);
  await db.query("RESET lock_timeout");
  try {
    const { rows } = await db.query(
      "SELECT m.version, m.checksum FROM lessor.schema_migrations m ORDER BY m.version USING OPERATOR(pg_catalog.<)",
    );
    const applied = new Map(rows.map((row) => [Number(row.version), String(row.checksum)]));
    for (const [version, checksum] of applied) {
      const bundled = migrations[version - 1];
      if (bundled && bundled.checksum !== checksum) {
        throw new MigrationError(
          `migration ${version} (${bundled.name}) was edited after it was applied; add a new migration instead`,
          version,
        );
      }
    }
    const fromVersion = Math.max(0, ...applied.keys());
    const done: number[] = [];
    for (const migration of migrations) {
      if (migration.version > targetVersion || applied.has(migration.version)) continue;
      await db.query("BEGIN");
      try {
        for (const statement of migration.statements) await db.query(statement);
        await db.query(
          "INSERT INTO lessor.schema_migrations (version, name, kind, checksum) VALUES ($1, $2, $3, $4)",
          [migration.version, migration.name, migration.kind, migration.checksum],
        );
        await db.query("COMMIT");
      } catch (cause) {
        await db.query("ROLLBACK").catch(() => undefined);
        throw new MigrationError(
          `migration ${migration.version} (${migration.name}) failed`,
          migration.version,
          {
            cause,
          },
        );
      }
      done.push(migration.version);
    }
    return { fromVersion, toVersion: Math.max(fromVersion, ...done), applied: done };
  } finally {
    await db
      .query("SELECT pg_catalog.pg_advisory_unlock($1::pg_catalog.int8)", [migrationLockKey])
      .catch(() => undefined);
  }
}
