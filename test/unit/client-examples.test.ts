/**
 * The examples as a newcomer meets them: the README quotes the quickstart and docs/examples.md the
 * others, verbatim; each runs itself when
 * executed with `node`, the stack test runs every one, and the drizzle example's `notes` table is
 * the example tenant schema's. (What they do against Lessor: test/integration/examples.test.ts.)
 */
import { execFile } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import { promisify } from "node:util";
import { getTableColumns } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { notes as exampleNotes } from "../../examples/drizzle.mjs";
import { notes } from "../fixtures/tenant-schema/schema.ts";

const root = resolve(import.meta.dirname, "../..");
const examples = readdirSync(resolve(root, "examples"))
  .filter((file) => file.endsWith(".mjs"))
  .sort();
const readme = readFileSync(resolve(root, "README.md"), "utf8");
const examplesPage = readFileSync(resolve(root, "docs/examples.md"), "utf8");

describe("examples/", () => {
  it("has the seven the README promises", () => {
    expect(examples).toEqual([
      "drizzle.mjs",
      "lease.mjs",
      "quickstart.mjs",
      "rls.mjs",
      "transaction.mjs",
      "wire-drizzle.mjs",
      "wire-pool.mjs",
    ]);
  });

  it.each(examples)(
    "%s is quoted verbatim: the quickstart in the README, the others in docs/examples.md",
    (file) => {
      const source = readFileSync(resolve(root, "examples", file), "utf8");
      expect(file === "quickstart.mjs" ? readme : examplesPage).toContain(`\`\`\`js\n${source}\`\`\``);
    },
  );

  it("lease.mjs says to run it with npx node: plain node 20 cannot import lessor/client's TypeScript", () => {
    const source = readFileSync(resolve(root, "examples/lease.mjs"), "utf8");
    expect(source).toContain("node examples/lease.mjs");
    expect(source.match(/(?<!npx )node examples\/lease\.mjs/g)).toBeNull();
  });

  it.each(examples)("%s is run against the stack by test/integration/examples.test.ts", (file) => {
    const stackTest = readFileSync(resolve(root, "test/integration/examples.test.ts"), "utf8");
    expect(stackTest).toContain(`from "../../examples/${file}"`);
  });

  it.each(examples)(
    "%s runs itself when executed with node (and says what it needs)",
    async (file) => {
      const env = { ...process.env };
      delete env.LESSOR_CONNECTION_STRING;
      const run = await promisify(execFile)(process.execPath, [resolve(root, "examples", file)], {
        env,
      }).then(
        () => ({ stderr: "" }),
        (error: { stderr: string }) => error,
      );
      expect(run.stderr).toContain(
        "Set LESSOR_CONNECTION_STRING: `npx lessorctl tenants create <id>` prints it.",
      );
    },
    30_000,
  ); // a Node start-up, slow on a loaded machine

  it("drizzle.mjs declares the example tenant schema's notes columns as that schema does", () => {
    const declared = getTableColumns(exampleNotes);
    expect(Object.keys(declared).length).toBeGreaterThan(0);
    for (const [key, column] of Object.entries(declared)) {
      const original = getTableColumns(notes)[key as keyof typeof notes.$inferSelect];
      expect(original, key).toBeDefined();
      expect(
        {
          name: column.name,
          type: column.columnType,
          notNull: column.notNull,
          hasDefault: column.hasDefault,
        },
        key,
      ).toEqual({
        name: original?.name,
        type: original?.columnType,
        notNull: original?.notNull,
        hasDefault: original?.hasDefault,
      });
    }
  });
});
