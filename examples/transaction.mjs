// @ts-check
// A transaction with the Neon driver on Lessor: several statements sent at once, committed together
// or not at all. (For a transaction that reads, decides in code, then writes, see lease.mjs.)
//
//   LESSOR_CONNECTION_STRING='postgres://acme:lsk_…@127.0.0.1:8787/acme' node examples/transaction.mjs
//
// `notes` is a table of Lessor's example tenant schema (src/tenant-db/schema.ts).
import { neon, neonConfig } from "@neondatabase/serverless";

/**
 * Commits two notes in one transaction, then shows that a failing transaction leaves nothing behind.
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
  // The driver sends its queries to Lessor's /sql: at LESSOR_URL if set, else at the host and port
  // the connection string names (Lessor writes its own address there), so no port is written here.
  // Plain http only on this machine; deployed, Lessor is https.
  neonConfig.fetchEndpoint = (host, port) => {
    const local = host === "localhost" || host === "[::1]" || host.startsWith("127.");
    return new URL("/sql", lessorUrl ?? `${local ? "http" : "https"}://${host}:${port}`).href;
  };
  if (fetchFunction) neonConfig.fetchFunction = fetchFunction;

  const sql = neon(connectionString);
  const countNotes = async () => (await sql`SELECT count(*)::int AS n FROM notes`)[0]?.n;
  const before = await countNotes();

  // One request, one transaction: both notes are committed, or neither is.
  const results = await sql.transaction(
    [
      sql`INSERT INTO notes (body) VALUES (${"first of two"}) RETURNING id`,
      sql`INSERT INTO notes (body) VALUES (${"second of two"}) RETURNING id`,
    ],
    { isolationLevel: "Serializable" },
  );
  const committed = results.map((rows) => rows[0]?.id);

  // The second statement fails (division by zero), so the first one's note is rolled back with it.
  const failure = await sql
    .transaction([sql`INSERT INTO notes (body) VALUES (${"never committed"})`, sql`SELECT 1 / 0`])
    .then(
      () => "committed",
      (error) => `rolled back: ${error.message}`,
    );

  return { committed, failure, notesAdded: (await countNotes()) - before };
}

// Runs when executed (`node examples/transaction.mjs`), not when imported (the tests call main()).
if (import.meta.filename !== undefined && import.meta.filename === process.argv[1]) {
  console.log(await main());
}
