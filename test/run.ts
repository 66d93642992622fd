/**
 * `npm test`'s runner: the suite in two vitest processes side by side, each with Postgres stacks of
 * its own (vitest.config.ts splits the integration files into `workers` and `workers-2`), so the
 * waits of one half (admission timeouts, polling, backoffs) overlap the work of the other. One
 * vitest process runs one integration file at a time (vitest.config.ts pins it), and files of one
 * process share a Postgres whose hosts, budgets and cron they assume are theirs alone; two
 * processes never share one.
 *
 * Each line is prefixed with its half. Exits non-zero if either half fails; both always run to the
 * end, so every failure is reported. With arguments (`npm test -- <file or filter>`), it runs one
 * vitest with them instead.
 *
 * One kind of line is not passed on: workerd's echo of an object a test aborted on purpose
 * (`ctx.abort("test: …")`, how the tests kill an object mid-work as a crash or a deploy would).
 * workerd reports each as an "uncaught exception" (the abort breaks the object's output gate), then
 * a line of its own stack addresses. The tests expect exactly that abort, so the echo says nothing;
 * the summary line counts them. Any other uncaught exception is passed on as it is. The same goes
 * for workerd's log of a TLS handshake or a connection the TCP path's tests fail on purpose.
 */
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { reportable, secretsIn } from "./output-canary.ts";
import { testSecrets } from "./secrets.ts";

const halves: { name: string; projects: string[] }[] = [
  { name: "a", projects: ["unit", "workers", "pg-restart", "canary"] },
  { name: "b", projects: ["workers-2", "control-plane-outage", "regions", "user-schema"] },
];

/** workerd's report of an output gate broken by a test's own `ctx.abort("test: …")`. */
const deliberateAbort =
  /^uncaught exception; exception = workerd\/api\/actor-state\.c\+\+:\d+: failed: broken\.outputGateBroken; jsg\.Error: test: /;
/** The line of workerd's own stack addresses that follows such a report. */
const workerdStack = /^stack:( \S*workerd@[0-9a-f]+)+$/;
/**
 * workerd's report of a socket a test refused or cut on purpose: test/integration/tcp-path.test.ts
 * offers a TLS handshake nothing trusts, no TLS at all, or cuts and resets connections mid-query,
 * and workerd logs each failed handshake and reset with its internal stack, besides throwing it to
 * the code that the test then asserts on. Any other workerd report is passed on as it is.
 */
const deliberateSocketFault =
  /^(e|exception) = rust\/cxx\/kj-hyper\/ffi\.rs:\d+: (failed: TLS handshake failed: |disconnected: Connection reset by peer)/;
/** The stack line after such a report (its addresses, and workerd's error context). */
const workerdReportStack = /^stack:( \S*workerd@[0-9a-f]+)+(; sentryErrorContext = \w+; wdErrId = \w+)?$/;
let abortsHidden = 0;
let socketFaultsHidden = 0;
/** Lines of the run's output that carried a secret (the secret canary), as they may be reported. */
const secretLines: string[] = [];
let linesSearched = 0;

/** Passes `line` on unless it is (the stack line right after) a deliberate abort's echo. */
function lineFilter(): (line: string) => boolean {
  let afterAbort = false;
  let afterFault = false;
  return (line) => {
    if (deliberateAbort.test(line)) {
      abortsHidden++;
      afterAbort = true;
      return false;
    }
    if (deliberateSocketFault.test(line)) {
      socketFaultsHidden++;
      afterFault = true;
      return false;
    }
    const stack = (afterAbort && workerdStack.test(line)) || (afterFault && workerdReportStack.test(line));
    afterAbort = false;
    afterFault = false;
    return !stack;
  };
}

function run(args: string[], prefix: string | null): Promise<number> {
  return new Promise((resolve) => {
    const child = spawn("vitest", ["run", ...args], {
      stdio: prefix === null ? "inherit" : ["ignore", "pipe", "pipe"],
      env: process.env,
    });
    if (prefix !== null) {
      for (const [stream, out] of [
        [child.stdout, process.stdout],
        [child.stderr, process.stderr],
      ] as const) {
        if (!stream) continue;
        const shown = lineFilter();
        createInterface({ input: stream }).on("line", (line) => {
          linesSearched++;
          const found = secretsIn(line, testSecrets);
          if (found.length > 0) {
            secretLines.push(`[${prefix}] ${found.join(", ")}: ${reportable(line, testSecrets)}`);
            out.write(`[${prefix}] (a line that carried a secret; see the canary's report below)\n`);
            return;
          }
          if (shown(line)) out.write(`[${prefix}] ${line}\n`);
        });
      }
    }
    child.on("error", (error) => {
      process.stderr.write(`[${prefix ?? "vitest"}] could not start vitest: ${error.message}\n`);
      resolve(1);
    });
    child.on("exit", (code, signal) => resolve(code ?? (signal ? 1 : 0)));
  });
}

const extra = process.argv.slice(2);
if (extra.length > 0) {
  process.exitCode = await run(extra, null);
} else {
  const started = Date.now();
  const codes = await Promise.all(
    halves.map((half) =>
      run(
        half.projects.flatMap((project) => ["--project", project]),
        half.name,
      ),
    ),
  );
  const seconds = Math.round((Date.now() - started) / 1000);
  const failed = halves.filter((_, i) => codes[i] !== 0).map((half) => half.name);
  // The secret canary: not one line of either half's output may carry a secret of the stacks.
  if (secretLines.length > 0) {
    process.stdout.write(
      `npm test: secret canary FAILED: ${secretLines.length} of ${linesSearched} lines carried a secret:\n${secretLines.join("\n")}\n`,
    );
  } else {
    process.stdout.write(`npm test: secret canary: no secret in ${linesSearched} lines of output\n`);
  }
  const notShown = [
    ...(abortsHidden > 0 ? [`${abortsHidden} objects aborted on purpose by tests`] : []),
    ...(socketFaultsHidden > 0
      ? [`${socketFaultsHidden} sockets refused or cut on purpose by the TCP path's tests`]
      : []),
  ];
  const hidden = notShown.length > 0 ? ` (${notShown.join("; ")}; workerd's echoes not shown)` : "";
  process.stdout.write(
    failed.length === 0
      ? `npm test: both halves passed in ${seconds} s${hidden}\n`
      : `npm test: half ${failed.join(" and ")} FAILED (${seconds} s); see the lines prefixed [${failed.join("], [")}]\n`,
  );
  process.exitCode = failed.length === 0 && secretLines.length === 0 ? 0 : 1;
}
