// @ts-check
// The Neon driver's Pool on Lessor's wire endpoint: an interactive transaction (read, decide in
// code, write) on one connection, then a plain query. Lessor leases a connection of the tenant's
// pool per transaction (transaction mode) and gives it back, reset, when the transaction ends.
//
//   LESSOR_CONNECTION_STRING='postgres://acme:lsk_…@127.0.0.1:8787/acme' node examples/wire-pool.mjs
//
// `notes` is a table of Lessor's example tenant schema (src/tenant-db/schema.ts).
import { neonConfig, Pool } from "@neondatabase/serverless";

/**
 * Stars the newest note (adding one first if there is none) in one transaction, then lists notes.
 * @param {{ connectionString?: string, lessorUrl?: string, webSocketConstructor?: any }} [options]
 *   the environment's unless given; the tests give a WebSocket that reaches Lessor's fetch handler
 */
export async function main({
  connectionString = process.env.LESSOR_CONNECTION_STRING,
  lessorUrl = process.env.LESSOR_URL,
  webSocketConstructor,
} = {}) {
  if (!connectionString)
    throw new Error("Set LESSOR_CONNECTION_STRING: `npx lessorctl tenants create <id>` prints it.");
  // The driver opens its WebSocket to Lessor's /v2: at LESSOR_URL if set, else at the host and port
  // the connection string names (Lessor writes its own address there). Plain ws only on this
  // machine; deployed, Lessor is wss, and the driver's defaults already point at <host>/v2.
  const { hostname, port } = new URL(connectionString.replace(/^postgres(ql)?:/, "http:"));
  const local = hostname === "localhost" || hostname === "[::1]" || hostname.startsWith("127.");
  const lessor = new URL(lessorUrl ?? `${local ? "http" : "https"}://${hostname}${port ? `:${port}` : ""}`);
  neonConfig.wsProxy = () => `${lessor.host}/v2`;
  neonConfig.useSecureWebSocket = lessor.protocol === "https:";
  if (webSocketConstructor) neonConfig.webSocketConstructor = webSocketConstructor;

  const pool = new Pool({ connectionString });
  try {
    const client = await pool.connect();
    try {
      await client.query("BEGIN");
      const { rows } = await client.query("SELECT id FROM notes ORDER BY id DESC LIMIT 1 FOR UPDATE");
      const id =
        rows[0]?.id ??
        (await client.query("INSERT INTO notes (body) VALUES ($1) RETURNING id", ["hello over the wire"]))
          .rows[0].id;
      await client.query("UPDATE notes SET stars = stars + 1 WHERE id = $1", [id]);
      await client.query("COMMIT");
    } catch (error) {
      await client.query("ROLLBACK");
      throw error;
    } finally {
      client.release();
    }
    const { rows } = await pool.query("SELECT id, body, stars FROM notes ORDER BY id DESC LIMIT 3");
    return rows;
  } finally {
    await pool.end();
  }
}

// Runs when executed (`node examples/wire-pool.mjs`), not when imported (the tests call main()).
if (import.meta.filename !== undefined && import.meta.filename === process.argv[1]) {
  // Node 20 has no WebSocket of its own (22 has one): there the driver takes the `ws` package's.
  const webSocketConstructor = globalThis.WebSocket ?? (await import("ws")).default;
  console.log(await main({ webSocketConstructor }));
}
