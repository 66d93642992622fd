/**
 * A scratch copy of this checkout for tests that must change what ships (the tenant schema) or run
 * `npm start` without touching the reader's own `.lessor/`: the files as git sees them (tracked,
 * and new ones not ignored), with node_modules linked rather than copied.
 */
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";

/** This checkout's root. */
export const checkoutRoot = resolve(import.meta.dirname, "..");

/** Copies the checkout into a new folder named `<prefix>…` under the system's temporary folder. */
export function scratchCheckout(prefix: string): { dir: string; remove(): void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  const listed = execFileSync("git", ["ls-files", "-z", "--cached", "--others", "--exclude-standard"], {
    cwd: checkoutRoot,
  });
  for (const file of listed.toString("utf8").split("\0")) {
    if (file === "" || !existsSync(join(checkoutRoot, file))) continue;
    mkdirSync(dirname(join(dir, file)), { recursive: true });
    copyFileSync(join(checkoutRoot, file), join(dir, file));
  }
  symlinkSync(join(checkoutRoot, "node_modules"), join(dir, "node_modules"));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}
