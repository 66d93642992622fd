#!/usr/bin/env node
import { processOutput } from "./output.ts";
/**
 * lessorctl: the operator's CLI for a running Lessor (`npx lessorctl --help`).
 *
 * Run by Node 22's type stripping, like local/*.ts: `npx` puts the `node` devDependency's Node 22
 * first on PATH, so `#!/usr/bin/env node` finds it. docs/adr/008-operator-surface.md says why it is
 * not compiled.
 */
import { runCli } from "./program.ts";

process.exitCode = await runCli(process.argv.slice(2), {
  out: processOutput(),
  fetch: globalThis.fetch,
  env: process.env,
  cwd: process.cwd(),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
});
