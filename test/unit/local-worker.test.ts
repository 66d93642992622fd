/**
 * What every script that runs `wrangler dev` gives it (local/stack.ts `localWorkerVars`) and how it
 * waits for it (local/worker-ready.ts): the browser test once gave it a list of its own that
 * lacked a setting the Worker came to require, waited 180 s on a Worker that answered every
 * request `500 misconfigured`, and reported the first probe's "fetch failed" without a word of
 * wrangler's output. Node-side, on loopback; no wrangler.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer, type RequestListener } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { freePort, freshWorkerSecrets, localWorkerVars } from "../../local/stack.ts";
import { outputTail, waitForWorker } from "../../local/worker-ready.ts";
import { loadConfig } from "../../src/config/index.ts";

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const read = (file: string) => readFileSync(join(import.meta.dirname, "../..", file), "utf8");

/** wrangler.toml's `[vars]`: one `NAME = "value"` or `NAME = 'value'` a line. */
function tomlVars(): Record<string, string> {
  const section =
    read("wrangler.toml")
      .split(/^\[vars\]$/m)[1]
      ?.split(/^\[/m)[0] ?? "";
  const vars: Record<string, string> = {};
  for (const match of section.matchAll(/^(\w+) = (?:"([^"]*)"|'([^']*)')$/gm)) {
    const [, name, double, single] = match;
    if (name) vars[name] = double ?? single ?? "";
  }
  return vars;
}

const stack = {
  controlPlaneUrl: "postgres://lessor_admin:pw@127.0.0.1:54329/lessor",
  hostsJson: JSON.stringify({ local: "postgres://lessor_admin:pw@127.0.0.1:54329/postgres" }),
  wsProxy: "127.0.0.1:40000",
};

describe("localWorkerVars", () => {
  it("with wrangler.toml's vars, is every setting the Worker needs: its configuration loads", () => {
    const vars = tomlVars();
    expect(Object.keys(vars)).toContain("LESSOR_POOL_SIZES");
    const config = loadConfig({ ...vars, ...localWorkerVars(stack, freshWorkerSecrets()) } as unknown as Env);
    expect([...config.hosts.keys()]).toEqual(["local"]);
    expect(config.wsProxy).toBe(stack.wsProxy);
  });

  it("is what the check above would catch: without the MAC key the configuration is refused", () => {
    const { LESSOR_KEY_MAC_KEYS: _left, ...without } = localWorkerVars(stack, freshWorkerSecrets());
    expect(() => loadConfig({ ...tomlVars(), ...without } as unknown as Env)).toThrow(/LESSOR_KEY_MAC_KEYS/);
  });

  it("lets a script add and override settings", () => {
    const vars = localWorkerVars(stack, freshWorkerSecrets(), { LESSOR_IDLE_TIMEOUT_MS: "600000" });
    expect(vars.LESSOR_IDLE_TIMEOUT_MS).toBe("600000");
    expect(localWorkerVars(stack, freshWorkerSecrets(), { LESSOR_HOSTS: "{}" }).LESSOR_HOSTS).toBe("{}");
  });

  it("is what npm start, the demo and the browser test give wrangler", () => {
    for (const file of ["local/start.ts", "local/demo.ts", "test/browser/status-page.test.ts"]) {
      expect(read(file), file).toContain("localWorkerVars(");
    }
    for (const file of ["local/demo.ts", "test/browser/status-page.test.ts"]) {
      expect(read(file), file).toContain("waitForWorker(");
    }
  });
});

async function listen(handler: RequestListener): Promise<{ url: string; hits: () => number }> {
  let hits = 0;
  const server = createServer((req, res) => {
    hits++;
    handler(req, res);
  });
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  cleanups.push(() => {
    server.closeAllConnections();
    return new Promise<void>((done) => server.close(() => done()));
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/`, hits: () => hits };
}

/** A live process standing in for wrangler (it never exits by itself). */
function runningChild(): ChildProcess {
  const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"], { stdio: "ignore" });
  cleanups.push(() => void child.kill("SIGKILL"));
  return child;
}

describe("waitForWorker", () => {
  it("waits out wrangler's own error page and resolves once the Worker answers 200", async () => {
    let answered = 0;
    const worker = await listen((_req, res) => {
      answered++;
      if (answered <= 2) res.writeHead(503, { "content-type": "text/plain" }).end("starting");
      else res.writeHead(200, { "content-type": "application/json" }).end('{"service":"lessor"}');
    });
    await waitForWorker({
      url: worker.url,
      child: runningChild(),
      output: () => "",
      timeoutMs: 30_000,
      intervalMs: 10,
    });
    expect(worker.hits()).toBe(3);
  });

  it("fails at once when Lessor refuses its settings, with wrangler's output and the Worker's reason", async () => {
    const output = outputTail();
    const worker = await listen((_req, res) => {
      res
        .writeHead(500, { "content-type": "application/json" })
        .end(
          '{"code":"misconfigured","message":"Lessor is misconfigured; the operator has been told in the logs."}',
        );
      // As wrangler prints them: the Worker's log line, then the request's (colours and all).
      output.push(
        '\u001b[31m✘ [ERROR]\u001b[0m {"level":"error","event":"request_failed","failure":"LESSOR_KEY_MAC_KEYS: is not set"}\n',
      );
      output.push("[wrangler:info] GET / 500 Internal Server Error (3ms)\n");
    });
    output.push("[wrangler:info] Ready on http://127.0.0.1:8787\n");
    const failure = await waitForWorker({
      url: worker.url,
      child: runningChild(),
      output: output.text,
      timeoutMs: 600_000,
      intervalMs: 10,
    }).catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(Error);
    const message = (failure as Error).message;
    expect(message).toContain("the Worker refuses to serve");
    expect(message).toContain('HTTP 500: {"code":"misconfigured"');
    expect(message).toContain("LESSOR_KEY_MAC_KEYS: is not set");
    expect(message).toContain("[wrangler:info] GET / 500");
    expect(message).not.toContain("\u001b[");
    // One look, not a wait for the timeout: a refused setting does not change by waiting.
    expect(worker.hits()).toBe(1);
  });

  it("fails at once when wrangler exits, with what it printed", async () => {
    const output = outputTail();
    const child = spawn(
      process.execPath,
      ["-e", "console.error('✘ [ERROR] Address already in use'); process.exit(1)"],
      {
        stdio: ["ignore", "ignore", "pipe"],
      },
    );
    child.stderr?.on("data", (chunk: Buffer) => output.push(chunk));
    await new Promise((done) => child.once("exit", done));
    const failure = await waitForWorker({
      url: `http://127.0.0.1:${await freePort()}/`,
      child,
      output: output.text,
      timeoutMs: 600_000,
    }).catch((error: unknown) => error);
    expect((failure as Error).message).toMatch(/wrangler dev exited \(1\)/);
    expect((failure as Error).message).toContain("Address already in use");
  });

  it("after its timeout, names the last thing it saw (not the first probe's), and wrangler's output", async () => {
    const output = outputTail();
    output.push("⎔ Starting local server...\n");
    const failure = await waitForWorker({
      url: `http://127.0.0.1:${await freePort()}/`,
      child: runningChild(),
      output: output.text,
      timeoutMs: 200,
      intervalMs: 20,
    }).catch((error: unknown) => error);
    const message = (failure as Error).message;
    expect(message).toMatch(/did not answer GET http:\/\/127\.0\.0\.1:\d+\/ within 200 ms/);
    expect(message).toMatch(/last seen: fetch failed: ECONNREFUSED/);
    expect(message).toContain("⎔ Starting local server...");
  });
});

