/**
 * `npm run bench:jwt`: what the end-user JWT path costs next to the plain warm path, through the
 * official `neon()` client, on one warm tenant.
 *
 * Starts its own stack (a throwaway Postgres under .lessor/bench-jwt-pg and the WebSocket proxy) and
 * `wrangler dev` on a snapshot of the Worker, provisions one tenant with JWT mode (a static ES256
 * key set), warms both kinds of connection, then measures, interleaved in rounds so drift on the
 * machine hits both alike:
 *
 * - plain: `SELECT 1` with the tenant key;
 * - jwt: `SELECT auth.user_id()` with the same key and an end user's token (verified in the tenant's
 *   object, the statement run on an end-user connection with the signed-claims prelude);
 * - jwt + RLS: a policy-filtered read of one user's rows (`USING (user_id = auth.user_id())`).
 *
 * Each answer is checked (the right user id, the right row count) before it counts. Concurrency 1
 * and 8; the pool size is the default tier's. Writes bench/results/jwt-<date>.json.
 *
 *     npm run bench:jwt                 # 400 requests per cell
 *     REQUESTS=1000 npm run bench:jwt
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { cpSync, mkdirSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { cpus, loadavg, totalmem } from "node:os";
import { resolve } from "node:path";
import { neon, neonConfig } from "@neondatabase/serverless";
import { exportJWK, generateKeyPair, SignJWT } from "jose";
import { freePort, root, startLocalStack, wranglerDevArgs, writeEnvFile } from "../local/stack.ts";

const requestsPerCell = Number(process.env.REQUESTS ?? 400);
const rounds = 4;
const concurrencies = [1, 8];
const stateDir = resolve(root, ".lessor");
const pgDir = resolve(stateDir, "bench-jwt-pg");
const persistDir = resolve(stateDir, "bench-jwt-wrangler");
const snapshotDir = resolve(stateDir, "bench-jwt-src");
const envFile = resolve(stateDir, "bench-jwt.vars");
const adminKey = `lak_${randomBytes(24).toString("base64url")}`;

function sleep(ms: number): Promise<void> {
  return new Promise((done) => setTimeout(done, ms));
}

/** A copy of the Worker's sources, so edits in the working tree never reload it mid-run. */
function snapshotSources(): void {
  rmSync(snapshotDir, { recursive: true, force: true });
  mkdirSync(snapshotDir, { recursive: true });
  cpSync(resolve(root, "src"), resolve(snapshotDir, "src"), { recursive: true });
  for (const file of ["wrangler.toml", "package.json", "tsconfig.json"]) {
    cpSync(resolve(root, file), resolve(snapshotDir, file));
  }
  symlinkSync(resolve(root, "node_modules"), resolve(snapshotDir, "node_modules"), "dir");
}

async function startWrangler(port: number): Promise<{ stop(): Promise<void>; tail(): string }> {
  snapshotSources();
  const child = spawn(
    process.execPath,
    wranglerDevArgs({ port, envFile, persistTo: persistDir, inspectorPort: await freePort() }),
    {
      cwd: snapshotDir,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: {
        ...process.env,
        WRANGLER_SEND_METRICS: "false",
        CI: "1",
        WRANGLER_CI_DISABLE_CONFIG_WATCHING: "true",
        WRANGLER_REGISTRY_PATH: resolve(stateDir, "bench-jwt-registry"),
      },
    },
  );
  const output: string[] = [];
  for (const stream of [child.stdout, child.stderr]) {
    stream?.on("data", (chunk: Buffer) => {
      output.push(chunk.toString());
      if (output.length > 100) output.shift();
    });
  }
  const signal = (name: NodeJS.Signals) => {
    if (child.pid === undefined) return;
    try {
      process.kill(-child.pid, name);
    } catch {
      // Already gone.
    }
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise<void>((done) => child.once("exit", () => done()));
      signal("SIGTERM");
      await Promise.race([exited, sleep(15_000)]);
    }
    signal("SIGKILL");
  };
  for (let attempt = 0; attempt < 480; attempt++) {
    if (child.exitCode !== null) break;
    try {
      const response = await fetch(`http://127.0.0.1:${port}/`, { signal: AbortSignal.timeout(2_000) });
      if (response.ok) return { stop, tail: () => output.join("").slice(-4_000) };
    } catch {
      // Not listening yet.
    }
    await sleep(250);
  }
  await stop();
  throw new Error(`wrangler dev did not start:\n${output.join("").slice(-3_000)}`);
}

function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? Number.NaN;
}

interface Cell {
  path: string;
  concurrency: number;
  requests: number;
  seconds: number;
  requestsPerSecond: number;
  p50Ms: number;
  p99Ms: number;
}

