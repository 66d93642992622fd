/**
 * `npm run db:generate` (local/bundle-migrations.ts --generate) as a user runs it after changing the
 * tenant schema, in a scratch copy of the checkout (its drizzle/ folders, the bundler and a schema of
 * the test's), so nothing of the checkout's own migrations is touched. drizzle-kit runs for real.
 *
 * Without a terminal (these runs have none, like CI or a piped shell), drizzle-kit cannot ask its
 * rename question: a schema that needs the question must fail the command, exit non-zero and say
 * what to do, in a few lines and without a stack trace, and bundle nothing. A schema that needs no
 * question (a new column) generates and bundles as before, and so does a run with nothing to do.
 */
import { execFile } from "node:child_process";
import { cpSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { checkoutRoot, scratchCheckout as copyCheckout } from "../scratch-checkout.ts";

const scratches: { remove(): void }[] = [];

/**
 * A scratch copy of the checkout (test/scratch-checkout.ts) whose tenant migrations are the example
 * schema's (the tests' fixture: whatever this checkout's own are), with `schema` as the tenant schema.
 */
function scratchCheckout(schema: string): string {
  const scratch = copyCheckout("lessor-db-generate-");
  scratches.push(scratch);
  rmSync(join(scratch.dir, "drizzle/tenant"), { recursive: true, force: true });
  cpSync(join(checkoutRoot, "test/fixtures/tenant-schema/drizzle"), join(scratch.dir, "drizzle/tenant"), {
    recursive: true,
  });
  writeFileSync(join(scratch.dir, "src/tenant-db/schema.ts"), schema);
  return scratch.dir;
}

/** Runs `node local/bundle-migrations.ts <args>` in `dir`, stdin not a terminal. */
function bundler(dir: string, args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    const child = execFile(
      process.execPath,
      [join(dir, "local/bundle-migrations.ts"), ...args],
      { cwd: dir, env: { ...process.env, NO_COLOR: "1" } },
      (error, stdout, stderr) => {
        done({ code: error ? Number(error.code ?? 1) : 0, stdout, stderr });
      },
    );
    child.stdin?.end();
  });
}

/** The output without stack frames, to say why an assertion failed (vitest parses frames it is given). */
const shown = (run: { stdout: string; stderr: string }) =>
  (run.stdout + run.stderr).replace(/^\s+at .*$/gm, "    at …");

const tenantMigrations = (dir: string) =>
  readdirSync(join(dir, "drizzle/tenant")).filter((f) => f.endsWith(".sql"));

/** The example schema, as the fixture keeps it (the checkout's own may have been replaced). */
const exampleSchema = readFileSync(join(checkoutRoot, "test/fixtures/tenant-schema/schema.ts"), "utf8");

afterEach(() => {
  for (const scratch of scratches.splice(0)) scratch.remove();
});

describe("npm run db:generate", () => {
  it("fails without a terminal when drizzle-kit must ask about a rename: exit 1, what to do, no stack, nothing bundled", async () => {
    // The example's `notes` replaced by an application's own table, as docs/migrations.md describes.
    const dir = scratchCheckout(`import { pgTable, serial, text } from "drizzle-orm/pg-core";

export const projects = pgTable("projects", {
  id: serial("id").primaryKey(),
  name: text("name").notNull(),
});
`);
    const before = tenantMigrations(dir);
    const bundle = readFileSync(join(dir, "src/migrations/tenant.gen.ts"), "utf8");

    const run = await bundler(dir, ["--generate", "--name", "my_app_schema"]);

    expect(run.code, shown(run)).toBe(1);
    const output = run.stdout + run.stderr;
    // What happened and what to do: a terminal for drizzle-kit's question, and the page about it.
    expect(run.stderr).toContain("no migration was written");
    expect(run.stderr).toContain("in a terminal");
    expect(run.stderr).toContain("docs/migrations.md");
    // Short: drizzle-kit's stack frames are not passed on, nor its error twice.
    expect(output.match(/^\s+at .*$/gm) ?? []).toEqual([]);
    expect(run.stderr.split("\n").filter((line) => line.trim() !== "").length).toBeLessThanOrEqual(6);
    // Nothing generated, nothing bundled.
    expect(output).not.toContain("wrote ");
    expect(tenantMigrations(dir)).toEqual(before);
    expect(readFileSync(join(dir, "src/migrations/tenant.gen.ts"), "utf8")).toBe(bundle);
  }, 60_000);

  it("generates and bundles a change that needs no question (a new column), and exits 0", async () => {
    const dir = scratchCheckout(
      exampleSchema.replace(
        '  slug: text("slug").unique(),',
        '  slug: text("slug").unique(),\n  summary: text("summary"),',
      ),
    );
    expect(readFileSync(join(dir, "src/tenant-db/schema.ts"), "utf8")).toContain('summary: text("summary")');
    const before = tenantMigrations(dir);

    const run = await bundler(dir, ["--generate", "--name", "add_note_summary"]);

    expect(run.code, shown(run)).toBe(0);
    const added = tenantMigrations(dir).filter((f) => !before.includes(f));
    expect(added).toEqual([`${String(before.length).padStart(4, "0")}_add_note_summary.sql`]);
    expect(readFileSync(join(dir, "drizzle/tenant", added[0] ?? ""), "utf8")).toContain(
      'ALTER TABLE "notes" ADD COLUMN "summary" text;',
    );
    expect(readFileSync(join(dir, "src/migrations/tenant.gen.ts"), "utf8")).toContain("add_note_summary");
    expect(run.stdout).toContain("wrote ");
  }, 60_000);

  it("re-bundles and exits 0 when the schema has not changed (nothing to generate)", async () => {
    const dir = scratchCheckout(exampleSchema);
    const before = tenantMigrations(dir);

    const run = await bundler(dir, ["--generate"]);

    expect(run.code, shown(run)).toBe(0);
    expect(run.stdout).toContain("No schema changes");
    expect(tenantMigrations(dir)).toEqual(before);
    expect(run.stdout).toContain("wrote ");
  }, 60_000);
});
