/**
 * Benchmark of the append-only usage bookkeeping and its fold (npm run bench:fold).
 *
 * On a throwaway Postgres (the same embedded Postgres and migrations as `npm start`):
 * 1. the cost of an append: rows/s and µs per appended delta, one row per statement (a flush of
 *    one batch) and 500 rows per statement (a full outbox flush), with the statement the
 *    TenantObject sends (src/usage/index.ts, written out here because drizzle builds it there);
 * 2. fold throughput in rows/s at 10⁵ and 10⁶ waiting deltas, running the Worker's own fold
 *    (src/folds/fold.ts, the same SQL text) from Node with node-postgres, until drained.
 *
 * Everything runs over loopback TCP from Node, not through the Worker and the Neon WebSocket, so
 * it measures Postgres work, not network round trips. Prints a table and writes
 * bench/results/fold-<date>.json.
 */
import { mkdir, writeFile } from "node:fs/promises";
import { resolve } from "node:path";
import pg from "pg";
import { freePort, startLocalStack } from "../local/stack.ts";
import { runFold } from "../src/folds/fold.ts";
import { defaultFoldOptions } from "../src/folds/options.ts";

const root = resolve(import.meta.dirname, "..");
const tenants = 1_000;

const columns = "(tenant_id, seq, queries, rows_returned, errors, lease_ms, pool_starts, at)";

/** `INSERT … VALUES (…), (…) ON CONFLICT DO NOTHING`, as drizzle renders `appendUsageDeltas`. */
function appendSql(rows: number): string {
  const values = Array.from({ length: rows }, (_, r) => {
    const p = r * 8;
    return `($${p + 1}, $${p + 2}, $${p + 3}, $${p + 4}, $${p + 5}, $${p + 6}, $${p + 7}, $${p + 8})`;
  });
  return `INSERT INTO usage_deltas ${columns} VALUES ${values.join(", ")} ON CONFLICT DO NOTHING`;
}

interface AppendResult {
  mode: string;
  rowsPerStatement: number;
  statements: number;
  rows: number;
  seconds: number;
  rowsPerSecond: number;
  microsPerRow: number;
  microsPerStatement: number;
}