describe("outputTail", () => {
  it("keeps the last lines however the chunks fall, without colours", () => {
    const tail = outputTail(2);
    tail.push("one\ntw");
    tail.push("o\n\u001b[33mthree\u001b[0m\nfo");
    expect(tail.text()).toBe("two\nthree\nfo");
  });
});

describe("freePort", () => {
  it("hands out ports outside the kernel's ephemeral range, never the same one twice, each free", async () => {
    const [low = 0, high = 0] = readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8")
      .trim()
      .split(/\s+/)
      .map(Number);
    const ports: number[] = [];
    for (let i = 0; i < 40; i++) ports.push(await freePort());
    expect(new Set(ports).size).toBe(ports.length);
    for (const port of ports) expect(port < low || port > high).toBe(true);
    // Each can be bound at once, as the server it is for will.
    const server = createServer();
    await new Promise<void>((done) => server.listen(ports[0], "127.0.0.1", done));
    expect((server.address() as AddressInfo).port).toBe(ports[0]);
    await new Promise<void>((done) => server.close(() => done()));
  });

  it("never gives out a port a listener holds", async () => {
    const holders = [];
    for (let i = 0; i < 5; i++) {
      const port = await freePort();
      const server = createServer();
      await new Promise<void>((done) => server.listen(port, "127.0.0.1", done));
      holders.push(server);
    }
    const held = holders.map((server) => (server.address() as AddressInfo).port);
    for (let i = 0; i < 40; i++) expect(held).not.toContain(await freePort());
    for (const server of holders) await new Promise<void>((done) => server.close(() => done()));
  });
});
