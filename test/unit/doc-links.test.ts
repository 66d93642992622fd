/**
 * Every relative link and anchor in the README and in docs/ leads somewhere: the file exists, and
 * the anchor is a heading of that file as GitHub names it (lowercase, punctuation dropped, spaces
 * to hyphens, `-1`, `-2` for repeats) or an explicit `id`/`name`. Links inside code are not links.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { describe, expect, it } from "vitest";

const root = resolve(import.meta.dirname, "../..");

/** The Markdown files this test owns: the README and everything under docs/. */
function markdownFiles(): string[] {
  const docs = readdirSync(join(root, "docs"), { recursive: true, encoding: "utf8" })
    .filter((file) => file.endsWith(".md"))
    .map((file) => join(root, "docs", file));
  return [join(root, "README.md"), ...docs].sort();
}

/** The text with fenced code blocks blanked (line count kept) and inline code spans removed. */
function proseOf(markdown: string): string {
  let fence: string | null = null;
  const lines = markdown.split("\n").map((line) => {
    const opener = /^\s*(```+|~~~+)/.exec(line)?.[1];
    if (fence === null && opener) {
      fence = opener;
      return "";
    }
    if (fence !== null) {
      if (line.trim().startsWith(fence)) fence = null;
      return "";
    }
    return line;
  });
  return lines.join("\n").replace(/(`+)[^`]*?\1/g, "");
}

/** A heading's anchor as GitHub derives it (before repeats are numbered). */
function githubSlug(heading: string): string {
  return heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, "$1") // a link in a heading counts by its text
    .replace(/<[^>]+>/g, "")
    .toLowerCase()
    .trim()
    .replace(/[^\p{L}\p{N}\p{M}\s_-]/gu, "")
    .replace(/\s/g, "-");
}

/** Every anchor a Markdown file offers. */
function anchorsOf(markdown: string): Set<string> {
  const anchors = new Set<string>();
  const seen = new Map<string, number>();
  let fence: string | null = null;
  for (const line of markdown.split("\n")) {
    const opener = /^\s*(```+|~~~+)/.exec(line)?.[1];
    if (fence === null && opener) {
      fence = opener;
      continue;
    }
    if (fence !== null) {
      if (line.trim().startsWith(fence)) fence = null;
      continue;
    }
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)?.[1];
    if (heading !== undefined) {
      // Inline code keeps its text in the anchor (`GET /metrics` → get-metrics).
      const base = githubSlug(heading.replace(/`/g, ""));
      const count = seen.get(base) ?? 0;
      seen.set(base, count + 1);
      anchors.add(count === 0 ? base : `${base}-${count}`);
    }
    for (const match of line.matchAll(/<a\s+(?:id|name)="([^"]+)"/g)) if (match[1]) anchors.add(match[1]);
  }
  return anchors;
}

/** Every link target in the prose: `[text](target)` and `![alt](target)`, across line breaks too. */
function linkTargets(markdown: string): string[] {
  const prose = proseOf(markdown);
  return [...prose.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)].map((match) => match[1] ?? "");
}

/** What is wrong with one target of `file`, or null if it leads somewhere. */
function problemOf(file: string, target: string, anchorsCache: Map<string, Set<string>>): string | null {
  if (/^[a-z][a-z0-9+.-]*:/i.test(target)) return null; // https:, mailto:: not this test's business
  const [pathPart = "", anchor] = target.split("#", 2);
  const path = pathPart === "" ? file : resolve(dirname(file), decodeURIComponent(pathPart));
  if (!existsSync(path)) return `${target}: no such file`;
  if (anchor === undefined || anchor === "") return null;
  if (statSync(path).isDirectory() || !path.endsWith(".md"))
    return `${target}: an anchor into a non-Markdown file`;
  let anchors = anchorsCache.get(path);
  if (!anchors) {
    anchors = anchorsOf(readFileSync(path, "utf8"));
    anchorsCache.set(path, anchors);
  }
  return anchors.has(decodeURIComponent(anchor)) ? null : `${target}: no heading with that anchor`;
}

describe("links in the README and docs/", () => {
  it("names headings the way GitHub anchors them", () => {
    expect(githubSlug("Row-level security with end-user JWTs")).toBe("row-level-security-with-end-user-jwts");
    expect(githubSlug("GET /metrics")).toBe("get-metrics");
    expect(githubSlug("Lessor vs PgBouncer (npm run bench:peers)")).toBe(
      "lessor-vs-pgbouncer-npm-run-benchpeers",
    );
    expect(githubSlug("What a tick does, and why a crash never applies a migration twice")).toBe(
      "what-a-tick-does-and-why-a-crash-never-applies-a-migration-twice",
    );
    expect([...anchorsOf("# A\n## B\n```\n# not a heading\n```\n## B\n")]).toEqual(["a", "b", "b-1"]);
  });

  it("finds links across line breaks and skips the ones in code", () => {
    expect(
      linkTargets("see [the\nAPI](docs/api.md#tenant-keys) and `[x](nowhere)`\n```\n[y](nope)\n```\n"),
    ).toEqual(["docs/api.md#tenant-keys"]);
  });

  it("has an index of docs/ that names every page", () => {
    const index = readFileSync(join(root, "docs/README.md"), "utf8");
    const pages = readdirSync(join(root, "docs")).filter(
      (file) => file.endsWith(".md") && file !== "README.md",
    );
    const linked = new Set(linkTargets(index).map((target) => target.split("#")[0]));
    expect(pages.filter((page) => !linked.has(page))).toEqual([]);
  });

  it.each(markdownFiles().map((file) => [relative(root, file), file]))(
    "%s: every relative link leads somewhere",
    (_name, file) => {
      const cache = new Map<string, Set<string>>();
      const broken = linkTargets(readFileSync(file, "utf8"))
        .map((target) => problemOf(file, target, cache))
        .filter((problem): problem is string => problem !== null);
      expect(broken).toEqual([]);
    },
  );
});
