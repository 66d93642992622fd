/**
 * The walkthroughs of the README and docs/ (quickstart, row-level security, rotation, erase), run
 * as written against a fresh Lessor: `wrangler dev` on its own embedded Postgres and WebSocket proxy,
 * on free ports, started as `npm start` starts it. `npm run test:walkthroughs` (about a minute);
 * like the browser test it starts a whole stack, so it is not part of `npm test`.
 *
 * Each walkthrough is its marked ```sh blocks (test/walkthroughs/blocks.ts) in one bash, `set -eu`,
 * from the repository root, picking up the variables the one before exported, the way a reader
 * pastes them into one terminal. Two things differ from a reader's terminal, and only these: the
 * URL is this stack's (`http://127.0.0.1:8787` in the text is replaced), and the tenant `acme` gets
 * a fresh id, so that nothing of a reader's own `.lessor/` is touched or reused.
 * `WALKTHROUGHS_SHOW=1 npm run test:walkthroughs` prints each walkthrough's output.
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import {
  freePort,
  type LocalStack,
  root,
  startLocalStack,
  wranglerDevArgs,
  writeEnvFile,
} from "../../local/stack.ts";
import { quietWranglerEnv } from "../../local/wrangler-env.ts";
import { type WalkthroughName, walkthrough, walkthroughOrder } from "./blocks.ts";

const adminKey = `lak_${randomBytes(24).toString("base64url")}`;
const tenant = `wt-${randomBytes(4).toString("hex")}`;
const scratch = mkdtempSync(join(tmpdir(), "lessor-walkthroughs-"));
const walkthroughTimeoutMs = 120_000;

/** What each walkthrough's output must show once it ran to its end. */
const expected: Record<WalkthroughName, { shows: string[]; never?: string[] }> = {
  quickstart: { shows: ["hello from the quickstart"] },
  rls: {
    shows: [
      "user_id: 'alice', task: 'water the plants'",
      "user_id: 'bob', task: 'call the plumber'",
      '"user_id":"bob"',
    ],
    // What bob's own request sees holds no row of alice's.
    never: ['"user_id":"alice"'],
  },
  rotation: {
    shows: ["204", "password authentication failed", '"overlapped":true', "hello from the quickstart"],
  },
  erase: { shows: ['"state":"erased"', '"code":"tenant_erased"'] },
};

let stack: LocalStack | null = null;
let wrangler: ChildProcess | null = null;
const wranglerOutput: string[] = [];
let base = "";

function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

/** Runs `script` in bash from the repository root; resolves with its exit code and output. */
function bash(script: string, timeoutMs: number): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve) => {
    const child = spawn("bash", ["-c", script], {
      cwd: root,
      env: { ...process.env, LESSOR_ADMIN_KEY: adminKey, LESSOR_URL: "", NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
    });
    let output = "";
    child.stdout.on("data", (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.stderr.on("data", (chunk: Buffer) => {
      output += chunk.toString();
    });
    const timer = setTimeout(() => {
      output += `\n(walkthrough runner: killed after ${timeoutMs} ms)\n`;
      if (child.pid !== undefined) process.kill(-child.pid, "SIGKILL");
    }, timeoutMs);
    child.on("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

before(async () => {
  stack = await startLocalStack({
    dataDir: join(scratch, "pg"),
    pgPort: await freePort(),
    pgPassword: randomBytes(18).toString("base64url"),
    persistent: false,
  });
  const envFile = join(scratch, "lessor.vars");
  writeEnvFile(envFile, {
    LESSOR_ADMIN_KEY: adminKey,
    LESSOR_SEAL_KEY: randomBytes(32).toString("base64"),
    LESSOR_KEY_MAC_KEYS: randomBytes(32).toString("base64"),
    LESSOR_CONTROL_PLANE_URL: stack.controlPlaneUrl,
    LESSOR_HOSTS: stack.hostsJson,
    LESSOR_WS_PROXY: stack.wsProxy,
  });
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  wrangler = spawn(
    process.execPath,
    wranglerDevArgs({ port, envFile, persistTo: join(scratch, "wrangler"), inspectorPort: await freePort() }),
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
    stream?.on("data", (chunk: Buffer) => {
      wranglerOutput.push(chunk.toString());
      if (wranglerOutput.length > 200) wranglerOutput.shift();
    });
  }
  const deadline = Date.now() + 180_000;
  for (;;) {
    if (wrangler.exitCode !== null)
      throw new Error(`wrangler exited:\n${wranglerOutput.join("").slice(-3000)}`);
    const ok = await fetch(`${base}/`, { signal: AbortSignal.timeout(2_000) }).then(
      (response) => response.ok,
      () => false,
    );
    if (ok) break;
    if (Date.now() > deadline) throw new Error("wrangler dev did not answer within 180 s");
    await sleep(250);
  }
});

after(async () => {
  if (wrangler?.pid !== undefined && wrangler.exitCode === null) {
    const exited = new Promise((done) => wrangler?.once("exit", done));
    process.kill(-wrangler.pid, "SIGTERM");
    await Promise.race([exited, sleep(10_000)]);
    if (wrangler.exitCode === null) process.kill(-wrangler.pid, "SIGKILL");
  }
  await stack?.stop();
  rmSync(join(root, ".lessor", "jwt-dev", `${tenant}.json`), { force: true });
  rmSync(scratch, { recursive: true, force: true });
});

describe("the walkthroughs, as written", () => {
  let state = join(scratch, "none.env");
  writeFileSync(state, "");
  for (const name of walkthroughOrder) {
    it(`${name} ends green`, { timeout: walkthroughTimeoutMs + 10_000 }, async () => {
      const blocks = walkthrough(root, name);
      assert.ok(blocks.length > 0, `no <!-- walkthrough ${name} --> block in the README or docs/`);
      const steps = blocks
        .map((block) => `# ${block.file}:${block.line}\n${block.text}`)
        .join("\n")
        .replaceAll("http://127.0.0.1:8787", base)
        .replace(/\bacme\b/g, tenant);
      const next = join(scratch, `${name}.env`);
      const script = `set -eu\nsource ${JSON.stringify(state)}\n${steps}\nexport -p > ${JSON.stringify(next)}\n`;
      const { code, output } = await bash(script, walkthroughTimeoutMs);
      const context = `walkthrough ${name} (${blocks.map((b) => `${b.file}:${b.line}`).join(", ")}):\n${output}`;
      // WALKTHROUGHS_SHOW=1 prints what a reader would see, to keep the docs' `# →` lines true.
      if (process.env.WALKTHROUGHS_SHOW) process.stdout.write(`${context}\n`);
      assert.equal(code, 0, context);
      for (const shown of expected[name].shows)
        assert.ok(output.includes(shown), `missing ${shown} in ${context}`);
      for (const never of expected[name].never ?? [])
        assert.ok(!output.includes(never), `${never} in ${context}`);
      assert.ok(readFileSync(next, "utf8").includes("LESSOR_URL"), context);
      state = next;
    });
  }
});
