/**
 * The examples as a newcomer meets them: the README quotes the quickstart and docs/examples.md the
 * others, verbatim; each runs itself when
 * executed with `node`, the stack test runs every one, and the drizzle example's `notes` table is
 * the example tenant schema's. (What they do against Lessor: test/integration/examples.test.ts.)
 *
 * And each runs on the Node the README names: every example but `lease.mjs`, and the README's wire
 * snippet, on the system Node (the one npm runs on: Node 20 on these machines), `lease.mjs` on the
 * checkout's Node 22 (`npx node`), as the README says. What each must do there is reach Lessor:
 * its request, or its WebSocket's upgrade, arrives at a loopback listener that records what arrives
 * and answers nothing useful (it is not a Lessor).
 */
import { execFile, execFileSync } from "node:child_process";
import {
  existsSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { delimiter, join, resolve } from "node:path";
import { promisify } from "node:util";
import { getTableColumns } from "drizzle-orm";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { notes as exampleNotes } from "../../examples/drizzle.mjs";
import { notes } from "../fixtures/tenant-schema/schema.ts";

const root = resolve(import.meta.dirname, "../..");
const examples = readdirSync(resolve(root, "examples"))
  .filter((file) => file.endsWith(".mjs"))
  .sort();
const readme = readFileSync(resolve(root, "README.md"), "utf8");
const examplesPage = readFileSync(resolve(root, "docs/examples.md"), "utf8");

describe("examples/", () => {
  it("has the seven the README promises", () => {
    expect(examples).toEqual([
      "drizzle.mjs",
      "lease.mjs",
      "quickstart.mjs",
      "rls.mjs",
      "transaction.mjs",
      "wire-drizzle.mjs",
      "wire-pool.mjs",
    ]);
  });

  it.each(examples)(
    "%s is quoted verbatim: the quickstart in the README, the others in docs/examples.md",
    (file) => {
      const source = readFileSync(resolve(root, "examples", file), "utf8");
      expect(file === "quickstart.mjs" ? readme : examplesPage).toContain(`\`\`\`js\n${source}\`\`\``);
    },
  );

  it("lease.mjs says to run it with npx node: plain node 20 cannot import lessor/client's TypeScript", () => {
    const source = readFileSync(resolve(root, "examples/lease.mjs"), "utf8");
    expect(source).toContain("node examples/lease.mjs");
    expect(source.match(/(?<!npx )node examples\/lease\.mjs/g)).toBeNull();
  });

  it.each(examples)("%s is run against the stack by test/integration/examples.test.ts", (file) => {
    const stackTest = readFileSync(resolve(root, "test/integration/examples.test.ts"), "utf8");
    expect(stackTest).toContain(`from "../../examples/${file}"`);
  });

  it.each(examples)(
    "%s runs itself when executed with node (and says what it needs)",
    async (file) => {
      const env = { ...process.env };
      delete env.LESSOR_CONNECTION_STRING;
      const run = await promisify(execFile)(process.execPath, [resolve(root, "examples", file)], {
        env,
      }).then(
        () => ({ stderr: "" }),
        (error: { stderr: string }) => error,
      );
      expect(run.stderr).toContain(
        "Set LESSOR_CONNECTION_STRING: `npx lessorctl tenants create <id>` prints it.",
      );
    },
    30_000,
  ); // a Node start-up, slow on a loaded machine

  it("drizzle.mjs declares the example tenant schema's notes columns as that schema does", () => {
    const declared = getTableColumns(exampleNotes);
    expect(Object.keys(declared).length).toBeGreaterThan(0);
    for (const [key, column] of Object.entries(declared)) {
      const original = getTableColumns(notes)[key as keyof typeof notes.$inferSelect];
      expect(original, key).toBeDefined();
      expect(
        {
          name: column.name,
          type: column.columnType,
          notNull: column.notNull,
          hasDefault: column.hasDefault,
        },
        key,
      ).toEqual({
        name: original?.name,
        type: original?.columnType,
        notNull: original?.notNull,
        hasDefault: original?.hasDefault,
      });
    }
  });
});

/**
 * The system Node: the one npm itself runs on (`npm_node_execpath`), else the first `node` on PATH
 * outside node_modules (where the `node` devDependency puts the checkout's Node 22).
 */
function systemNode(): string {
  const npmNode = process.env.npm_node_execpath;
  if (npmNode && existsSync(npmNode)) return npmNode;
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir.includes("node_modules")) continue;
    if (existsSync(join(dir, "node"))) return join(dir, "node");
  }
  throw new Error("no system node on PATH");
}

