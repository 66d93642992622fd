/**
 * EXAMPLE tenant schema. Every tenant database gets these tables. Replace this file with your own
 * application's schema and run `npm run db:generate` (see docs/migrations.md, "Your own tenant schema").
 */
import { integer, jsonb, pgTable, serial, text, timestamp } from "drizzle-orm/pg-core";

export const notes = pgTable("notes", {
  id: serial("id").primaryKey(),
  body: text("body").notNull(),
  tags: text("tags").array().notNull().default([]),
  attributes: jsonb("attributes"),
  stars: integer("stars").notNull().default(0),
  createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),
  /**
   * EXAMPLE of an expand → contract change (docs/migrations.md). Version 2 (expand) adds the column,
   * nullable and unconstrained: apps built for version 1 never see it, apps built for version 2
   * write it. Version 3 (contract) makes it unique, which only apps built for version 3 handle (they
   * pick another slug on a conflict), so it waits until no older app is seen.
   */
  slug: text("slug").unique(),
});
