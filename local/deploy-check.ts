/**
 * `npm run deploy:check [-- --env <name>]`: what a production deploy needs, checked without any
 * network access to Cloudflare. It builds the Worker bundle as `wrangler deploy` would
 * (`--dry-run`), measures it against the platform's limits, and reads the resolved wrangler
 * configuration for what would break or weaken a production deploy. Exits 1 on any error.
 *
 * Limits (developers.cloudflare.com/workers/platform/limits, read 2026-12-01): the documented Worker
 * size has been 3 MB (Free) and 10 MB (Paid) after compression; the newest revision of the page reads
 * 64 MiB. The check holds the bundle to the strictest of those it must meet (10 MB compressed, an
 * error) and warns past 3 MB. Workers and Durable Objects: 128 MB of memory, 6 simultaneous
 * outgoing connections per request, 30 s of CPU per request by default (5 min at most).
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";
import { hostPathOf, hostPathProblem } from "../src/config/host-paths.ts";
import { type HostKind, impliedHostKind } from "../src/core/host-capabilities.ts";

const root = resolve(import.meta.dirname, "..");

/** The parts of a resolved wrangler configuration this check reads. */
export interface DeployConfig {
  name: string;
  compatibility_date?: string;
  vars: Record<string, unknown>;
  limits?: { cpu_ms?: number };
  ratelimits?: { name: string; namespace_id: string }[];
  migrations?: { tag: string }[];
  triggers?: { crons?: string[] };
}

export interface Finding {
  level: "ok" | "warn" | "error";
  check: string;
  detail: string;
}

/** The secrets a deploy needs (src/env.d.ts); never in `[vars]`, where anyone with the repo sees them. */
export const requiredSecrets = [
  "LESSOR_ADMIN_KEY",
  "LESSOR_SEAL_KEY",
  "LESSOR_KEY_MAC_KEYS",
  "LESSOR_CONTROL_PLANE_URL",
  "LESSOR_HOSTS",
] as const;

/** The rate-limit namespace id of the repository's example configuration. */
const exampleNamespaceId = "1001";

/** Worker size limits after compression, in bytes (see the header). */
export const bundleLimits = { warnGzipBytes: 3 * 1024 * 1024, errorGzipBytes: 10 * 1024 * 1024 } as const;

/** Checks a resolved configuration and a bundle size; `today` is YYYY-MM-DD (UTC). */
export function deployFindings(
  config: DeployConfig,
  bundle: { gzipBytes: number },
  today: string,
): Finding[] {
  const findings: Finding[] = [];
  const add = (level: Finding["level"], check: string, detail: string) =>
    findings.push({ level, check, detail });

  const mib = (bytes: number) => `${(bytes / 1024 / 1024).toFixed(2)} MiB`;
  if (bundle.gzipBytes > bundleLimits.errorGzipBytes) {
    add("error", "bundle", `${mib(bundle.gzipBytes)} compressed: over the 10 MB Workers Paid limit`);
  } else if (bundle.gzipBytes > bundleLimits.warnGzipBytes) {
    add("warn", "bundle", `${mib(bundle.gzipBytes)} compressed: over the 3 MB Workers Free limit`);
  } else add("ok", "bundle", `${mib(bundle.gzipBytes)} compressed (limits: 3 MB Free, 10 MB Paid)`);

  const date = config.compatibility_date;
  if (!date) add("error", "compatibility_date", "not set");
  else if (date > today) add("error", "compatibility_date", `${date} is in the future (today is ${today})`);
  else add("ok", "compatibility_date", date);

  const ids = (config.ratelimits ?? []).map((r) => r.namespace_id);
  const duplicate = ids.find((id, i) => ids.indexOf(id) !== i);
  if (duplicate !== undefined) add("error", "ratelimits", `namespace_id ${duplicate} is used twice`);
  for (const limit of config.ratelimits ?? []) {
    if (limit.namespace_id === exampleNamespaceId) {
      add(
        "error",
        "ratelimits",
        `${limit.name}: namespace_id ${exampleNamespaceId} is the example's; choose an id unique in your account`,
      );
    }
  }
  if ((config.ratelimits ?? []).length === 0) add("error", "ratelimits", "AUTH_FAILURES is not bound");

  const cpu = config.limits?.cpu_ms;
  if (cpu === undefined) add("error", "limits", "set [limits] cpu_ms (a bound on a runaway request's CPU)");
  else if (cpu > 300_000) add("error", "limits", `cpu_ms ${cpu} is over the platform's 5 minutes`);
  else add("ok", "limits", `cpu_ms ${cpu}`);

  for (const secret of requiredSecrets) {
    if (secret in config.vars)
      add("error", "secrets", `${secret} is in [vars]: set it with wrangler secret put`);
  }
  add(
    "ok",
    "secrets",
    `set with wrangler secret put: ${requiredSecrets.join(", ")} (LESSOR_METRICS_KEY optional)`,
  );

  const proxy = config.vars.LESSOR_WS_PROXY;
  if (typeof proxy === "string" && proxy !== "") {
    add(
      "error",
      "LESSOR_WS_PROXY",
      "must be empty in production: neon hosts are reached over Neon's own wss://, postgres hosts over TCP with TLS",
    );
  }

  const tags = (config.migrations ?? []).map((m) => m.tag);
  if (new Set(tags).size !== tags.length)
    add("error", "migrations", "a Durable Object migration tag repeats");
  if ((config.triggers?.crons ?? []).length === 0) {
    add("error", "triggers", "no cron trigger: folds, campaigns, reconcile and hygiene never run");
  }
  return findings;
}

