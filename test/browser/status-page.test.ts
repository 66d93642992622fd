/**
 * The status page in a real browser (Debian's chromium driven by playwright-core) against a real
 * Lessor: `wrangler dev` on its own embedded Postgres and WebSocket proxy, started the way
 * local/start.ts and bench/campaign.ts start them, on free ports. `npm run test:browser`; .ci/run
 * runs it when /usr/bin/chromium exists.
 *
 * It signs in (a refused key first), checks the budget bar against `GET /v1/capacity`, starts a
 * campaign and watches its bar move as cron ticks advance it, breaks a tenant's login and waits
 * for it to be listed as failing with its reason, searches a tenant, checks that the key never
 * reaches a URL, runs `lessorctl capacity` against the same Lessor, and saves a screenshot
 * (docs/status-page.png).
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { after, before, describe, it } from "node:test";
import pg from "pg";
import { type BrowserContext, chromium, type Page } from "playwright-core";
import { runCli } from "../../cli/program.ts";
import {
  freePort,
  freshWorkerSecrets,
  type LocalStack,
  localWorkerVars,
  root,
  startLocalStack,
  wranglerDevArgs,
  writeEnvFile,
} from "../../local/stack.ts";
import { outputTail, waitForWorker } from "../../local/worker-ready.ts";
import { quietWranglerEnv } from "../../local/wrangler-env.ts";

const chromiumPath = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
const screenshotPath = resolve(root, "docs/status-page.png");
const secrets = freshWorkerSecrets();
const adminKey = secrets.adminKey;
const scratch = mkdtempSync(join(tmpdir(), "lessor-browser-"));

function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

/** Polls `probe` until it returns a value other than undefined, or fails with `what` after `timeoutMs`. */
async function eventually<T>(
  what: string,
  probe: () => Promise<T | undefined>,
  timeoutMs = 30_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (error) {
      last = error;
    }
    await sleep(250);
  }
  throw new Error(`timed out waiting for ${what}${last instanceof Error ? `: ${last.message}` : ""}`);
}

let stack: LocalStack | null = null;
let wrangler: ChildProcess | null = null;
const wranglerOutput = outputTail();
let browser: BrowserContext | null = null;
let page: Page;
let base = "";

