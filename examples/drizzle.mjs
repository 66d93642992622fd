// @ts-check
// drizzle-orm's neon-http driver on Lessor: a typed table, an insert and a query.
//
//   LESSOR_CONNECTION_STRING='postgres://acme:lsk_…@127.0.0.1:8787/acme' node examples/drizzle.mjs
import { neon, neonConfig } from "@neondatabase/serverless";
import { desc, gte } from "drizzle-orm";
import { drizzle } from "drizzle-orm/neon-http";
import { integer, pgTable, serial, text, timestamp } from "drizzle-orm/pg-core";

// The `notes` table of Lessor's example tenant schema (src/tenant-db/schema.ts), which every tenant
// database has until you replace that schema with your own. Declared here with the columns this
// example uses; the others have defaults.
export const notes = pgTable("notes", {
  id: serial("id").primaryKey(),
  body: text("body").notNull(),
  tags: text("tags").array().notNull().default([]),
  stars: integer("stars").notNull().default(0),
  createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
});

/**
 * Adds a starred note, then reads the starred notes back, newest first.
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

  const db = drizzle({ client: neon(connectionString) });
  await db.insert(notes).values({ body: "hello from drizzle", tags: ["example"], stars: 5 });
  return await db
    .select({ id: notes.id, body: notes.body, tags: notes.tags, stars: notes.stars })
    .from(notes)
    .where(gte(notes.stars, 5))
    .orderBy(desc(notes.id))
    .limit(3);
}

// Runs when executed (`node examples/drizzle.mjs`), not when imported (the tests call main()).
if (import.meta.filename !== undefined && import.meta.filename === process.argv[1]) {
  console.log(await main());
}