/** Runs `count` checked requests at `concurrency`; answers wall time and latencies. */
async function measure(
  count: number,
  concurrency: number,
  request: () => Promise<void>,
): Promise<{ seconds: number; latencies: number[] }> {
  const latencies: number[] = [];
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) {
        next++;
        const at = performance.now();
        await request();
        latencies.push(performance.now() - at);
      }
    }),
  );
  return { seconds: (performance.now() - started) / 1000, latencies };
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
  let wrangler: { stop(): Promise<void>; tail(): string } | null = null;
  const shutdown = async () => {
    await wrangler?.stop().catch(() => undefined);
    await stack.stop().catch(() => undefined);
  };
  process.once("SIGINT", () => void shutdown().then(() => process.exit(130)));
  try {
    writeEnvFile(envFile, {
      LESSOR_ADMIN_KEY: adminKey,
      LESSOR_SEAL_KEY: randomBytes(32).toString("base64"),
      LESSOR_KEY_MAC_KEYS: randomBytes(32).toString("base64"),
      LESSOR_CONTROL_PLANE_URL: stack.controlPlaneUrl,
      LESSOR_HOSTS: stack.hostsJson,
      LESSOR_WS_PROXY: stack.wsProxy,
    });
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    console.log("building and starting wrangler dev …");
    wrangler = await startWrangler(port);
    const api = async (path: string, method: string, json?: unknown) => {
      const response = await fetch(`${base}${path}`, {
        method,
        headers: { Authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
        ...(json === undefined ? {} : { body: JSON.stringify(json) }),
      });
      if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${await response.text()}`);
      return response.json() as Promise<Record<string, unknown>>;
    };

    const id = `bench-jwt-${randomBytes(3).toString("hex")}`;
    const created = await api("/v1/tenants", "POST", { id });
    const connectionString = String(created.connectionString);
    const { publicKey, privateKey } = await generateKeyPair("ES256");
    const issuer = "https://idp.bench.test/";
    await api(`/v1/tenants/${id}/jwt`, "PUT", {
      issuer,
      audience: "bench",
      jwks: { keys: [{ ...(await exportJWK(publicKey)), kid: "bench", alg: "ES256" }] },
      algorithms: ["ES256"],
    });
    const token = await new SignJWT({})
      .setProtectedHeader({ alg: "ES256", kid: "bench" })
      .setSubject("bench-user")
      .setIssuer(issuer)
      .setAudience("bench")
      .setExpirationTime("2h")
      .sign(privateKey);

    neonConfig.fetchEndpoint = `${base}/sql`;
    const plain = neon(connectionString, { disableWarningInBrowsers: true });
    const endUser = neon(connectionString, { authToken: token, disableWarningInBrowsers: true });
    await plain.transaction([
      plain`CREATE TABLE items (id serial PRIMARY KEY, user_id text NOT NULL, body text NOT NULL)`,
      plain`INSERT INTO items (user_id, body) SELECT 'user-' || (i % 50), 'item ' || i FROM generate_series(1, 5000) i`,
      plain`INSERT INTO items (user_id, body) SELECT 'bench-user', 'mine ' || i FROM generate_series(1, 10) i`,
      plain`CREATE INDEX ON items (user_id)`,
      plain`ALTER TABLE items ENABLE ROW LEVEL SECURITY`,
      plain`CREATE POLICY own ON items TO authenticated USING (user_id = (SELECT auth.user_id()))`,
      plain`GRANT SELECT ON items TO authenticated`,
      plain`ANALYZE items`,
    ]);

    const paths: Record<string, () => Promise<void>> = {
      plain: async () => {
        const rows = await plain`SELECT 1 AS one`;
        if (rows[0]?.one !== 1) throw new Error("plain: wrong answer");
      },
      jwt: async () => {
        const rows = await endUser`SELECT auth.user_id() AS uid`;
        if (rows[0]?.uid !== "bench-user") throw new Error("jwt: wrong answer");
      },
      "jwt + RLS": async () => {
        const rows = await endUser`SELECT id FROM items`;
        if (rows.length !== 10) throw new Error(`jwt + RLS: ${rows.length} rows, not 10`);
      },
    };
    // Warm both kinds of connection and the token's key set.
    for (const request of Object.values(paths)) for (let i = 0; i < 20; i++) await request();

    const cells: Cell[] = [];
    for (const concurrency of concurrencies) {
      const totals = new Map<string, { seconds: number; latencies: number[] }>();
      for (let round = 0; round < rounds; round++) {
        for (const [path, request] of Object.entries(paths)) {
          const run = await measure(Math.ceil(requestsPerCell / rounds), concurrency, request);
          const total = totals.get(path) ?? { seconds: 0, latencies: [] };
          total.seconds += run.seconds;
          total.latencies.push(...run.latencies);
          totals.set(path, total);
        }
      }
      for (const [path, total] of totals) {
        const sorted = [...total.latencies].sort((a, b) => a - b);
        cells.push({
          path,
          concurrency,
          requests: sorted.length,
          seconds: total.seconds,
          requestsPerSecond: sorted.length / total.seconds,
          p50Ms: percentile(sorted, 50),
          p99Ms: percentile(sorted, 99),
        });
      }
    }

    const plainOf = (c: number) => cells.find((cell) => cell.path === "plain" && cell.concurrency === c);
    console.log("\n| path, concurrency | req/s | p50 / p99 ms | ÷ plain req/s |");
    console.log("| --- | --- | --- | --- |");
    for (const cell of cells) {
      const ratio = cell.requestsPerSecond / (plainOf(cell.concurrency)?.requestsPerSecond ?? Number.NaN);
      console.log(
        `| ${cell.path}, ${cell.concurrency} | ${cell.requestsPerSecond.toFixed(0)} | ${cell.p50Ms.toFixed(1)} / ${cell.p99Ms.toFixed(1)} | ${ratio.toFixed(2)} |`,
      );
    }
    const date = new Date().toISOString().slice(0, 10);
    const out = resolve(root, "bench/results", `jwt-${date}.json`);
    mkdirSync(resolve(root, "bench/results"), { recursive: true });
    writeFileSync(
      out,
      `${JSON.stringify(
        {
          date,
          machine: { cpus: cpus().length, memoryGiB: Math.round(totalmem() / 2 ** 30), loadavg: loadavg() },
          requestsPerCell,
          rounds,
          cells,
        },
        null,
        2,
      )}\n`,
    );
    console.log(`\nwrote ${out}`);
  } catch (error) {
    console.error(error);
    console.error(wrangler?.tail() ?? "");
    process.exitCode = 1;
  } finally {
    await shutdown();
  }
}

await main();
