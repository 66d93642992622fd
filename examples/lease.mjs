// @ts-check
// A session lease with lessor/client: one connection held across requests, for a transaction that
// reads, decides in code, then writes. Rows come back typed as neon() types them.
//
//   LESSOR_CONNECTION_STRING='postgres://acme:lsk_…@127.0.0.1:8787/acme' npx node examples/lease.mjs
//
// lessor/client ships from this repository as TypeScript: run this from the Lessor checkout with
// Node 22.18 or newer, which runs TypeScript as it is (`npx node examples/lease.mjs` uses the
// checkout's own Node 22).
// `notes` is a table of Lessor's example tenant schema (src/tenant-db/schema.ts).
import { createClient } from "lessor/client";

/**
 * Stars a note (adding it the first time) in one interactive transaction on a session lease: read,
 * decide in code, write, on one connection.
 * @param {{ connectionString?: string, lessorUrl?: string, fetchFunction?: (url: string, init: RequestInit) => Promise<Response> }} [options]
 *   the environment's unless given; the tests give Lessor's fetch handler as `fetchFunction`
 */
export async function main({
  connectionString = process.env.LESSOR_CONNECTION_STRING,
  lessorUrl = process.env.LESSOR_URL,
  fetchFunction,
} = {}) {
  if (!connectionString)
    throw new Error("Set LESSOR_CONNECTION_STRING: `npx lessorctl tenants create <id>` prints it.");
  // Without a url, the client sends to the host and port the connection string names (Lessor
  // writes its own address there): http on this machine, https anywhere else.
  const client = createClient(connectionString, { url: lessorUrl, fetch: fetchFunction });

  const body = "starred on a lease";
  const lease = await client.lease({ ttlMs: 30_000 });
  try {
    return await lease.transaction(async (tx) => {
      // FOR UPDATE locks the note until COMMIT: two runs at once cannot both read the same stars
      // and each write back one more (a lost update).
      const [found] = await tx.query("SELECT id, stars FROM notes WHERE body = $1 FOR UPDATE", [body]);
      const [note] = found
        ? [found]
        : await tx.query("INSERT INTO notes (body) VALUES ($1) RETURNING id, stars", [body]);
      const [starred] = await tx.query("UPDATE notes SET stars = $2 WHERE id = $1 RETURNING *", [
        note?.id,
        note?.stars + 1,
      ]);
      return starred;
    });
  } finally {
    // Releasing rolls back anything left open; a lease that is never released expires after its TTL.
    await lease.release();
  }
}

// Runs when executed (`npx node examples/lease.mjs`), not when imported (the tests call main()).
if (import.meta.filename !== undefined && import.meta.filename === process.argv[1]) {
  console.log(await main());
}
