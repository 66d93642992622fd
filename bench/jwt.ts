/**
 * `npm run bench:jwt`: what the end-user JWT path costs next to the plain warm path, through the
 * official `neon()` client, on one warm tenant.
 *
 * Starts its own stack (a throwaway Postgres under .lessor/bench-jwt-pg and the WebSocket proxy) and
 * `wrangler dev` on the bench Worker (Lessor unchanged plus the `/bench/*` routes, bench/README.md)
 * bundled once, with Lessor's `[vars]`, provisions one tenant with JWT mode (a static ES256
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
import { randomBytes } from "node:crypto";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { neon, neonConfig } from "@neondatabase/serverless";
import { exportJWK, generateKeyPair, SignJWT } from "jose";
import {
  freePort,
  freshWorkerSecrets,
  localWorkerVars,
  root,
  startLocalStack,
  writeEnvFile,
} from "../local/stack.ts";
import { admin, type BenchRunning, machineFacts, stopOnExit, wranglerVars } from "./harness.ts";
import { type CountedCell, countedCell, type LoadResult, runRequests } from "./load.ts";
import { buildWorker, type RunningWrangler, startWrangler } from "./processes.ts";

const requestsPerCell = Number(process.env.REQUESTS ?? 400);
const rounds = 4;
const concurrencies = [1, 8];
const stateDir = resolve(root, ".lessor");
const pgDir = resolve(stateDir, "bench-jwt-pg");
const persistDir = resolve(stateDir, "bench-jwt-wrangler");
const envFile = resolve(stateDir, "bench-jwt.vars");
const secrets = freshWorkerSecrets();
const adminKey = secrets.adminKey;
const running: BenchRunning & { wrangler: RunningWrangler | null } = { stack: null, wrangler: null };
const cleanup = stopOnExit("bench:jwt", envFile, running);

interface Cell extends CountedCell {
  path: string;
  concurrency: number;
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
    writeEnvFile(envFile, {
      // The bench Worker has no [vars] of its own: Lessor's, as a deploy would have them.
      ...wranglerVars(),
      ...localWorkerVars(stack, secrets),
    });
    console.log("bundling the bench Worker and starting wrangler dev …");
    // A bundle built once: nothing for wrangler dev to watch, so edits in the working tree never
    // reload the Worker mid-run (bench/processes.ts).
    const script = await buildWorker(resolve(stateDir, "bench-jwt-build"));
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    running.wrangler = await startWrangler({
      script,
      port,
      inspectorPort: await freePort(),
      envFile,
      persistTo: persistDir,
    });
    const api = async (path: string, method: string, json?: unknown) =>
      (await admin(base, adminKey, path, json, method)) as Record<string, unknown>;

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
      const runs = new Map<string, LoadResult[]>();
      for (let round = 0; round < rounds; round++) {
        for (const [path, request] of Object.entries(paths)) {
          const run = await runRequests(Math.ceil(requestsPerCell / rounds), concurrency, request);
          runs.set(path, [...(runs.get(path) ?? []), run]);
        }
      }
      for (const [path, ofPath] of runs) cells.push({ path, concurrency, ...countedCell(ofPath) });
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
          machine: machineFacts(),
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
    console.error(running.wrangler?.output.slice(-40).join("\n") ?? "");
    process.exitCode = 1;
  } finally {
    await cleanup();
  }
}

await main();
