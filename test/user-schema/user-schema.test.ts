/**
 * docs/migrations.md's promise, tested: a user who adds the documented migration, or replaces the
 * example schema with their own, keeps a green `npm test`, and their migrations apply as Lessor
 * applies them (issue 39).
 *
 * Each case works on a scratch copy of this checkout (its files as git sees them, node_modules
 * linked), does what the page tells a user to do, and then runs what depends on the product's own
 * tenant migrations: the bundle check and the type-check of `npm run check`, Lessor's migrator on a
 * real Postgres as a role that is not a superuser, and integration test files that use the example
 * schema, in workerd, as `npm test` runs them (on the tests' fixture schema, vitest.config.ts).
 */
import { spawnSync } from "node:child_process";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type LocalPostgres, startLocalPostgres } from "../../local/postgres.ts";
import { freePort } from "../../local/stack.ts";
import type { TenantMigration } from "../../src/tenant-db/migrator.ts";
import { migrateTenantDatabase, readSchemaVersion } from "../../src/tenant-db/migrator.ts";
import { checkoutRoot, scratchCheckout } from "../scratch-checkout.ts";
import { testPgPassword } from "../secrets.ts";

const root = checkoutRoot;
const scratchDirs: string[] = [];

/** A scratch copy of the checkout, removed after the file's tests. */
function scratchCopy(): string {
  const scratch = scratchCheckout("lessor-user-schema-");
  scratchDirs.push(scratch.dir);
  return scratch.dir;
}

/** Runs a command in `cwd` without a terminal, as CI and a script would; its output on failure. */
function run(cwd: string, command: string, args: readonly string[]): { status: number; output: string } {
  const result = spawnSync(command, args, {
    cwd,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "pipe"],
    timeout: 240_000,
  });
  return { status: result.status ?? 1, output: `${result.stdout}\n${result.stderr}` };
}

/** `npm run db:generate -- <args>` in `cwd` (its script, with the Node that runs this test). */
function dbGenerate(cwd: string, name: string) {
  return run(cwd, process.execPath, ["local/bundle-migrations.ts", "--generate", "--name", name]);
}

/** What `npm run check` runs that reads the tenant schema: the bundle check and the type-check. */
function checkSchema(cwd: string): void {
  const bundle = run(cwd, process.execPath, ["local/bundle-migrations.ts", "--check"]);
  expect(bundle.output, "bundle check").not.toMatch(/out of date/);
  expect(bundle.status, bundle.output).toBe(0);
  const types = run(cwd, process.execPath, [
    join(root, "node_modules/typescript/bin/tsc"),
    "-p",
    "tsconfig.json",
  ]);
  expect(types.status, types.output).toBe(0);
}

async function bundledMigrations(cwd: string): Promise<readonly TenantMigration[]> {
  const module = (await import(pathToFileURL(join(cwd, "src/migrations/tenant.gen.ts")).href)) as {
    tenantMigrations: readonly TenantMigration[];
  };
  return module.tenantMigrations;
}

/** Integration files of `project` in the scratch copy, in workerd against its own Postgres. */
function integrationFiles(cwd: string, project: string, files: readonly string[]) {
  return run(cwd, process.execPath, [
    join(root, "node_modules/vitest/vitest.mjs"),
    "run",
    "--project",
    project,
    ...files,
  ]);
}

let postgres: LocalPostgres;
let databases = 0;

/** Applies `migrations` with Lessor's migrator to a new database, as its owner (no superuser). */
async function applyAsTenant(migrations: readonly TenantMigration[]): Promise<pg.Client> {
  const name = `user_schema_${++databases}`;
  const superuser = new pg.Client({ connectionString: postgres.url("postgres") });
  await superuser.connect();
  try {
    await superuser.query(`CREATE ROLE ${name} LOGIN PASSWORD '${testPgPassword}'`);
    await superuser.query(`CREATE DATABASE ${name} OWNER ${name}`);
  } finally {
    await superuser.end();
  }
  const tenant = new pg.Client({
    host: postgres.host,
    port: postgres.port,
    user: name,
    password: testPgPassword,
    database: name,
  });
  await tenant.connect();
  const run = await migrateTenantDatabase(tenant, migrations);
  expect(run.toVersion).toBe(migrations.length);
  expect(await readSchemaVersion(tenant)).toBe(migrations.length);
  return tenant;
}

beforeAll(async () => {
  postgres = await startLocalPostgres({
    dataDir: join(mkdtempSync(join(tmpdir(), "lessor-user-schema-pg-")), "data"),
    port: await freePort(),
    password: testPgPassword,
    persistent: false,
  });
}, 120_000);

