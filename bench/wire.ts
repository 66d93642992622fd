/**
 * `npm run bench:wire`: the Postgres wire protocol through Lessor (`/v2`), side by side with `/sql`
 * and with the floor, on one warm tenant, at concurrency 1, 8 and 64, for `SELECT 1` and an indexed
 * read (issue 29):
 *
 * - `/sql`: the official `neon()` client (HTTP, over `lightFetch`), as `npm run bench` measures it;
 * - `wire tx`: the Neon driver's `Pool` over `/v2` in transaction mode (a connection of the tenant's
 *   pool leased per statement), one WebSocket per driver client, `max` = the concurrency;
 * - `wire session`: the same `Pool` in session mode (`lessor.pool_mode=session`): each driver client
 *   holds one of the tenant's connections, so at most the pool size of them. Its clients hold those
 *   connections while they live, so its `Pool` is opened (and warmed, unmeasured) for each of its
 *   runs and ended after it: otherwise the other paths would wait for connections it keeps;
 * - `floor`: the same `Pool` straight to Postgres through the local WebSocket-to-TCP proxy (what the
 *   driver costs with no Lessor at all), as a superuser on a database of its own with the same table.
 *
 * Then it measures what one relayed frame costs the Worker's workerd (docs/adr/017-wire-protocol.md,
 * "Bounds"): one raw connection, sent straight to that workerd, sends `RELAY_FRAMES` lone Syncs, each
 * in a frame of its own, which the tenant's object answers without a lease (a ReadyForQuery each),
 * and the workerd's CPU over them is divided by the frames the edge relayed (both ways). That is an
 * upper bound of the edge's share: it includes the object's dispatch and the runtime's own.
 *
 * It starts its own stack (a throwaway Postgres under .lessor/bench-wire-pg and the WebSocket proxy)
 * and `wrangler dev` on the bench Worker bundled once (bench/processes.ts), provisions the tenant
 * through Lessor's API, warms every path, then measures in rounds, interleaving the paths so drift
 * on the machine hits all alike. Every answer is checked before it counts. Writes
 * bench/results/wire-<date>.json and a markdown table with the ratios to `/sql` and to the floor.
 *
 *     npm run bench:wire                 # 400 requests per cell, 4 rounds
 *     QUICK=1 npm run bench:wire         # a smoke run: 40 requests per cell, concurrency 1 and 8
 *     RELAY_FRAMES=50000 npm run bench:wire  # lone Syncs for the CPU per frame (default 20000)
 */
import { randomBytes } from "node:crypto";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { Client, neon, neonConfig, Pool } from "@neondatabase/serverless";
import pg from "pg";
import WebSocket from "ws";
import {
  freePort,
  freshWorkerSecrets,
  localWorkerVars,
  root,
  startLocalStack,
  writeEnvFile,
} from "../local/stack.ts";
import { concatBytes, frontend, startupMessage, textMessage } from "../src/core/pg-wire.ts";
import { admin, type BenchRunning, machineFacts, stopOnExit, wranglerVars } from "./harness.ts";
import { type CountedCell, countedCell, type LoadResult, lightFetch, runRequests } from "./load.ts";
import {
  buildWorker,
  cpuDelta,
  findWranglerLayout,
  type RunningWrangler,
  sampleCpu,
  startWrangler,
} from "./processes.ts";

const quick = process.env.QUICK === "1";
const requestsPerCell = Number(process.env.REQUESTS ?? (quick ? 40 : 400));
const rounds = quick ? 1 : 4;
const concurrencies = quick ? [1, 8] : [1, 8, 64];
const tableRows = 10_000;
const relayFrames = Number(process.env.RELAY_FRAMES ?? (quick ? 4000 : 20_000));
const stateDir = resolve(root, ".lessor");
const pgDir = resolve(stateDir, "bench-wire-pg");
const persistDir = resolve(stateDir, "bench-wire-wrangler");
const envFile = resolve(stateDir, "bench-wire.vars");
const secrets = freshWorkerSecrets();
const adminKey = secrets.adminKey;
const pools: Pool[] = [];
const running: BenchRunning & { wrangler: RunningWrangler | null } = { stack: null, wrangler: null };
const cleanup = stopOnExit("bench:wire", envFile, running, {
  before: async () => {
    for (const pool of pools.splice(0)) await pool.end().catch(() => undefined);
  },
});

