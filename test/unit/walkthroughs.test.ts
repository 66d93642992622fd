/**
 * The docs' shell snippets speak one language: the variables the quickstart exports (`LESSOR_URL`,
 * `KEY`, `LESSOR_CONNECTION_STRING`), the tokens `lessorctl jwt dev` exports, and the few a
 * walkthrough sets itself. A snippet that says `$LESSOR` or `$LESSOR_ADMIN_KEY` where the page before
 * said `$LESSOR_URL` and `$KEY` fails a reader who pastes it; it fails here first. The walkthroughs
 * themselves run against a real stack in `npm run test:walkthroughs`.
 */
import { resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { allShellBlocks, shellBlocks, walkthroughOrder } from "../walkthroughs/blocks.ts";

const root = resolve(import.meta.dirname, "../..");

/** Variables a snippet may use: the quickstart's, the end users' tokens, and what a walkthrough sets itself. */
const allowed = new Set([
  "LESSOR_URL",
  "KEY",
  "LESSOR_CONNECTION_STRING",
  "LESSOR_ADMIN_KEY", // only where a tool reads it from the environment (npm start, lessorctl, reseal)
  "CAMPAIGN",
  "OLD_KEY_ID",
  "OLD_CONNECTION_STRING",
]);
const tokenVariable = /^LESSOR_[A-Z0-9_]+_TOKEN$/;

describe("the docs' shell snippets", () => {
  it("finds the walkthrough blocks after their marker, and leaves other languages alone", () => {
    const blocks = shellBlocks(
      "text\n<!-- walkthrough demo -->\n```sh\necho $KEY\n```\n```ts\nconst x = `$NOPE`;\n```\n  ```sh\n  echo hi\n  ```\n",
      "x.md",
    );
    expect(blocks).toEqual([
      { file: "x.md", line: 3, walkthrough: "demo", text: "echo $KEY\n" },
      { file: "x.md", line: 9, walkthrough: null, text: "echo hi\n" },
    ]);
  });

  it("has every walkthrough, and no walkthrough marker the runner does not run", () => {
    const marked = new Set(
      allShellBlocks(root).flatMap((block) => (block.walkthrough ? [block.walkthrough] : [])),
    );
    expect([...marked].sort()).toEqual([...walkthroughOrder].sort());
  });

  it("use the quickstart's variable names, and no other", () => {
    const strays = allShellBlocks(root).flatMap((block) =>
      [...block.text.matchAll(/\$\{?([A-Za-z_][A-Za-z0-9_]*)/g)]
        .map((match) => match[1] ?? "")
        .filter((name) => !allowed.has(name) && !tokenVariable.test(name))
        .map((name) => `${block.file}:${block.line}: $${name}`),
    );
    expect(strays).toEqual([]);
  });

  it("call the admin key KEY: LESSOR_ADMIN_KEY appears only as a tool's environment", () => {
    const misuse = allShellBlocks(root).flatMap((block) =>
      block.text
        .split("\n")
        .filter((line) => /Bearer \$\{?LESSOR_ADMIN_KEY/.test(line))
        .map((line) => `${block.file}:${block.line}: ${line.trim()}`),
    );
    expect(misuse).toEqual([]);
  });
});
