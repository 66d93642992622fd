// @ts-check
// drizzle-orm's neon-serverless driver on Lessor's wire endpoint: interactive transactions, one
// that commits and one that rolls back inside (tx.rollback()), and nothing of the second is kept.
//
//   LESSOR_CONNECTION_STRING='postgres://acme:lsk_…@127.0.0.1:8787/acme' node examples/wire-drizzle.mjs
import { neonConfig, Pool } from "@neondatabase/serverless";
import { desc, eq, sql } from "drizzle-orm";
import { drizzle } from "drizzle-orm/neon-serverless";
import { integer, pgTable, serial, text } from "drizzle-orm/pg-core";

// The `notes` table of Lessor's example tenant schema (src/tenant-db/schema.ts), with the columns
// this example uses; the others have defaults.
const notes = pgTable("notes", {
  id: serial("id").primaryKey(),
  body: text("body").notNull(),
  stars: integer("stars").notNull().default(0),
});

/**
 * Moves stars between two notes in transactions: one move that has enough stars commits; one that
 * would take more than there are rolls back inside the transaction.
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
  // As in wire-pool.mjs: the driver's WebSocket goes to Lessor's /v2.
  const { hostname, port } = new URL(connectionString.replace(/^postgres(ql)?:/, "http:"));
  const local = hostname === "localhost" || hostname === "[::1]" || hostname.startsWith("127.");
  const lessor = new URL(lessorUrl ?? `${local ? "http" : "https"}://${hostname}${port ? `:${port}` : ""}`);
  neonConfig.wsProxy = () => `${lessor.host}/v2`;
  neonConfig.useSecureWebSocket = lessor.protocol === "https:";
  if (webSocketConstructor) neonConfig.webSocketConstructor = webSocketConstructor;

  const pool = new Pool({ connectionString });
  const db = drizzle({ client: pool });
  try {
    const [from, to] = await db
      .insert(notes)
      .values([
        { body: "giver", stars: 3 },
        { body: "taker", stars: 0 },
      ])
      .returning({ id: notes.id });
    if (!from || !to) throw new Error("the two notes were not added");

    /** Moves `count` stars, or rolls the whole transaction back if the giver has fewer. */
    const move = (/** @type {number} */ count) =>
      db.transaction(async (tx) => {
        await tx
          .update(notes)
          .set({ stars: sql`${notes.stars} + ${count}` })
          .where(eq(notes.id, to.id));
        const [giver] = await tx
          .update(notes)
          .set({ stars: sql`${notes.stars} - ${count}` })
          .where(eq(notes.id, from.id))
          .returning({ stars: notes.stars });
        if (!giver || giver.stars < 0) tx.rollback();
      });

    await move(2);
    const refused = await move(5).then(
      () => "moved",
      (/** @type {Error} */ error) => `rolled back: ${error.message}`,
    );
    const kept = await db
      .select({ body: notes.body, stars: notes.stars })
      .from(notes)
      .orderBy(desc(notes.stars), notes.body);
    return { refused, kept };
  } finally {
    await pool.end();
  }
}

// Runs when executed (`node examples/wire-drizzle.mjs`), not when imported (the tests call main()).
if (import.meta.filename !== undefined && import.meta.filename === process.argv[1]) {
  // Node 20 has no WebSocket of its own (22 has one): there the driver takes the `ws` package's.
  const webSocketConstructor = globalThis.WebSocket ?? (await import("ws")).default;
  console.log(await main({ webSocketConstructor }));
}