type QueryName = "SELECT 1" | "indexed read";
type PathName = "/sql" | "wire tx" | "wire session" | "floor";

interface Cell extends CountedCell {
  path: PathName;
  query: QueryName;
  concurrency: number;
}

/** The driver's per-client settings (its documented `client.neonConfig`), given to a Pool's clients. */
function poolWith(config: ConstructorParameters<typeof Pool>[0], settings: Record<string, unknown>): Pool {
  const pool = new Pool(config);
  pool.Client = class extends Client {
    constructor(...args: ConstructorParameters<typeof Client>) {
      super(...args);
      Object.assign(this.neonConfig, settings);
    }
  };
  pool.on("error", () => undefined);
  return pool;
}

/** What relaying one frame costs the Worker's workerd, measured over lone Syncs on one connection. */
interface RelayCost {
  frames: number;
  cpuSeconds: number;
  wallSeconds: number;
  microsecondsPerFrame: number;
  framesPerSecond: number;
}

/**
 * Sends `count` lone Syncs, each in its own WebSocket frame, in windows of 100, on one authenticated
 * connection to `/v2` straight at the Worker's workerd; counts the frames that came back and the
 * workerd's CPU meanwhile.
 */
async function measureRelay(
  directPort: number,
  workerdPid: number,
  user: string,
  key: string,
  count: number,
): Promise<RelayCost> {
  const socket = new WebSocket(`ws://127.0.0.1:${directPort}/v2`);
  socket.binaryType = "arraybuffer";
  await new Promise<void>((resolve, reject) => {
    socket.once("open", () => resolve());
    socket.once("error", reject);
  });
  let received = 0;
  let ready = 0;
  let wake: (() => void) | null = null;
  socket.on("message", (data: ArrayBuffer) => {
    received++;
    const bytes = new Uint8Array(data);
    // Count ReadyForQuery messages ('Z', length 5) in the frame.
    for (let at = 0; at + 5 <= bytes.byteLength; ) {
      const length =
        ((bytes[at + 1] ?? 0) << 24) |
        ((bytes[at + 2] ?? 0) << 16) |
        ((bytes[at + 3] ?? 0) << 8) |
        (bytes[at + 4] ?? 0);
      if (bytes[at] === 0x5a) ready++;
      at += 1 + length;
    }
    wake?.();
  });
  const until = async (readyCount: number) => {
    while (ready < readyCount) {
      await new Promise<void>((resolve, reject) => {
        wake = resolve;
        setTimeout(() => reject(new Error(`only ${ready} of ${readyCount} ReadyForQuery`)), 30_000).unref();
      });
    }
  };
  socket.send(concatBytes([startupMessage({ user, database: user }), textMessage(frontend.password, key)]));
  await until(1);
  const sync = new Uint8Array([frontend.sync, 0, 0, 0, 4]);
  const receivedBefore = received;
  const cpuBefore = sampleCpu({
    wranglerNode: [],
    workerdProxy: [],
    workerdWorker: [workerdPid],
    wsProxy: [],
    postgres: [],
  });
  const started = performance.now();
  for (let sent = 0; sent < count; ) {
    const batch = Math.min(100, count - sent);
    for (let i = 0; i < batch; i++) socket.send(sync);
    sent += batch;
    await until(1 + sent);
  }
  const wallSeconds = (performance.now() - started) / 1000;
  const cpu = cpuDelta(
    cpuBefore,
    sampleCpu({ wranglerNode: [], workerdProxy: [], workerdWorker: [workerdPid], wsProxy: [], postgres: [] }),
  );
  const frames = count + (received - receivedBefore);
  socket.close();
  return {
    frames,
    cpuSeconds: cpu.workerdWorker,
    wallSeconds,
    microsecondsPerFrame: (cpu.workerdWorker * 1e6) / frames,
    framesPerSecond: frames / wallSeconds,
  };
}

/** The two queries, checked: the answer of `SELECT 1`, the row of the indexed read. */
function queriesFor(run: (text: string, params: unknown[]) => Promise<Record<string, unknown>[]>) {
  return {
    "SELECT 1": async () => {
      const rows = await run("SELECT 1 AS one", []);
      if (rows[0]?.one !== 1) throw new Error("SELECT 1: wrong answer");
    },
    "indexed read": async (n: number) => {
      const id = (n % tableRows) + 1;
      const rows = await run("SELECT id, body FROM items WHERE id = $1", [id]);
      if (rows[0]?.id !== id) throw new Error("indexed read: wrong row");
    },
  } satisfies Record<QueryName, (n: number) => Promise<void>>;
}