/**
 * How each host of `LESSOR_HOSTS` (read from the environment, as the secret is not in the
 * configuration) is reached once deployed (src/config/host-paths.ts, docs/adr/027): its path and
 * TLS, or why it cannot be. Names, kinds and addresses only: never a connection string.
 */
export function hostPathFindings(hostsJson: string | undefined): Finding[] {
  if (hostsJson === undefined || hostsJson === "") {
    return [
      {
        level: "warn",
        check: "hosts",
        detail:
          "LESSOR_HOSTS is not in this shell's environment: set it (as the secret holds it) to have each host's path checked",
      },
    ];
  }
  let hosts: Record<string, unknown>;
  try {
    hosts = JSON.parse(hostsJson) as Record<string, unknown>;
  } catch {
    return [{ level: "error", check: "hosts", detail: "LESSOR_HOSTS is not valid JSON" }];
  }
  const findings: Finding[] = [];
  for (const [name, entry] of Object.entries(hosts)) {
    const declared = (typeof entry === "string" ? { url: entry } : entry) as {
      url?: unknown;
      kind?: HostKind;
      path?: "tcp" | "websocket";
      sslmode?: "verify-full" | "disable";
    };
    let url: URL;
    try {
      url = new URL(String(declared.url).replace(/^postgres(ql)?:/, "http:"));
    } catch {
      findings.push({ level: "error", check: "hosts", detail: `${name}: malformed connection string` });
      continue;
    }
    const kind = declared.kind ?? impliedHostKind(url.hostname);
    const address = `${url.hostname}:${url.port || 5432}`;
    // Deployed, LESSOR_WS_PROXY is empty: the paths that need it do not exist.
    const problem = hostPathProblem(name, kind, url.hostname, declared, null);
    if (problem) {
      findings.push({ level: "error", check: "hosts", detail: problem });
      continue;
    }
    const path = hostPathOf(kind, declared);
    findings.push({
      level: "ok",
      check: "hosts",
      detail:
        path.path === "websocket"
          ? `${name} (${kind}, ${address}): Neon's WebSocket endpoint wss://${url.hostname}/v2, TLS by the WebSocket`
          : `${name} (${kind}, ${address}): TCP (connect() + STARTTLS), ${
              path.sslmode === "verify-full"
                ? `certificate verified for ${url.hostname} against the public roots workerd trusts`
                : "TLS off (loopback only)"
            }, SCRAM-SHA-256 only`,
    });
  }
  return findings;
}

function run(args: string[]): { status: number; output: string } {
  const result = spawnSync(
    process.execPath,
    [resolve(root, "node_modules/wrangler/bin/wrangler.js"), ...args],
    {
      cwd: root,
      encoding: "utf8",
      // Nothing phones home: no telemetry, no update check.
      env: { ...process.env, WRANGLER_SEND_METRICS: "false", WRANGLER_HIDE_BANNER: "true" },
    },
  );
  return { status: result.status ?? 1, output: `${result.stdout}${result.stderr}` };
}

async function main(): Promise<void> {
  const envIndex = process.argv.indexOf("--env");
  const envName = envIndex === -1 ? undefined : process.argv[envIndex + 1];
  const outdir = mkdtempSync(join(tmpdir(), "lessor-deploy-check-"));
  try {
    const built = run(["deploy", "--dry-run", "--outdir", outdir, ...(envName ? ["--env", envName] : [])]);
    if (built.status !== 0) {
      process.stderr.write(built.output);
      process.stderr.write("deploy:check: the dry-run build failed\n");
      process.exitCode = 1;
      return;
    }
    const bundle = readFileSync(join(outdir, "index.js"));
    const { unstable_readConfig } = await import("wrangler");
    const config = unstable_readConfig({
      config: resolve(root, "wrangler.toml"),
      ...(envName ? { env: envName } : {}),
    });
    const today = new Date().toISOString().slice(0, 10);
    const findings = deployFindings(
      config as unknown as DeployConfig,
      { gzipBytes: gzipSync(bundle).byteLength },
      today,
    );
    findings.push(...hostPathFindings(process.env.LESSOR_HOSTS));
    process.stdout.write(`deploy:check ${envName ? `--env ${envName}` : "(top-level configuration)"}\n`);
    process.stdout.write(`bundle ${(bundle.byteLength / 1024).toFixed(0)} KiB raw\n`);
    for (const f of findings)
      process.stdout.write(`${f.level.padEnd(5)} ${f.check.padEnd(19)} ${f.detail}\n`);
    const errors = findings.filter((f) => f.level === "error").length;
    process.stdout.write(
      errors === 0 ? "deploy:check: ready to deploy\n" : `deploy:check: ${errors} error(s)\n`,
    );
    process.exitCode = errors === 0 ? 0 : 1;
  } finally {
    rmSync(outdir, { recursive: true, force: true });
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await main();