async function api<T>(path: string, init: RequestInit & { json?: unknown } = {}): Promise<T> {
  const { json, ...rest } = init;
  const headers = new Headers(rest.headers);
  headers.set("Authorization", `Bearer ${adminKey}`);
  if (json !== undefined) headers.set("content-type", "application/json");
  const response = await fetch(`${base}${path}`, {
    ...rest,
    headers,
    ...(json === undefined ? {} : { body: JSON.stringify(json) }),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${init.method ?? "GET"} ${path}: ${response.status} ${text}`);
  return JSON.parse(text) as T;
}

interface Created {
  id: string;
  connectionString: string;
}

async function createTenant(id: string): Promise<Created> {
  return api<Created>("/v1/tenants", { method: "POST", json: { id } });
}

/** One statement through `/sql`, as the Neon driver sends it; returns the status. */
async function runSql(tenant: Created, query = "SELECT 1"): Promise<number> {
  const response = await fetch(`${base}/sql`, {
    method: "POST",
    headers: { "Neon-Connection-String": tenant.connectionString, "content-type": "application/json" },
    body: JSON.stringify({ query, params: [] }),
  });
  await response.text();
  return response.status;
}

async function superuser<T>(database: string, work: (client: pg.Client) => Promise<T>): Promise<T> {
  if (!stack) throw new Error("no stack");
  const client = new pg.Client(stack.pg.url(database));
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

interface CapacityHost {
  host: string;
  allocated: number;
  reserved: number;
  draining: number;
  poolCapacity: number;
}

/** The numbers the page's budget bar for `host` carries, and the widths it draws. */
async function barOf(host: string) {
  return page.evaluate((name) => {
    const bar = document.querySelector(`.bar[data-host="${name}"]`);
    if (!bar) return null;
    const width = (cls: string) => (bar.querySelector(`.${cls}`) as HTMLElement | null)?.style.width ?? "";
    return {
      allocated: Number(bar.getAttribute("data-allocated")),
      reserved: Number(bar.getAttribute("data-reserved")),
      draining: Number(bar.getAttribute("data-draining")),
      capacity: Number(bar.getAttribute("data-capacity")),
      widths: { allocated: width("allocated"), reserved: width("reserved"), draining: width("draining") },
    };
  }, host);
}

before(async () => {
  assert.ok(existsSync(chromiumPath), `${chromiumPath} is missing: apt-get install -y chromium`);
  stack = await startLocalStack({
    dataDir: join(scratch, "pg"),
    pgPort: await freePort(),
    pgPassword: randomBytes(18).toString("base64url"),
    persistent: false,
  });
  const envFile = join(scratch, "lessor.vars");
  writeEnvFile(
    envFile,
    localWorkerVars(stack, secrets, {
      LESSOR_BUDGETS: JSON.stringify({ "*": { connections: 40, reserve: 4 } }),
      // Pools stay warm for the whole test, so the bar the page draws holds still while it is compared.
      LESSOR_IDLE_TIMEOUT_MS: "600000",
    }),
  );
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  wrangler = spawn(
    process.execPath,
    wranglerDevArgs({
      port,
      envFile,
      persistTo: join(scratch, "wrangler"),
      inspectorPort: await freePort(),
      testScheduled: true,
    }),
    {
      cwd: root,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: quietWranglerEnv({
        ...process.env,
        CI: "1",
        WRANGLER_CI_DISABLE_CONFIG_WATCHING: "true",
        WRANGLER_REGISTRY_PATH: join(scratch, "registry"),
      }),
    },
  );
  for (const stream of [wrangler.stdout, wrangler.stderr]) {
    stream?.on("data", (chunk: Buffer) => wranglerOutput.push(chunk));
  }
  // Fails at once, with wrangler's output, if wrangler exits or the Worker refuses its settings.
  await waitForWorker({ url: `${base}/`, child: wrangler, output: wranglerOutput.text, timeoutMs: 180_000 });
  browser = await chromium.launchPersistentContext(join(scratch, "chromium-profile"), {
    executablePath: chromiumPath,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
    viewport: { width: 1200, height: 900 },
  });
  page = browser.pages()[0] ?? (await browser.newPage());
});

after(async () => {
  await browser?.close().catch(() => undefined);
  if (wrangler?.pid !== undefined && wrangler.exitCode === null) {
    const exited = new Promise<void>((done) => wrangler?.once("exit", () => done()));
    try {
      process.kill(-wrangler.pid, "SIGTERM");
    } catch {
      // Already gone.
    }
    await Promise.race([exited, sleep(15_000)]);
    try {
      process.kill(-wrangler.pid, "SIGKILL");
    } catch {
      // Already gone.
    }
  }
  await stack?.stop().catch(() => undefined);
  rmSync(scratch, { recursive: true, force: true });
});

describe("status page", { timeout: 600_000 }, () => {
  const tenants: Created[] = [];
  const urls: string[] = [];

  it("refuses a wrong key, then signs in without the key ever reaching a URL", async () => {
    for (const id of ["acme", "globex", "initech", "umbrella"]) tenants.push(await createTenant(id));
    for (const tenant of tenants) assert.equal(await runSql(tenant), 200);
    page.on("request", (request) => urls.push(request.url()));

    await page.goto(`${base}/status`);
    await page.fill("#admin-key", "not-the-key");
    await page.click("#login-form button[type=submit]");
    await page.waitForSelector("#login-error:text('That key was refused.')");
    assert.equal(await page.evaluate(() => sessionStorage.getItem("lessor.adminKey")), null);

    await page.fill("#admin-key", adminKey);
    await page.click("#login-form button[type=submit]");
    await page.waitForSelector("#dashboard:not([hidden])");
    await page.waitForSelector('.bar[data-host="local"]');
    assert.equal(await page.evaluate(() => sessionStorage.getItem("lessor.adminKey")), adminKey);
    assert.equal(await page.inputValue("#admin-key"), "", "the form keeps no copy of the key");
  });

  it("draws each host's budget bar with the numbers of GET /v1/capacity", async () => {
    const { hosts } = await api<{ hosts: CapacityHost[] }>("/v1/capacity");
    const local = hosts.find((h) => h.host === "local");
    assert.ok(local);
    assert.equal(local.allocated, 20, "four warm pools of 5");
    const drawn = await eventually("the bar to match /v1/capacity", async () => {
      const bar = await barOf("local");
      return bar && bar.allocated === local.allocated ? bar : undefined;
    });
    assert.deepEqual(
      {
        allocated: drawn.allocated,
        reserved: drawn.reserved,
        draining: drawn.draining,
        capacity: drawn.capacity,
      },
      {
        allocated: local.allocated,
        reserved: local.reserved,
        draining: local.draining,
        capacity: local.poolCapacity,
      },
    );
    // The drawn widths are the same shares of the pools' capacity (the browser rounds to 4 places).
    const share = (n: number) => (n / local.poolCapacity) * 100;
    for (const phase of ["allocated", "reserved", "draining"] as const) {
      const width = Number.parseFloat(drawn.widths[phase]);
      assert.ok(Math.abs(width - share(local[phase])) < 0.001, `${phase}: ${drawn.widths[phase]}`);
    }
    const readyCount = await page.textContent('#pools [data-key="ready"] dd');
    assert.equal(readyCount, "4");
  });

  it("lessorctl capacity prints the seed's lines with the same numbers", async () => {
    const lines: string[] = [];
    const code = await runCli(["--url", base, "--admin-key", adminKey, "capacity"], {
      out: { line: (t) => lines.push(t), error: (t) => lines.push(t), isTTY: false, redraw: () => undefined },
      fetch: globalThis.fetch,
      env: {},
      cwd: scratch,
      sleep,
    });
    assert.equal(code, 0, lines.join("\n"));
    assert.match(lines[0] ?? "", /^pools host=local region=default ready=4 starting=0 draining=0 failed=0$/);
    assert.match(
      lines[1] ?? "",
      /^connections allocated=20 budget=40 pool_capacity=36 startup_reserved=0 waiters=0 /,
    );
  });

  it("starts a campaign and watches its progress bar move to the end", async () => {
    // Take every tenant back to schema version 1 by hand, as bench/campaign.ts does, so the
    // campaign has real work: undo the example steps, their ledger rows, and the catalog's version.
    const placements = await superuser("lessor", async (client) => {
      const { rows } = await client.query("SELECT id, database_name FROM tenants");
      await client.query("UPDATE tenants SET schema_version = 1");
      return rows as { id: string; database_name: string }[];
    });
    for (const { database_name: database } of placements) {
      await superuser(database, async (client) => {
        await client.query("ALTER TABLE notes DROP CONSTRAINT IF EXISTS notes_slug_unique");
        await client.query("ALTER TABLE notes DROP COLUMN IF EXISTS slug");
        await client.query("DELETE FROM lessor.schema_migrations WHERE version > 1");
      });
    }
    const created = await api<{ campaign: { id: string }; enrolled: number }>("/v1/campaigns", {
      method: "POST",
      json: { toVersion: 3, concurrency: 1, canary: ["acme"], stabilityWindowMs: 0, force: true },
    });
    assert.equal(created.enrolled, tenants.length);
    const id = created.campaign.id;
    const selector = `.campaign[data-campaign="${id}"]`;
    await page.waitForSelector(selector);
    const seen = new Set<number>();
    for (let tick = 0; tick < 30; tick++) {
      const done = Number(await page.getAttribute(selector, "data-succeeded"));
      seen.add(done);
      if ((await page.getAttribute(selector, "data-state")) === "done") break;
      const response = await fetch(`${base}/__scheduled?cron=*+*+*+*+*`);
      await response.text();
      // One page refresh (3 s) per tick, so each step of the bar is drawn.
      await sleep(3_500);
    }
    await page.waitForSelector(`${selector}[data-state="done"]`, { timeout: 30_000 });
    seen.add(Number(await page.getAttribute(selector, "data-succeeded")));
    const steps = [...seen].sort((a, b) => a - b);
    assert.equal(steps[0], 0, `the bar started empty: ${steps.join(", ")}`);
    assert.equal(steps.at(-1), tenants.length, `the bar ended full: ${steps.join(", ")}`);
    assert.ok(steps.length >= 3, `the bar moved through intermediate steps: ${steps.join(", ")}`);
    const fill = await page.$eval(`${selector} .succeeded`, (node) => (node as HTMLElement).style.width);
    assert.equal(fill, "100%");
  });

  it("lists a tenant whose pool cannot start, with its reason and retry time", async () => {
    const broken = await createTenant("wile-e");
    const role = await superuser("lessor", async (client) => {
      const { rows } = await client.query("SELECT role_name FROM tenants WHERE id = 'wile-e'");
      return String((rows[0] as { role_name: string }).role_name);
    });
    await superuser("postgres", (client) => client.query(`ALTER ROLE "${role}" NOLOGIN`));
    assert.equal(await runSql(broken), 503);
    // The failure event leaves the object through its outbox on the next heartbeat (≤ 30 s).
    const row = await eventually(
      "the failing tenant to be listed",
      async () => page.$('#failing tbody tr[data-tenant="wile-e"]').then((r) => r ?? undefined),
      90_000,
    );
    const cells = await row.$$eval("td", (tds) => tds.map((td) => td.textContent ?? ""));
    assert.equal(cells[0], "wile-e");
    assert.equal(cells[1], "local");
    assert.equal(cells[2], "auth_failed");
    assert.notEqual(cells[4], "-", "a retry time is shown");
    assert.equal(await page.textContent('#pools [data-key="failed"] dd'), "1");
  });

  it("saves a screenshot of the page", async () => {
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: screenshotPath, fullPage: true });
    assert.ok(existsSync(screenshotPath));
  });

  it("searches a tenant and shows its status; never lists the catalog", async () => {
    await page.fill("#search", "glo");
    await page.click("#search-form button[type=submit]");
    await page.click("#search-results button:text('globex')");
    await page.waitForSelector("#tenant-detail:has-text('\"generation\"')");
    const detail = JSON.parse((await page.textContent("#tenant-detail")) ?? "{}") as {
      tenant: { id: string };
    };
    assert.equal(detail.tenant.id, "globex");
    assert.ok(!urls.some((url) => url.includes("/v1/tenants?")), "the page never asks for the catalog");
  });

  it("never put the key in a URL", () => {
    assert.ok(urls.length > 5);
    for (const url of urls) assert.ok(!url.includes(adminKey), `key in ${url}`);
  });
});