async function measureAppends(
  client: pg.Client,
  mode: string,
  rowsPerStatement: number,
  statements: number,
  seqBase: number,
): Promise<AppendResult> {
  const text = appendSql(rowsPerStatement);
  const at = new Date();
  const nextSeq = new Map<number, number>();
  const started = process.hrtime.bigint();
  for (let s = 0; s < statements; s++) {
    const tenant = s % tenants;
    const params: unknown[] = [];
    for (let r = 0; r < rowsPerStatement; r++) {
      const seq = (nextSeq.get(tenant) ?? seqBase) + 1;
      nextSeq.set(tenant, seq);
      params.push(`bench-${tenant}`, seq, 10, 25, 0, 40, 0, at);
    }
    await client.query(text, params);
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const rows = rowsPerStatement * statements;
  return {
    mode,
    rowsPerStatement,
    statements,
    rows,
    seconds,
    rowsPerSecond: rows / seconds,
    microsPerRow: (seconds * 1e6) / rows,
    microsPerStatement: (seconds * 1e6) / statements,
  };
}

interface FoldResult {
  deltas: number;
  batchSize: number;
  runs: number;
  seconds: number;
  rowsPerSecond: number;
  deadTuplesAfterVacuum: number;
  rollupTotalsExact: boolean;
}

async function scalar(client: pg.Client, text: string): Promise<number> {
  const { rows } = await client.query<{ v: string }>(text);
  return Number(rows[0]?.v ?? Number.NaN);
}

async function measureFold(client: pg.Client, deltas: number, batchSize: number): Promise<FoldResult> {
  await client.query("TRUNCATE usage_deltas, usage_rollups, fold_outcomes");
  // `deltas` rows spread over `tenants` tenants, each tenant's seqs 1, 2, 3, …
  await client.query(
    `INSERT INTO usage_deltas ${columns}
     SELECT 'bench-' || (g % $2), g / $2 + 1, 10, 25, g % 2, 40, 0, now()
       FROM generate_series(0, $1::int - 1) g`,
    [deltas, tenants],
  );
  await client.query("VACUUM ANALYZE usage_deltas");
  const expectedQueries = await scalar(client, "SELECT sum(queries)::text AS v FROM usage_deltas");

  const options = { ...defaultFoldOptions, batchSize };
  let runs = 0;
  const started = process.hrtime.bigint();
  for (;;) {
    const run = await runFold(client, options, { scheduledAt: null });
    runs++;
    if (run.outcome.kind !== "folded") throw new Error(`fold did not run: ${run.outcome.kind}`);
    if (!run.outcome.backlogRemains) break;
  }
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;

  const left = await scalar(client, "SELECT count(*)::text AS v FROM usage_deltas");
  if (left !== 0) throw new Error(`${left} deltas left after the fold`);
  const folded = await scalar(client, "SELECT sum(queries)::text AS v FROM usage_rollups");
  await client.query("VACUUM usage_deltas, usage_rollups");
  const dead = await scalar(
    client,
    `SELECT ((SELECT dead_tuple_count FROM pgstattuple('usage_deltas'))
           + (SELECT dead_tuple_count FROM pgstattuple('usage_rollups')))::text AS v`,
  );
  return {
    deltas,
    batchSize,
    runs,
    seconds,
    rowsPerSecond: deltas / seconds,
    deadTuplesAfterVacuum: dead,
    rollupTotalsExact: folded === expectedQueries,
  };
}

function table(headers: string[], rows: (string | number)[][]): string {
  const cells = [headers, ...rows.map((row) => row.map(String))];
  const widths = headers.map((_, i) => Math.max(...cells.map((row) => (row[i] ?? "").length)));
  const line = (row: string[]) => row.map((cell, i) => cell.padStart(widths[i] ?? 0)).join("  ");
  return [line(headers), line(widths.map((w) => "-".repeat(w))), ...cells.slice(1).map(line)].join("\n");
}

const fmt = (n: number, digits = 0) => n.toLocaleString("en-US", { maximumFractionDigits: digits });

async function main(): Promise<void> {
  const stack = await startLocalStack({
    dataDir: resolve(root, ".lessor/bench-fold-pg"),
    pgPort: await freePort(),
    pgPassword: "bench-fold",
    persistent: false,
  });
  const client = new pg.Client(stack.controlPlaneUrl);
  await client.connect();
  try {
    await client.query("CREATE EXTENSION IF NOT EXISTS pgstattuple");
    const version = await client.query<{ v: string }>("SELECT current_setting('server_version') AS v");

    // Warm up the connection and the plans before measuring.
    await measureAppends(client, "warm-up", 1, 200, 1_000_000_000);
    await measureAppends(client, "warm-up", 500, 4, 1_100_000_000);
    await client.query("TRUNCATE usage_deltas");
    const updatesBefore = await scalar(
      client,
      "SELECT (n_tup_upd + n_tup_del)::text AS v FROM pg_stat_user_tables WHERE relname = 'usage_deltas'",
    );
    const appends = [
      await measureAppends(client, "single", 1, 5_000, 0),
      await measureAppends(client, "batched", 500, 200, 10_000),
    ];
    await client.query("SELECT pg_stat_force_next_flush()");
    const updatesAfter = await scalar(
      client,
      "SELECT (n_tup_upd + n_tup_del)::text AS v FROM pg_stat_user_tables WHERE relname = 'usage_deltas'",
    );

    const folds: FoldResult[] = [];
    for (const deltas of [100_000, 1_000_000]) {
      folds.push(await measureFold(client, deltas, defaultFoldOptions.batchSize));
    }
    folds.push(await measureFold(client, 1_000_000, 1_000_000));

    console.log(`\nAppend cost (Postgres ${version.rows[0]?.v}, loopback, one connection)\n`);
    console.log(
      table(
        ["mode", "rows/stmt", "rows", "rows/s", "µs/row", "µs/stmt"],
        appends.map((a) => [
          a.mode,
          a.rowsPerStatement,
          fmt(a.rows),
          fmt(a.rowsPerSecond),
          fmt(a.microsPerRow, 1),
          fmt(a.microsPerStatement, 1),
        ]),
      ),
    );
    console.log(`UPDATEs + DELETEs on usage_deltas while appending: ${updatesAfter - updatesBefore}`);
    console.log(`\nFold throughput (${tenants} tenants)\n`);
    console.log(
      table(
        ["deltas", "batch", "runs", "seconds", "rows/s", "dead after VACUUM", "exact"],
        folds.map((f) => [
          fmt(f.deltas),
          fmt(f.batchSize),
          f.runs,
          fmt(f.seconds, 2),
          fmt(f.rowsPerSecond),
          f.deadTuplesAfterVacuum,
          f.rollupTotalsExact ? "yes" : "NO",
        ]),
      ),
    );

    const date = new Date().toISOString();
    const file = resolve(root, `bench/results/fold-${date.slice(0, 10)}.json`);
    await mkdir(resolve(root, "bench/results"), { recursive: true });
    await writeFile(
      file,
      `${JSON.stringify(
        {
          date,
          postgres: version.rows[0]?.v,
          node: process.version,
          tenants,
          appends,
          appendUpdatesAndDeletes: updatesAfter - updatesBefore,
          folds,
        },
        null,
        2,
      )}\n`,
    );
    console.log(`\nwrote ${file}`);
  } finally {
    await client.end().catch(() => undefined);
    await stack.stop();
  }
}

await main();
