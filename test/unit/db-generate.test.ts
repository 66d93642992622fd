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
import {
  cpSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterEach, describe, expect, it } from "vitest";

const root = resolve(import.meta.dirname, "../..");
const scratches: string[] = [];

/** A copy of what `db:generate` reads and writes, with `schema` as the tenant schema. */
function scratchCheckout(schema: string): string {
  const dir = mkdtempSync(join(tmpdir(), "lessor-db-generate-"));
  scratches.push(dir);
  for (const path of ["drizzle", "local/bundle-migrations.ts", "src/migrations"]) {
    cpSync(join(root, path), join(dir, path), { recursive: true });
  }
  mkdirSync(join(dir, "src/tenant-db"), { recursive: true });
  writeFileSync(join(dir, "src/tenant-db/schema.ts"), schema);
  writeFileSync(join(dir, "package.json"), '{ "type": "module" }\n');
  symlinkSync(join(root, "node_modules"), join(dir, "node_modules"));
  return dir;
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

const exampleSchema = readFileSync(join(root, "src/tenant-db/schema.ts"), "utf8");

afterEach(() => {
  for (const dir of scratches.splice(0)) rmSync(dir, { recursive: true, force: true });
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
