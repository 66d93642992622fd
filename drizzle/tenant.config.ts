import { defineConfig } from "drizzle-kit";

export default defineConfig({
  dialect: "postgresql",
  schema: "./src/tenant-db/schema.ts",
  out: "./drizzle/tenant",
});
