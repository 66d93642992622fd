/**
 * `npm start`: Lessor on this machine, on a real Postgres.
 *
 * Starts (and on first run creates) the embedded Postgres under `.lessor/pg`, the loopback
 * WebSocket proxy, the control-plane migrations and `wrangler dev` with scheduled handlers
 * testable at /__scheduled. Local secrets are generated on the first start and kept in
 * `.lessor/secrets.json` (git-ignored); `LESSOR_ADMIN_KEY` from the environment wins.
 */
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { root, startLocalStack, wranglerDevArgs, writeEnvFile } from "./stack.ts";

interface LocalSecrets {
  adminKey: string;
  sealKey: string;
  pgPassword: string;
}

const stateDir = resolve(root, ".lessor");
mkdirSync(stateDir, { recursive: true });
const secretsFile = resolve(stateDir, "secrets.json");

function loadSecrets(): LocalSecrets {
  if (existsSync(secretsFile)) return JSON.parse(readFileSync(secretsFile, "utf8")) as LocalSecrets;
  const secrets: LocalSecrets = {
    adminKey: `lak_${randomBytes(32).toString("base64url")}`,
    sealKey: randomBytes(32).toString("base64"),
    pgPassword: randomBytes(24).toString("base64url"),
  };
  writeFileSync(secretsFile, JSON.stringify(secrets, null, 2), { mode: 0o600 });
  return secrets;
}

const secrets = loadSecrets();
const adminKey = process.env.LESSOR_ADMIN_KEY || secrets.adminKey;
const port = Number(process.env.PORT || 8787);
const pgPort = Number(process.env.LESSOR_PG_PORT || 54329);
const quiet = (line: string) => {
  if (/FATAL|PANIC|ERROR/.test(line)) console.error(`[postgres] ${line}`);
};

const stack = await startLocalStack({
  dataDir: resolve(stateDir, "pg"),
  pgPort,
  pgPassword: secrets.pgPassword,
  persistent: true,
  log: quiet,
});

// wrangler reads secrets from an env file; it is git-ignored and rewritten on every start.
const envFile = resolve(stateDir, "dev.vars");
const vars: Record<string, string> = {
  LESSOR_ADMIN_KEY: adminKey,
  LESSOR_SEAL_KEY: secrets.sealKey,
  LESSOR_CONTROL_PLANE_URL: stack.controlPlaneUrl,
  LESSOR_HOSTS: stack.hostsJson,
  LESSOR_WS_PROXY: stack.wsProxy,
};
writeEnvFile(envFile, vars);

const wrangler = spawn(
  process.execPath,
  wranglerDevArgs({
    port,
    envFile,
    persistTo: resolve(stateDir, "wrangler"),
    testScheduled: true,
    extra: process.argv.slice(2),
  }),
  { cwd: root, stdio: ["ignore", "pipe", "inherit"] },
);

let announced = false;
wrangler.stdout.on("data", (chunk: Buffer) => {
  process.stdout.write(chunk);
  if (!announced && /Ready on/i.test(chunk.toString())) {
    announced = true;
    console.log(
      [
        "",
        `Lessor is running at http://127.0.0.1:${port}`,
        `Admin key: ${adminKey}`,
        `Postgres: 127.0.0.1:${pgPort} (data in .lessor/pg)`,
        `Try: curl -s -X POST http://127.0.0.1:${port}/v1/tenants -H "Authorization: Bearer ${adminKey}" -d '{"id":"acme"}'`,
        `Cron: curl "http://127.0.0.1:${port}/__scheduled?cron=*+*+*+*+*"`,
        "",
      ].join("\n"),
    );
  }
});

let stopping = false;
async function shutdown(code: number): Promise<void> {
  if (stopping) return;
  stopping = true;
  wrangler.kill("SIGTERM");
  await stack.stop().catch(() => undefined);
  process.exit(code);
}
wrangler.on("exit", (code) => void shutdown(code ?? 0));
process.on("SIGINT", () => void shutdown(0));
process.on("SIGTERM", () => void shutdown(0));
