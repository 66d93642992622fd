/**
 * The walkthroughs as the docs write them: every ```sh block right after a
 * `<!-- walkthrough <name> -->` line, in the order the README and docs/ give them. The runner
 * (walkthroughs.test.ts) runs them as written; a unit test (test/unit/walkthroughs.test.ts) checks
 * that every shell snippet of the docs uses the one set of variable names the quickstart exports.
 */
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";

/** The walkthroughs, in the order one shell runs them: each starts where the one before ended. */
export const walkthroughOrder = ["quickstart", "rls", "rotation", "erase"] as const;
export type WalkthroughName = (typeof walkthroughOrder)[number];

export interface ShellBlock {
  /** The file, relative to the repository root. */
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  /** The walkthrough it belongs to, or null for a snippet that is only shown. */
  walkthrough: string | null;
  text: string;
}

/** The README and every page under docs/ (ADRs included), README first. */
export function docFiles(root: string): string[] {
  const docs = readdirSync(join(root, "docs"), { recursive: true, encoding: "utf8" })
    .filter((file) => file.endsWith(".md"))
    .sort()
    .map((file) => join(root, "docs", file));
  return [join(root, "README.md"), ...docs];
}

/** Every ```sh (or ```bash) block of `markdown`, with the walkthrough marker before it, if any. */
export function shellBlocks(markdown: string, file: string): ShellBlock[] {
  const blocks: ShellBlock[] = [];
  const lines = markdown.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const opener = /^(\s*)```(sh|bash)\s*$/.exec(lines[i] ?? "");
    if (!opener) {
      if (/^\s*```/.test(lines[i] ?? "")) {
        // Another language's block: skip to its end.
        for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i] ?? ""); i++);
      }
      continue;
    }
    const marker = /^<!-- walkthrough ([a-z-]+) -->$/.exec(lines[i - 1]?.trim() ?? "")?.[1] ?? null;
    const indent = opener[1]?.length ?? 0;
    const body: string[] = [];
    const start = i;
    for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i] ?? ""); i++)
      body.push((lines[i] ?? "").slice(indent));
    blocks.push({ file, line: start + 1, walkthrough: marker, text: `${body.join("\n")}\n` });
  }
  return blocks;
}

/** Every shell block of the README and docs/. */
export function allShellBlocks(root: string): ShellBlock[] {
  return docFiles(root).flatMap((path) => shellBlocks(readFileSync(path, "utf8"), relative(root, path)));
}

/** The blocks of one walkthrough, in document order. */
export function walkthrough(root: string, name: WalkthroughName): ShellBlock[] {
  return allShellBlocks(root).filter((block) => block.walkthrough === name);
}
