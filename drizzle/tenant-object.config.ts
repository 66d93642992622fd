import { defineConfig } from "drizzle-kit";

export default defineConfig({
  dialect: "sqlite",
  driver: "durable-sqlite",
  schema: "./src/tenant-object/storage-schema.ts",
  out: "./drizzle/tenant-object",
});
