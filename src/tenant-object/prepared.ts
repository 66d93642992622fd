/**
 * Prepared transactions a tenant's connection left: never kept. A `PREPARE TRANSACTION` outlives
 * the lease, the pool and a restart, and pins the host's horizon; `/sql` and the wire refuse it and
 * roll it back at once (execute.ts, wire-server.ts).
 */
import type { PoolClient } from "@neondatabase/serverless";
import { dollarQuote, quoteIdent } from "../tenant-db/host-admin.ts";

/**
 * Rolls back every prepared transaction in the connection's database that its login role may finish:
 * its own, and those of a role it may `SET ROLE` to (an end user's statements run as the configured
 * role, so what they prepare is that role's). Found through `pg_catalog` whatever the session's
 * `search_path`, named with a dollar-quoted literal whatever its gid and whatever
 * `standard_conforming_strings` says. What is left (none a tenant can make) is the reconcile's and
 * the erase's, through the admin role.
 */
export async function rollBackPreparedTransactions(client: PoolClient): Promise<number> {
  const { rows } = await client.query<{ gid: string; owner: string; own: boolean }>(preparedByThisLoginSql);
  for (const { gid, owner, own } of rows) {
    if (own) {
      await client.query(`ROLLBACK PREPARED ${dollarQuote(gid)}`);
      continue;
    }
    await client.query(`SET ROLE ${quoteIdent(owner)}`);
    try {
      await client.query(`ROLLBACK PREPARED ${dollarQuote(gid)}`);
    } finally {
      await client.query("RESET ROLE");
    }
  }
  return rows.length;
}

const preparedByThisLoginSql = `
SELECT x.gid, x.owner::pg_catalog.text AS owner, x.owner OPERATOR(pg_catalog.=) SESSION_USER AS own
  FROM pg_catalog.pg_prepared_xacts x
 WHERE x.database OPERATOR(pg_catalog.=) pg_catalog.current_database()
   AND (x.owner OPERATOR(pg_catalog.=) SESSION_USER OR pg_catalog.pg_has_role(SESSION_USER, x.owner, 'SET'))`;
