import { defineConfig } from "drizzle-kit";

export default defineConfig({
  dialect: "sqlite",
  driver: "durable-sqlite",
  schema: "./src/budget-object/storage-schema.ts",
  out: "./drizzle/budget-object",
});
