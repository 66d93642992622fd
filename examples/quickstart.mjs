// @ts-check
// Lessor's quickstart: the official Neon serverless driver, with Lessor answering its queries.
//
//   LESSOR_CONNECTION_STRING='postgres://acme:lsk_…@127.0.0.1:8787/acme' node examples/quickstart.mjs
//
// `notes` is a table of Lessor's example tenant schema (src/tenant-db/schema.ts): every tenant
// database has it until you replace that schema with your own.
import { neon, neonConfig } from "@neondatabase/serverless";

/**
 * Adds a note, then reads the newest notes back.
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
  await sql`INSERT INTO notes (body) VALUES (${"hello from the quickstart"})`;
  return await sql`SELECT id, body, created_at FROM notes ORDER BY id DESC LIMIT 3`;
}

// Runs when executed (`node examples/quickstart.mjs`), not when imported (the tests call main()).
if (import.meta.filename !== undefined && import.meta.filename === process.argv[1]) {
  console.log(await main());
}
