/**
 * A connection Lessor ends is over when Postgres says so (docs/invariants.md invariant 2: the
 * budget is a count of backends, not of sockets). The driver's `Pool.end()` settled once it had
 * asked its idle connections to end, not once they had: a pool that stopped (an eviction, a drain)
 * released its budget while its backends were still exiting, the budget gave their places to
 * another pool, and the host held one backend more than its budget (the adaptive storm's 11 of 10
 * in Postgres's own log, test/integration/adaptive.test.ts, while the ledger never passed 10).
 * And a connection whose server never closed after Terminate left the driver's `end()` pending
 * for ever; it is now cut past its bound.
 *
 * The condition is made, not waited for: the connection owns a temporary table, and a superuser
 * holds a lock on it, so its backend, told to end, blocks dropping the table (what a tenant's
 * thousands of temporary tables do for longer). The end must not settle while the backend is in
 * Postgres's count, and once it settles the backend is gone. Through the real driver, the real
 * WebSocket proxy and the real Postgres, for one connection and for a whole pool (`endPool`).
 */
import { env } from "cloudflare:workers";
import { type Client, Pool } from "@neondatabase/serverless";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.ts";
import { configuredClientClass } from "../../src/postgres/clients.ts";
import { endPool } from "../../src/postgres/index.ts";
import { asSuperuser, pollUntil } from "./harness.ts";

const config = loadConfig(env);
/** Who the ended connection is does not matter (the host's maintenance database refuses its admin TEMP). */
const victimUrl = env.TEST_PG_SUPERUSER_URL;

/** Gives `client`'s session a temporary table and answers its backend's pid and the table's name. */
async function ownTempTable(client: Pick<Client, "query">): Promise<{ pid: number; table: string }> {
  await client.query("CREATE TEMPORARY TABLE lessor_exit_trap (x int)");
  const { rows } = await client.query(
    "SELECT pg_backend_pid() AS pid, pg_my_temp_schema()::regnamespace::text AS schema",
  );
  const row = rows[0] as { pid: number; schema: string };
  return { pid: row.pid, table: `${row.schema}.lessor_exit_trap` };
}

/** Whether each of `pids` is still a backend, and what it waits on. */
async function backends(superuser: Client, pids: readonly number[]): Promise<Map<number, string | null>> {
  const { rows } = await superuser.query(
    "SELECT pid, wait_event_type FROM pg_catalog.pg_stat_activity WHERE pid = ANY($1::int[])",
    [pids],
  );
  return new Map(
    rows.map((row: { pid: number; wait_event_type: string | null }) => [row.pid, row.wait_event_type]),
  );
}

/**
 * Holds a lock on each table in an open transaction of `superuser`, runs `end`, waits until every
 * backend is blocked exiting (the condition landed), checks `end` has not settled, lets go, and
 * checks the backends are gone the moment `end` settles.
 */
async function endWhileExitIsHeld(
  superuser: Client,
  traps: { pid: number; table: string }[],
  end: () => Promise<unknown>,
) {
  await superuser.query("BEGIN");
  for (const trap of traps) await superuser.query(`LOCK TABLE ${trap.table} IN ACCESS SHARE MODE`);
  let settled = false;
  const ending = end().finally(() => {
    settled = true;
  });
  const pids = traps.map((trap) => trap.pid);
  const held = await pollUntil(
    () => backends(superuser, pids),
    (seen) => pids.every((pid) => seen.get(pid) === "Lock"),
    { attempts: 100, intervalMs: 20 },
  );
  // Every backend was told to end and is exiting, blocked on the lock: still in Postgres's count.
  expect(pids.map((pid) => held.get(pid))).toEqual(pids.map(() => "Lock"));
  expect(settled, "end() settled while its backend was still in Postgres's count").toBe(false);
  await superuser.query("COMMIT");
  await ending;
  expect([...(await backends(superuser, pids)).keys()]).toEqual([]);
}

describe("ending a connection", () => {
  it("one connection's end settles only once its backend has gone", async () => {
    const Configured = configuredClientClass(config);
    const client = new Configured(victimUrl);
    client.on("error", () => undefined);
    await client.connect();
    const trap = await ownTempTable(client);
    await asSuperuser((superuser) => endWhileExitIsHeld(superuser, [trap], () => client.end()));
  });

  it("a pool's end (endPool) settles only once every backend of it has gone", async () => {
    const pool = new Pool({ connectionString: victimUrl, max: 3, idleTimeoutMillis: 0 });
    pool.Client = configuredClientClass(config);
    pool.on("error", () => undefined);
    const clients = await Promise.all([pool.connect(), pool.connect(), pool.connect()]);
    const traps: { pid: number; table: string }[] = [];
    for (const client of clients) traps.push(await ownTempTable(client));
    for (const client of clients) client.release();
    await asSuperuser((superuser) =>
      endWhileExitIsHeld(superuser, traps, async () => expect(await endPool(pool)).toBe("ended")),
    );
  });

  it("an end the server never answers is still over within its bound, and cut", async () => {
    const Configured = configuredClientClass(config);
    const client = new Configured(victimUrl);
    client.on("error", () => undefined);
    await client.connect();
    const trap = await ownTempTable(client);
    await asSuperuser(async (superuser) => {
      await superuser.query("BEGIN");
      await superuser.query(`LOCK TABLE ${trap.table} IN ACCESS SHARE MODE`);
      // Held until the end settled: the backend cannot exit before, so only the bound ends it.
      await client.end();
      expect((await backends(superuser, [trap.pid])).get(trap.pid)).toBe("Lock");
      await superuser.query("COMMIT");
      const gone = await pollUntil(
        () => backends(superuser, [trap.pid]),
        (seen) => seen.size === 0,
        { attempts: 100, intervalMs: 20 },
      );
      expect(gone.size).toBe(0);
    });
  });
});
