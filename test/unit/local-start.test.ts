/**
 * What `npm start` decides before and around the stack: refusing a second start (and taking over
 * a stale pid file), refusing a taken port, which Postgres log lines it shows, and the cron
 * self-trigger. Node-side, on loopback and in temporary folders; no Postgres, no wrangler.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Command } from "commander";
import { afterEach, describe, expect, it } from "vitest";
import { commandContext } from "../../cli/context.ts";
import { startBanner } from "../../local/banner.ts";
import {
  localCronEnabled,
  msUntilNextMinute,
  scheduledUrl,
  startLocalCron,
  triggerScheduled,
} from "../../local/cron.ts";
import {
  isTenantRole,
  lineSplitter,
  postgresLogFlags,
  requestLogEnabled,
  stackOutputFilter,
} from "../../local/output-filter.ts";
import { openPostgresLog } from "../../local/postgres-log.ts";
import { claimStateDir, describeRunning, isRunning, portFromEnv, portInUse } from "../../local/preflight.ts";
import { type LocalSecrets, localSecrets } from "../../local/secrets.ts";
import { localRegionNames } from "../../local/stack.ts";
import { quietWranglerEnv } from "../../local/wrangler-env.ts";

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

function tempStateDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "lessor-start-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * A live process whose command line carries `marker` (as `local/start.ts` or `postgres` would).
 * Answers once its command line says so: right after the fork the child still shows this
 * process's, and a loaded machine can leave it there long enough for a check to read it.
 */
async function sleeper(marker: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)", marker], { stdio: "ignore" });
  cleanups.push(() => void child.kill("SIGKILL"));
  await new Promise<void>((done, fail) => {
    child.once("spawn", done);
    child.once("error", fail);
  });
  if (!hasProc) return child;
  for (let tries = 0; tries < 500; tries++) {
    let cmdline = "";
    try {
      cmdline = readFileSync(`/proc/${child.pid}/cmdline`, "utf8");
    } catch {
      // Not readable yet.
    }
    if (cmdline.includes(marker)) return child;
    await new Promise((done) => setTimeout(done, 10));
  }
  throw new Error(`the sleeper's command line never showed ${marker}`);
}

/** The pid of a process that has exited. */
async function deadPid(): Promise<number> {
  const child = spawn(process.execPath, ["-e", ""], { stdio: "ignore" });
  await new Promise((done) => child.once("exit", done));
  if (child.pid === undefined) throw new Error("no pid");
  return child.pid;
}