/** What arrived at the listener: `POST /sql`, or `WebSocket /v2` for a WebSocket's upgrade. */
let arrivals: string[] = [];
let listener: Server;
let address = "";

beforeAll(async () => {
  listener = createServer((request, response) => {
    arrivals.push(`${request.method} ${request.url}`);
    request.resume();
    response.writeHead(503, { "Content-Type": "application/json" });
    response.end('{"code":"recording_listener","message":"Not a Lessor."}');
  });
  listener.on("upgrade", (request, socket) => {
    if (request.headers["sec-websocket-key"]) arrivals.push(`WebSocket ${request.url}`);
    socket.end("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n");
  });
  await new Promise<void>((done) => listener.listen(0, "127.0.0.1", done));
  address = `127.0.0.1:${(listener.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise((done) => listener.close(done));
});

/** Runs `file` with `node`, its connection string pointing at the listener; resolves with what arrived. */
async function arrivalsOf(node: string, file: string): Promise<{ arrived: string[]; stderr: string }> {
  arrivals = [];
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    LESSOR_CONNECTION_STRING: `postgres://acme:lsk_example@${address}/acme`,
    LESSOR_ALICE_TOKEN: "alice.token.example",
    LESSOR_BOB_TOKEN: "bob.token.example",
  };
  // Found from the connection string, as on a laptop.
  delete env.LESSOR_URL;
  const stderr = await promisify(execFile)(node, [file], { cwd: root, timeout: 30_000, env }).then(
    (done) => done.stderr,
    (error: { stderr: string }) => error.stderr,
  );
  return { arrived: [...new Set(arrivals)], stderr };
}

/** What each example sends first: a `/sql` request, a WebSocket to `/v2`, or a session lease. */
const firstArrival: Record<string, string> = {
  "quickstart.mjs": "POST /sql",
  "drizzle.mjs": "POST /sql",
  "transaction.mjs": "POST /sql",
  "rls.mjs": "POST /sql",
  "wire-pool.mjs": "WebSocket /v2",
  "wire-drizzle.mjs": "WebSocket /v2",
  "lease.mjs": "POST /v1/tenants/acme/leases",
};

describe("examples/ on the Node the README names", () => {
  const node = systemNode();
  const version = execFileSync(node, ["--version"], { encoding: "utf8" }).trim();

  it("covers every example", () => {
    expect(Object.keys(firstArrival).sort()).toEqual(examples);
  });

  it.each(examples.filter((file) => file !== "lease.mjs"))(
    `%s reaches Lessor on the system Node (${version}), as \`node examples/<file>\``,
    async (file) => {
      const { arrived, stderr } = await arrivalsOf(node, resolve(root, "examples", file));
      expect(arrived, stderr).toContain(firstArrival[file]);
    },
    40_000,
  );

  it("lease.mjs reaches Lessor on the checkout's Node 22, as `npx node examples/lease.mjs`", async () => {
    const { arrived, stderr } = await arrivalsOf(process.execPath, resolve(root, "examples/lease.mjs"));
    expect(arrived, stderr).toContain(firstArrival["lease.mjs"]);
  }, 40_000);

  it("the README says how each one runs: node examples/<file> on any Node from 20, lease.mjs with npx node", () => {
    const section = readme.slice(readme.indexOf("## Examples"), readme.indexOf("## Wire protocol"));
    expect(section).toContain("`node examples/<file>`");
    expect(section).toContain("on any Node from 20, but `lease.mjs`");
    expect(section).toContain("`npx node examples/lease.mjs`");
  });

  it(`the README's wire snippet opens its WebSocket on the system Node (${version})`, async () => {
    const section = readme.slice(readme.indexOf("## Wire protocol"));
    const snippet = /```js\n([\s\S]*?)```/.exec(section)?.[1];
    expect(snippet).toContain("new Pool(");
    // The snippet as a file of its own project, against the listener instead of 127.0.0.1:8787.
    const dir = mkdtempSync(join(tmpdir(), "lessor-wire-snippet-"));
    try {
      symlinkSync(join(root, "node_modules"), join(dir, "node_modules"));
      const app = join(dir, "app.mjs");
      writeFileSync(
        app,
        `${(snippet ?? "").replaceAll("127.0.0.1:8787", address)}\nawait pool.query("SELECT 1").finally(() => pool.end());\n`,
      );
      const { arrived, stderr } = await arrivalsOf(node, app);
      expect(arrived, stderr).toContain("WebSocket /v2");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 40_000);
});
