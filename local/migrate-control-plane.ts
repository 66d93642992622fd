/**
 * Applies drizzle/control-plane/ to the database named by DATABASE_URL (production or any other).
 *
 *     DATABASE_URL='postgres://…/lessor?sslmode=require' npm run migrate:control-plane
 */
import { migrateControlPlane } from "./stack.ts";

const url = process.env.DATABASE_URL;
if (!url) {
  console.error("Set DATABASE_URL to the control-plane database's connection string.");
  process.exit(2);
}
await migrateControlPlane(url);
console.log("control-plane migrations applied");