async function listen(handler: Parameters<typeof createServer>[1]): Promise<{ server: Server; url: string }> {
  const server = createServer(handler);
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  cleanups.push(() => {
    server.closeAllConnections();
    return new Promise<void>((done) => server.close(() => done()));
  });
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

const hasProc = existsSync("/proc/self/cmdline");

describe("npm start: already running", () => {
  it("takes over a stale pid file whose process is dead, and releases it on exit", async () => {
    const dir = tempStateDir();
    writeFileSync(join(dir, "lessor.pid"), `${await deadPid()}\n`);
    const claim = claimStateDir(dir);
    expect(claim.ok).toBe(true);
    expect(readFileSync(join(dir, "lessor.pid"), "utf8")).toBe(`${process.pid}\n`);
    if (claim.ok) claim.release();
    expect(existsSync(join(dir, "lessor.pid"))).toBe(false);
  });

  it("refuses while the pid file's Lessor runs, with the line npm start prints", async () => {
    const dir = tempStateDir();
    const other = await sleeper("local/start.ts");
    writeFileSync(join(dir, "lessor.pid"), `${other.pid}\nhttp://127.0.0.1:8790\n`);
    const claim = claimStateDir(dir, process.pid, "http://127.0.0.1:8787");
    expect(claim).toEqual({
      ok: false,
      running: { kind: "lessor", pid: other.pid, url: "http://127.0.0.1:8790" },
    });
    // Where it runs, and how to stop it.
    if (!claim.ok)
      expect(describeRunning(claim.running, dir)).toBe(
        `Lessor is already running at http://127.0.0.1:8790 (pid ${other.pid}, state in ${dir}); ` +
          `use it, or stop it with Ctrl-C in its terminal or: kill -INT ${other.pid}`,
      );
    // The refused start leaves the running one's pid file alone.
    expect(readFileSync(join(dir, "lessor.pid"), "utf8")).toBe(`${other.pid}\nhttp://127.0.0.1:8790\n`);
  });

  it("writes where it serves into its pid file, and a pid file without it still refuses", async () => {
    const dir = tempStateDir();
    const claim = claimStateDir(dir, process.pid, "http://127.0.0.1:8787");
    expect(readFileSync(join(dir, "lessor.pid"), "utf8")).toBe(`${process.pid}\nhttp://127.0.0.1:8787\n`);
    if (claim.ok) claim.release();
    const other = await sleeper("local/start.ts");
    writeFileSync(join(dir, "lessor.pid"), `${other.pid}\n`);
    const refused = claimStateDir(dir);
    if (!refused.ok)
      expect(describeRunning(refused.running, dir)).toMatch(
        /^Lessor is already running \(pid \d+, state in /,
      );
    expect(refused.ok).toBe(false);
  });

  it.skipIf(!hasProc)("takes a live pid of an unrelated process for a stale one (pid reuse)", async () => {
    const dir = tempStateDir();
    const unrelated = await sleeper("something-else");
    writeFileSync(join(dir, "lessor.pid"), `${unrelated.pid}\n`);
    expect(claimStateDir(dir).ok).toBe(true);
  });

  it("refuses over a live Postgres left by a killed run, and says how to stop it", async () => {
    const dir = tempStateDir();
    mkdirSync(join(dir, "pg"));
    const postgres = await sleeper("postgres");
    writeFileSync(join(dir, "pg", "postmaster.pid"), `${postgres.pid}\n/data\n1700000000\n54329\n`);
    const claim = claimStateDir(dir);
    expect(claim).toEqual({ ok: false, running: { kind: "postgres", pid: postgres.pid } });
    if (!claim.ok) expect(describeRunning(claim.running, dir)).toContain(`kill -INT ${postgres.pid}`);
    expect(existsSync(join(dir, "lessor.pid"))).toBe(false);
  });

  it("starts over a postmaster.pid whose Postgres is dead", async () => {
    const dir = tempStateDir();
    mkdirSync(join(dir, "pg"));
    writeFileSync(join(dir, "pg", "postmaster.pid"), `${await deadPid()}\n`);
    expect(claimStateDir(dir).ok).toBe(true);
  });

  it("isRunning: a dead pid is not running", async () => {
    expect(isRunning(await deadPid(), /./)).toBe(false);
    expect(isRunning(process.pid, /./)).toBe(true);
  });
});

describe("npm start: ports", () => {
  it("finds a port in use while a server holds it, and free once it is closed", async () => {
    const { server } = await listen((_req, res) => res.end());
    const { port } = server.address() as AddressInfo;
    expect(await portInUse(port)).toBe(true);
    await new Promise<void>((done) => server.close(() => done()));
    expect(await portInUse(port)).toBe(false);
  });

  it("reads a port from the environment, or refuses one that is not a port", () => {
    expect(portFromEnv("PORT", undefined, 8787)).toBe(8787);
    expect(portFromEnv("PORT", "", 8787)).toBe(8787);
    expect(portFromEnv("PORT", "9000", 8787)).toBe(9000);
    expect(() => portFromEnv("PORT", "80a", 8787)).toThrow('PORT must be a port number (1-65535), not "80a"');
    expect(() => portFromEnv("LESSOR_PG_PORT", "70000", 1)).toThrow("LESSOR_PG_PORT must be a port number");
  });
});

describe("npm start: what it shows of Postgres and wrangler", () => {
  const terminating =
    "2026-11-30 12:00:00.000 UTC [42] FATAL:  terminating connection due to administrator command";
  const poolWarning =
    '▲ [WARNING] {"level":"warn","event":"pool_connection_error","tenant":"acme","generation":1,"failure":"error 57P01"}';

  it("shows errors, and hides the noise of a shutdown only once one is under way", () => {
    const filter = stackOutputFilter();
    expect(filter.showPostgres("2026-11-30 12:00:00.000 UTC [40] LOG:  checkpoint starting: time")).toBe(
      false,
    );
    expect(filter.showPostgres('2026-11-30 12:00:00.000 UTC [41] ERROR:  relation "x" does not exist')).toBe(
      true,
    );
    // Outside a shutdown the same lines mean someone terminated backends: they show.
    expect(filter.showPostgres(terminating)).toBe(true);
    expect(filter.worker(poolWarning)).toEqual([poolWarning]);
    const controlPlaneWarning =
      '▲ [WARNING] {"level":"warn","event":"control_plane_connection_error","region":"default","failure":"error 57P01: terminating connection due to administrator command"}';
    expect(filter.worker(controlPlaneWarning)).toEqual([controlPlaneWarning]);
    filter.expectShutdown();
    expect(filter.worker(controlPlaneWarning)).toEqual([]);
    expect(filter.showPostgres(terminating)).toBe(false);
    expect(
      filter.showPostgres("2026-11-30 12:00:00.000 UTC [43] FATAL:  the database system is shutting down"),
    ).toBe(false);
    expect(filter.worker(poolWarning)).toEqual([]);
    // Real errors still show during a shutdown.
    expect(
      filter.showPostgres(
        '2026-11-30 12:00:00.000 UTC [44] FATAL:  password authentication failed for user "x"',
      ),
    ).toBe(true);
    expect(filter.showPostgres("2026-11-30 12:00:00.000 UTC [45] PANIC:  could not write to file")).toBe(
      true,
    );
    expect(filter.worker("✘ [ERROR] Address already in use (127.0.0.1:8787)")).toEqual([
      "✘ [ERROR] Address already in use (127.0.0.1:8787)",
    ]);
  });

  it("takes a shutdown Postgres announces itself (a Ctrl-C that reached it directly) as expected", () => {
    const filter = stackOutputFilter();
    expect(filter.showPostgres("2026-11-30 12:00:00.000 UTC [1] LOG:  received fast shutdown request")).toBe(
      false,
    );
    expect(filter.showPostgres(terminating)).toBe(false);
    expect(filter.worker(poolWarning)).toEqual([]);
  });

  // As npm start has Postgres prefix its lines (postgresLogFlags): time, pid, then role@database.
  const at = "2026-11-30 12:00:00.000 UTC [41]";
  const tenant = "t_0123456789abcdef";

  it("keeps a tenant's own SQL errors off the console, and Lessor's and the server's on it", () => {
    const filter = stackOutputFilter();
    // The tenant's session: its role, or its end users' login role, and what follows its message.
    expect(
      filter.showPostgres(`${at} ${tenant}@${tenant} ERROR:  syntax error at or near "SELEC" at character 1`),
    ).toBe(false);
    expect(filter.showPostgres("  ERROR here is part of the same message")).toBe(false);
    expect(
      filter.showPostgres(`${at} ${tenant}_jwt@${tenant} ERROR:  permission denied for table notes`),
    ).toBe(false);
    expect(
      filter.showPostgres(
        `${at} ${tenant}@${tenant} FATAL:  terminating connection due to idle-in-transaction timeout`,
      ),
    ).toBe(false);
    expect(filter.showPostgres(`${at} tenant_acme@tenant_acme ERROR:  division by zero`)).toBe(false);
    // Lessor's own sessions and the server's: shown.
    expect(
      filter.showPostgres(`${at} lessor_admin@postgres ERROR:  permission denied for database postgres`),
    ).toBe(true);
    expect(filter.showPostgres("  ERROR here is part of Lessor's message")).toBe(true);
    expect(
      filter.showPostgres(`${at} [unknown]@[unknown] FATAL:  password authentication failed for user "x"`),
    ).toBe(true);
    expect(filter.showPostgres(`${at} FATAL:  could not write lock file "postmaster.pid"`)).toBe(true);
    // A PANIC is the server's, whoever's session hit it.
    expect(
      filter.showPostgres(`${at} ${tenant}@${tenant} PANIC:  could not write to file "pg_wal/xlogtemp"`),
    ).toBe(true);
    // Not a tenant role, only like one.
    expect(filter.showPostgres(`${at} t_notatenant@postgres ERROR:  x`)).toBe(true);
    expect(isTenantRole(tenant)).toBe(true);
    expect(isTenantRole(`${tenant}_jwt`)).toBe(true);
    expect(isTenantRole("lessor_admin")).toBe(false);
  });

  it("runs Postgres with a prefix that names the session's role, and no statement text in its log", () => {
    expect(postgresLogFlags).toEqual([
      "-c",
      "log_line_prefix=%m [%p] %q%u@%d ",
      "-c",
      "log_min_error_statement=panic",
    ]);
    expect(readFileSync(join(import.meta.dirname, "../../local/start.ts"), "utf8")).toContain(
      "pgFlags: postgresLogFlags",
    );
  });

  it("leaves out request lines unless LESSOR_LOCAL_REQUEST_LOG turns them on", () => {
    const request = "[wrangler:info] POST /sql 200 OK (8ms)";
    const scheduled = "[wrangler:info] GET /__scheduled 200 OK (45ms)";
    const quiet = stackOutputFilter();
    expect(quiet.worker(request)).toEqual([]);
    expect(quiet.worker(scheduled)).toEqual([]);
    expect(quiet.worker("\u001b[2m[wrangler:info]\u001b[22m GET /v1/tenants 401 Unauthorized (3ms)")).toEqual(
      [],
    );
    // What is not a request line still shows.
    expect(quiet.worker("[wrangler:info] Ready on http://127.0.0.1:8787")).toEqual([
      "[wrangler:info] Ready on http://127.0.0.1:8787",
    ]);
    expect(quiet.worker('{"level":"info","event":"tenant_provisioned","tenant":"acme"}')).toHaveLength(1);
    expect(stackOutputFilter({ requests: true }).worker(request)).toEqual([request]);
    for (const value of ["on", "1", "true", "YES"]) expect(requestLogEnabled(value)).toBe(true);
    for (const value of [undefined, "", "off", "0"]) expect(requestLogEnabled(value)).toBe(false);
  });

  it("shows wrangler's bindings table once, then after a reload only the bindings that changed", () => {
    const table = (poolSizes: string, extra: string[] = []) => [
      "Using secrets defined in .lessor/dev.vars",
      "Your Worker has access to the following bindings:",
      "Binding                                                   Resource                  Mode",
      "env.TENANTS (TenantObject)                                Durable Object            local",
      `env.LESSOR_POOL_SIZES ("${poolSizes}")                   Environment Variable      local`,
      ...extra,
      'env.LESSOR_ADMIN_KEY ("(hidden)")                         Environment Variable      local',
      "",
    ];
    const filter = stackOutputFilter();
    const shown = (lines: string[]) => lines.flatMap((line) => filter.worker(line));
    const first = table('{"standard":5}');
    expect(shown([...first, "⎔ Starting local server..."])).toEqual([...first, "⎔ Starting local server..."]);
    // A reload with the same bindings: nothing but wrangler's own reload line.
    expect(shown(["⎔ Reloading local server...", ...table('{"standard":5}')])).toEqual([
      "⎔ Reloading local server...",
    ]);
    // A reload that raised a tier's size: that row, said once.
    const raised = table('{"standard":6}', [
      'env.LESSOR_UPGRADE_ON_DEMAND ("true")                      Environment Variable      local',
    ]);
    expect(shown([...raised, "⎔ Local server updated and ready"])).toEqual([
      "wrangler reloaded its configuration; bindings that changed:",
      `env.LESSOR_POOL_SIZES ("{"standard":6}")                   Environment Variable      local`,
      'env.LESSOR_UPGRADE_ON_DEMAND ("true")                      Environment Variable      local',
      "⎔ Local server updated and ready",
    ]);
    // And one removed.
    expect(shown(table('{"standard":6}'))).toEqual([
      "wrangler reloaded its configuration; bindings that changed:",
      'env.LESSOR_UPGRADE_ON_DEMAND ("true")                      Environment Variable      local  (removed)',
    ]);
  });

  it("cuts output into lines however the chunks fall, multi-byte characters included", () => {
    const lines: string[] = [];
    const splitter = lineSplitter((line) => lines.push(line));
    const bytes = Buffer.from("⛅️ wrangler\nReady on http://127.0.0.1:8787\ntail");
    for (let i = 0; i < bytes.length; i += 3) splitter.push(bytes.subarray(i, i + 3));
    expect(lines).toEqual(["⛅️ wrangler", "Ready on http://127.0.0.1:8787"]);
    splitter.flush();
    expect(lines).toEqual(["⛅️ wrangler", "Ready on http://127.0.0.1:8787", "tail"]);
  });
});

describe("npm start: cron self-trigger", () => {
  it("is on unless LESSOR_LOCAL_CRON says off", () => {
    for (const value of [undefined, "", "on", "1", "yes"]) expect(localCronEnabled(value)).toBe(true);
    for (const value of ["off", "OFF", "0", "false", "no", " off "])
      expect(localCronEnabled(value)).toBe(false);
  });

  it("fires at the start of each minute", () => {
    expect(msUntilNextMinute(Date.parse("2026-11-30T12:00:00.000Z"))).toBe(60_000);
    expect(msUntilNextMinute(Date.parse("2026-11-30T12:00:59.250Z"))).toBe(750);
  });

  it("takes a timer that fired a moment early as its own minute, not as one more tick right after", () => {
    // Seen in npm start: a tick at 12:00:59.999 set the next for 12:01:00.000, found itself running,
    // and printed "this minute skipped".
    expect(msUntilNextMinute(Date.parse("2026-11-30T12:00:59.999Z"))).toBe(60_001);
    expect(msUntilNextMinute(Date.parse("2026-11-30T12:00:59.500Z"))).toBe(60_500);
    expect(msUntilNextMinute(Date.parse("2026-11-30T12:01:00.003Z"))).toBe(59_997);
  });

  it("calls wrangler's /__scheduled with the cron expression, and reports failures in one line", async () => {
    const seen: string[] = [];
    const ok = await listen((req, res) => {
      seen.push(req.url ?? "");
      res.end("Ran scheduled event");
    });
    expect(scheduledUrl(ok.url)).toBe(`${ok.url}/__scheduled?cron=*+*+*+*+*`);
    expect(await triggerScheduled(ok.url)).toBeUndefined();
    expect(seen).toEqual(["/__scheduled?cron=*+*+*+*+*"]);

    const broken = await listen((_req, res) =>
      res.writeHead(500).end("Error: boom\n    at scheduled (x.ts:1)\n"),
    );
    expect(await triggerScheduled(broken.url)).toBe("HTTP 500: Error: boom at scheduled (x.ts:1)");

    const slow = await listen(() => undefined);
    expect(await triggerScheduled(slow.url, 100)).toBe("no answer within 100 ms");

    await new Promise<void>((done) => broken.server.close(() => done()));
    const refused = await triggerScheduled(broken.url);
    expect(refused).toContain("ECONNREFUSED");
    expect(refused).not.toContain("\n");
  });

  it("keeps firing after failures, logs each in one line, and stops when told", async () => {
    let hits = 0;
    const target = await listen((_req, res) => {
      hits++;
      res.writeHead(hits % 2 === 0 ? 503 : 200).end("nope");
    });
    const lines: string[] = [];
    const cron = startLocalCron({ baseUrl: target.url, log: (line) => lines.push(line), delay: () => 40 });
    for (let i = 0; i < 50 && hits < 4; i++) await new Promise((done) => setTimeout(done, 20));
    cron.stop();
    const hitsAtStop = hits;
    await new Promise((done) => setTimeout(done, 150));
    expect(hitsAtStop).toBeGreaterThanOrEqual(4);
    expect(hits).toBeLessThanOrEqual(hitsAtStop + 1);
    expect(lines.length).toBeGreaterThanOrEqual(1);
    for (const line of lines) expect(line).toBe("[cron] scheduled self-trigger failed: HTTP 503: nope");
  });
});

describe("npm start: nothing phones home", () => {
  it("runs wrangler with the cf fetch, metrics, error reports and update check off", () => {
    const env = quietWranglerEnv({ PATH: "/bin" });
    expect(env).toMatchObject({
      PATH: "/bin",
      CLOUDFLARE_CF_FETCH_ENABLED: "false",
      WRANGLER_SEND_METRICS: "false",
      WRANGLER_SEND_ERROR_REPORTS: "false",
      WRANGLER_HIDE_BANNER: "true",
    });
  });

  it("lets the environment turn any of them back on", () => {
    expect(quietWranglerEnv({ CLOUDFLARE_CF_FETCH_ENABLED: "true" }).CLOUDFLARE_CF_FETCH_ENABLED).toBe(
      "true",
    );
  });

  it("is what npm start and the demo spawn wrangler with, and wrangler.toml sends no metrics", () => {
    const read = (file: string) => readFileSync(join(import.meta.dirname, "../..", file), "utf8");
    expect(read("local/start.ts")).toContain("env: quietWranglerEnv()");
    expect(read("local/demo.ts")).toContain("env: quietWranglerEnv(");
    expect(read("wrangler.toml")).toMatch(/^send_metrics = false$/m);
  });
});

describe("npm start: the banner", () => {
  const facts = {
    baseUrl: "http://127.0.0.1:8787",
    pid: 4242,
    adminKeyFrom: "secrets-file" as const,
    pgPort: 54329,
    cron: { on: true } as const,
  };

  it("on a first start, gives the quickstart with the variables the docs use", () => {
    const lines = startBanner({ ...facts, firstStart: true });
    expect(lines).toContain("Lessor is running at http://127.0.0.1:8787 (pid 4242; Ctrl-C stops it)");
    expect(lines.join("\n")).toContain(`export KEY=$(node -p 'require("./.lessor/secrets.json").adminKey')`);
    expect(lines).toContain("  export LESSOR_URL=http://127.0.0.1:8787");
    expect(lines).toContain(
      "  export LESSOR_CONNECTION_STRING=$(npx lessorctl tenants create acme --connection-string)",
    );
    expect(lines.join("\n")).toContain("to start over: stop Lessor, rm -rf .lessor, npm start");
  });

  it("after a restart, suggests no tenant that already exists (acme would answer 409)", () => {
    const lines = startBanner({
      ...facts,
      adminKeyFrom: "environment",
      firstStart: false,
      cron: { on: false, setting: "off" },
    });
    expect(lines.join("\n")).toContain("the LESSOR_ADMIN_KEY you set (not printed");
    expect(lines.join("\n")).not.toContain("create acme");
    expect(lines.join("\n")).toContain("npx lessorctl tenants create <new id> --connection-string");
    expect(lines.join("\n")).toContain("npx lessorctl tenants key <id> --connection-string");
    expect(lines.join("\n")).toContain("Cron: off (LESSOR_LOCAL_CRON=off)");
  });
});

describe("LESSOR_LOCAL_REGIONS", () => {
  it("names the regions besides the default one, and refuses what is not a region name", () => {
    expect(localRegionNames(undefined)).toEqual([]);
    expect(localRegionNames(" ")).toEqual([]);
    expect(localRegionNames("eu")).toEqual(["eu"]);
    expect(localRegionNames("eu, ap2")).toEqual(["eu", "ap2"]);
    expect(localRegionNames("EU")).toMatchObject({ problem: expect.stringMatching(/not a region name/) });
    expect(localRegionNames("eu-west")).toMatchObject({
      problem: expect.stringMatching(/not a region name/),
    });
    expect(localRegionNames("default")).toMatchObject({
      problem: expect.stringMatching(/not a region name/),
    });
    expect(localRegionNames("eu,eu")).toMatchObject({ problem: expect.stringMatching(/twice/) });
  });
});

describe("npm start: one admin key", () => {
  const stored: LocalSecrets = {
    adminKey: "lak_generated",
    sealKey: "seal",
    keyMacKey: "mac",
    pgPassword: "pw",
  };

  it("makes LESSOR_ADMIN_KEY the kept key, so lessorctl and the banner's file name the key the Worker runs with", () => {
    const { secrets, write } = localSecrets(stored, "lak_mine");
    expect(secrets).toEqual({ ...stored, adminKey: "lak_mine" });
    expect(write).toBe(true);
    // The next start, with or without the variable, runs with the same key, and writes nothing.
    expect(localSecrets(secrets, undefined)).toEqual({ secrets, write: false });
    expect(localSecrets(secrets, "lak_mine")).toEqual({ secrets, write: false });
    expect(localSecrets(secrets, "")).toEqual({ secrets, write: false });
  });

  it("generates every secret on a first start, and a MAC key for a file that predates it", () => {
    const first = localSecrets(null, undefined);
    expect(first.write).toBe(true);
    expect(first.secrets.adminKey).toMatch(/^lak_[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(first.secrets.keyMacKey, "base64")).toHaveLength(32);
    expect(localSecrets(null, "lak_mine").secrets.adminKey).toBe("lak_mine");
    const { keyMacKey: _none, ...older } = stored;
    const upgraded = localSecrets(older, undefined);
    expect(upgraded.write).toBe(true);
    expect(upgraded.secrets).toMatchObject({ adminKey: "lak_generated", sealKey: "seal", pgPassword: "pw" });
    expect(Buffer.from(upgraded.secrets.keyMacKey, "base64")).toHaveLength(32);
  });

  it("is what npm start runs with: lessorctl, started in this checkout, reads the key the Worker has", async () => {
    const dir = tempStateDir();
    const { secrets } = localSecrets(stored, "lak_mine");
    mkdirSync(join(dir, ".lessor"));
    writeFileSync(join(dir, ".lessor", "secrets.json"), JSON.stringify(secrets));
    const start = readFileSync(join(import.meta.dirname, "../../local/start.ts"), "utf8");
    expect(start).toContain("localSecrets(stored, process.env.LESSOR_ADMIN_KEY)");
    // The Worker's settings are made from those secrets (localWorkerVars: LESSOR_ADMIN_KEY among them).
    expect(start).toContain("localWorkerVars(stack, secrets");
    // lessorctl's own lookup for a loopback Lessor (cli/context.ts), with no LESSOR_ADMIN_KEY in its shell.
    const sent: (string | null)[] = [];
    const client = commandContext({
      out: { line: () => undefined, error: () => undefined, isTTY: false, redraw: () => undefined },
      fetch: async (_url, init) => {
        sent.push(new Headers(init?.headers).get("authorization"));
        return new Response("{}");
      },
      env: { LESSOR_URL: "http://127.0.0.1:8787" },
      cwd: dir,
      sleep: async () => undefined,
    }).client(new Command());
    await client.call("GET", "/v1/capacity");
    expect(sent).toEqual(["Bearer lak_mine"]);
  });
});

describe("npm start: .lessor/postgres.log", () => {
  it("keeps every line of a run, and moves the previous run's (and a full file's) to .1", () => {
    const dir = tempStateDir();
    const path = join(dir, "postgres.log");
    const first = openPostgresLog(path);
    first.line("2026-11-30 12:00:00.000 UTC [41] t_0123456789abcdef@t_0123456789abcdef ERROR:  syntax error");
    first.close();
    const second = openPostgresLog(path, 100);
    expect(readFileSync(`${path}.1`, "utf8")).toContain("ERROR:  syntax error");
    expect(readFileSync(path, "utf8")).toBe("");
    second.line("a".repeat(60));
    second.line("b".repeat(60));
    second.close();
    expect(readFileSync(`${path}.1`, "utf8")).toBe(`${"a".repeat(60)}\n`);
    expect(readFileSync(path, "utf8")).toBe(`${"b".repeat(60)}\n`);
  });
});