async function main(): Promise<void> {
  mkdirSync(stateDir, { recursive: true });
  rmSync(persistDir, { recursive: true, force: true });
  const stack = await startLocalStack({
    dataDir: pgDir,
    pgPort: await freePort(),
    pgPassword: randomBytes(18).toString("base64url"),
    persistent: false,
  });
  running.stack = stack;
  try {
    // The floor's own database, as the superuser: the same table, reached with no Lessor.
    const superuser = new pg.Client(stack.pg.url("postgres"));
    await superuser.connect();
    await superuser.query("CREATE DATABASE bench_floor");
    await superuser.end();
    const floorUrl = stack.pg.url("bench_floor");
    const floorSetup = new pg.Client(floorUrl);
    await floorSetup.connect();
    await floorSetup.query("CREATE TABLE items (id int PRIMARY KEY, body text NOT NULL)");
    await floorSetup.query(
      `INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, ${tableRows}) i`,
    );
    await floorSetup.query("ANALYZE items");
    await floorSetup.end();

    writeEnvFile(envFile, {
      ...wranglerVars(),
      ...localWorkerVars(stack, secrets, { BENCH_DATABASE_URL: floorUrl }),
    });
    console.log("bundling the bench Worker and starting wrangler dev …");
    const script = await buildWorker(resolve(stateDir, "bench-wire-build"));
    const port = await freePort();
    const wrangler = await startWrangler({
      script,
      port,
      inspectorPort: await freePort(),
      envFile,
      persistTo: persistDir,
    });
    running.wrangler = wrangler;
    const base = `http://127.0.0.1:${port}`;

    const { connectionString, tenant } = (await admin(base, adminKey, "/v1/tenants", {
      id: `bench-wire-${randomBytes(3).toString("hex")}`,
    })) as { connectionString: string; tenant: { poolSize?: number } };
    const poolSize = tenant.poolSize ?? 5;

    neonConfig.fetchEndpoint = `${base}/sql`;
    // As `npm run bench` does: node:http rather than Node's fetch, whose client work on loopback
    // would be measured as the server's (bench/load.ts).
    neonConfig.fetchFunction = lightFetch;
    const http = neon(connectionString, { fullResults: true, disableWarningInBrowsers: true });
    await http.transaction([
      http`CREATE TABLE items (id int PRIMARY KEY, body text NOT NULL)`,
      http`INSERT INTO items SELECT i, 'item ' || i FROM generate_series(1, 10000) i`,
      http`ANALYZE items`,
    ]);

    const toLessor = { wsProxy: () => `127.0.0.1:${port}/v2`, useSecureWebSocket: false };
    const toPostgres = {
      wsProxy: (host: string, p: number | string) => `${stack.wsProxy}/v2?address=${host}:${p}`,
      useSecureWebSocket: false,
      pipelineConnect: false,
    };
    const session = new URL(connectionString.replace(/^postgres:/, "http:"));
    session.searchParams.set("options", "-c lessor.pool_mode=session");
    const sessionString = session.toString().replace(/^http:/, "postgres:");

    const cells: Cell[] = [];
    for (const concurrency of concurrencies) {
      const wireTx = poolWith({ connectionString, max: concurrency }, toLessor);
      const floor = poolWith({ connectionString: floorUrl, max: Math.min(concurrency, 32) }, toPostgres);
      pools.push(wireTx, floor);
      let wireSession: Pool | null = null;
      const paths: Record<PathName, ReturnType<typeof queriesFor>> = {
        "/sql": queriesFor(async (text, params) => (await http.query(text, params)).rows),
        "wire tx": queriesFor(async (text, params) => (await wireTx.query(text, params)).rows),
        "wire session": queriesFor(async (text, params) => {
          if (!wireSession) throw new Error("no session pool");
          return (await wireSession.query(text, params)).rows;
        }),
        floor: queriesFor(async (text, params) => (await floor.query(text, params)).rows),
      };
      /** Opens the session-mode pool and warms its clients (unmeasured); `end` gives their connections back. */
      const openSession = async () => {
        wireSession = poolWith(
          { connectionString: sessionString, max: Math.min(concurrency, poolSize) },
          toLessor,
        );
        await runRequests(concurrency * 2, concurrency, paths["wire session"]["SELECT 1"]);
      };
      const endSession = async () => {
        await wireSession?.end();
        wireSession = null;
      };
      // Warm every path: the tenant's pool, the drivers' connections, the plans.
      for (const [path, queries] of Object.entries(paths)) {
        if (path === "wire session") await openSession();
        await runRequests(concurrency * 4, concurrency, queries["SELECT 1"]);
        await runRequests(concurrency * 4, concurrency, queries["indexed read"]);
        if (path === "wire session") await endSession();
      }
      const runs = new Map<string, { path: PathName; query: QueryName; runs: LoadResult[] }>();
      for (let round = 0; round < rounds; round++) {
        for (const query of ["SELECT 1", "indexed read"] as const) {
          for (const [path, queries] of Object.entries(paths) as [
            PathName,
            ReturnType<typeof queriesFor>,
          ][]) {
            if (path === "wire session") await openSession();
            const run = await runRequests(Math.ceil(requestsPerCell / rounds), concurrency, queries[query]);
            if (path === "wire session") await endSession();
            const key = `${path}|${query}`;
            const cell = runs.get(key) ?? { path, query, runs: [] };
            cell.runs.push(run);
            runs.set(key, cell);
          }
        }
      }
      for (const cell of runs.values()) {
        cells.push({ path: cell.path, query: cell.query, concurrency, ...countedCell(cell.runs) });
      }
      for (const pool of [wireTx, floor]) await pool.end();
      pools.length = 0;
    }

    if (wrangler.child.pid === undefined) throw new Error("wrangler has no pid");
    const layout = await findWranglerLayout(wrangler.child.pid, port);
    const workerdPid = layout.groups.workerdWorker[0];
    if (workerdPid === undefined) throw new Error("no workerd for the Worker");
    const user = new URL(connectionString.replace(/^postgres:/, "http:"));
    await measureRelay(layout.directPort, workerdPid, user.username, decodeURIComponent(user.password), 1000);
    const relay = await measureRelay(
      layout.directPort,
      workerdPid,
      user.username,
      decodeURIComponent(user.password),
      relayFrames,
    );

    const find = (path: PathName, query: QueryName, c: number) =>
      cells.find((cell) => cell.path === path && cell.query === query && cell.concurrency === c);
    console.log("\n| query, concurrency | path | req/s | p50 / p99 ms | ÷ /sql | ÷ floor |");
    console.log("| --- | --- | --- | --- | --- | --- |");
    for (const cell of cells) {
      const sql = find("/sql", cell.query, cell.concurrency)?.requestsPerSecond ?? Number.NaN;
      const floor = find("floor", cell.query, cell.concurrency)?.requestsPerSecond ?? Number.NaN;
      console.log(
        `| ${cell.query}, ${cell.concurrency} | ${cell.path} | ${cell.requestsPerSecond.toFixed(0)} | ${cell.p50Ms.toFixed(1)} / ${cell.p99Ms.toFixed(1)} | ${(cell.requestsPerSecond / sql).toFixed(2)} | ${(cell.requestsPerSecond / floor).toFixed(2)} |`,
      );
    }
    console.log(
      `\nrelay: ${relay.frames} frames, workerd CPU ${(relay.cpuSeconds * 1000).toFixed(0)} ms over ${relay.wallSeconds.toFixed(2)} s: ${relay.microsecondsPerFrame.toFixed(1)} µs per frame (edge, object and runtime together), ${relay.framesPerSecond.toFixed(0)} frames/s on one connection`,
    );
    const date = new Date().toISOString().slice(0, 10);
    const out = resolve(root, "bench/results", `wire-${quick ? "quick-" : ""}${date}.json`);
    mkdirSync(resolve(root, "bench/results"), { recursive: true });
    writeFileSync(
      out,
      `${JSON.stringify(
        {
          date,
          quick,
          machine: machineFacts(),
          requestsPerCell,
          rounds,
          poolSize,
          cells,
          relay,
        },
        null,
        2,
      )}\n`,
    );
    console.log(`\nwrote ${out}`);
  } catch (error) {
    console.error(error);
    console.error(running.wrangler?.output.slice(-40).join("\n") ?? "");
    process.exitCode = 1;
  } finally {
    await cleanup();
  }
}

await main();