afterAll(async () => {
  await postgres?.stop();
  for (const dir of scratchDirs) rmSync(dir, { recursive: true, force: true });
});

describe("npm test after the user changes the tenant schema", () => {
  it("applies this checkout's own tenant migrations, whatever they are, with Lessor's migrator", async () => {
    const tenant = await applyAsTenant(await bundledMigrations(root));
    await tenant.end();
  });

  it("stays green with docs/migrations.md's add_note_summary migration, which applies as version 4", async () => {
    const dir = scratchCopy();
    // The page's walkthrough starts from the example schema, whatever this checkout's is now: the
    // fixture is that example, migrations and all.
    writeFileSync(
      join(dir, "src/tenant-db/schema.ts"),
      readFileSync(join(root, "test/fixtures/tenant-schema/schema.ts")),
    );
    rmSync(join(dir, "drizzle/tenant"), { recursive: true, force: true });
    cpSync(join(root, "test/fixtures/tenant-schema/drizzle"), join(dir, "drizzle/tenant"), {
      recursive: true,
    });
    // Step 1 of the page, exactly: a nullable `summary` on the example's `notes`.
    const page = readFileSync(join(root, "docs/migrations.md"), "utf8");
    const documented = page.match(/^\s*(summary: text\("summary"\),)/m)?.[1];
    expect(documented, "docs/migrations.md no longer shows the summary column").toBeDefined();
    const schemaFile = join(dir, "src/tenant-db/schema.ts");
    const schema = readFileSync(schemaFile, "utf8");
    const end = schema.lastIndexOf("});");
    writeFileSync(schemaFile, `${schema.slice(0, end)}  ${documented}\n${schema.slice(end)}`);
    // Step 2: generate and bundle, without a terminal.
    const generated = dbGenerate(dir, "add_note_summary");
    expect(generated.status, generated.output).toBe(0);
    const sql = readFileSync(join(dir, "drizzle/tenant/0003_add_note_summary.sql"), "utf8");
    expect(sql).toContain('ALTER TABLE "notes" ADD COLUMN "summary" text;');
    checkSchema(dir);
    const migrations = await bundledMigrations(dir);
    expect(migrations.map((m) => m.version)).toEqual([1, 2, 3, 4]);
    const tenant = await applyAsTenant(migrations);
    try {
      const { rows } = await tenant.query(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'notes' AND column_name = 'summary'",
      );
      expect(rows).toHaveLength(1);
    } finally {
      await tenant.end();
    }
    // The test that failed with `42701 column "summary" already exists` (issue 39).
    const traps = integrationFiles(dir, "workers", ["test/integration/privileged-traps.test.ts"]);
    expect(traps.status, traps.output.slice(-4000)).toBe(0);
  }, 360_000);

  it("stays green after the example schema is replaced with the user's own", async () => {
    const dir = scratchCopy();
    // "Replace it with your application's drizzle schema": no `notes` left anywhere in what ships.
    writeFileSync(
      join(dir, "src/tenant-db/schema.ts"),
      [
        'import { pgTable, serial, text, timestamp } from "drizzle-orm/pg-core";',
        "",
        'export const projects = pgTable("projects", {',
        '  id: serial("id").primaryKey(),',
        '  name: text("name").notNull(),',
        '  createdAt: timestamp("created_at", { withTimezone: true }).notNull().defaultNow(),',
        "});",
        "",
      ].join("\n"),
    );
    // A new project with no tenants yet starts its migrations over (docs/migrations.md).
    rmSync(join(dir, "drizzle/tenant"), { recursive: true, force: true });
    const generated = dbGenerate(dir, "my_app_schema");
    expect(generated.status, generated.output).toBe(0);
    checkSchema(dir);
    const migrations = await bundledMigrations(dir);
    expect(migrations).toHaveLength(1);
    expect(migrations[0]?.statements.join("\n")).toContain('CREATE TABLE "projects"');
    expect(migrations.flatMap((m) => m.statements).join("\n")).not.toContain("notes");
    const tenant = await applyAsTenant(migrations);
    try {
      const { rows } = await tenant.query(
        "SELECT pg_catalog.to_regclass('public.projects') IS NOT NULL AS present",
      );
      expect(rows[0]?.present).toBe(true);
    } finally {
      await tenant.end();
    }
    // The files that failed 6 of 7 with `relation "notes" does not exist` (issue 39), and the smoke test.
    const examples = integrationFiles(dir, "workers-2", [
      "test/integration/examples.test.ts",
      "test/integration/smoke.test.ts",
    ]);
    expect(examples.status, examples.output.slice(-4000)).toBe(0);
  }, 360_000);
});
