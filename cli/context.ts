/**
 * What every lessorctl command gets: the client built from the global options, whether to print
 * JSON, and where to write. A new command group (keys, erase, rotate) is one file in commands/
 * with a `register(program, ctx)` and one line in program.ts.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Command } from "commander";
import { LessorClient } from "./client.ts";
import type { Output } from "./output.ts";

/** What the process provides; tests provide their own. */
export interface CliEnvironment {
  out: Output;
  fetch: typeof fetch;
  env: Readonly<Record<string, string | undefined>>;
  /** Where `.lessor/secrets.json` of a local `npm start` is looked for. */
  cwd: string;
  sleep: (ms: number) => Promise<void>;
}

/** The global options, as commander parses them. */
export interface GlobalOptions {
  url?: string;
  adminKey?: string;
  json?: boolean;
  region?: string;
}

export interface CommandContext {
  out: Output;
  /** The folder lessorctl runs in (where `npm start` keeps `.lessor/`). */
  cwd: string;
  /** The process' exit code once the command returns (an error answer sets it too). */
  exit: { code: number };
  sleep: (ms: number) => Promise<void>;
  /** The client for this invocation (global options merged over the environment). */
  client(command: Command): LessorClient;
  /** Whether `--json` was given. */
  json(command: Command): boolean;
  /** Prints `data` as JSON, or runs `lines` to print key=value lines. */
  print(command: Command, data: unknown, lines: () => void): void;
}

const defaultUrl = "http://127.0.0.1:8787";

/**
 * The admin key `npm start` generated, when lessorctl talks to a loopback Lessor started from this
 * checkout: saves pasting it for local work. Never used for any other address.
 */
function localAdminKey(url: string, cwd: string): string | undefined {
  const host = new URL(url).hostname;
  if (host !== "127.0.0.1" && host !== "localhost" && host !== "[::1]") return undefined;
  try {
    const secrets = JSON.parse(readFileSync(join(cwd, ".lessor", "secrets.json"), "utf8")) as unknown;
    const key = (secrets as { adminKey?: unknown }).adminKey;
    return typeof key === "string" ? key : undefined;
  } catch {
    return undefined;
  }
}

export function commandContext(environment: CliEnvironment): CommandContext {
  const globals = (command: Command) => command.optsWithGlobals<GlobalOptions>();
  return {
    out: environment.out,
    cwd: environment.cwd,
    exit: { code: 0 },
    sleep: environment.sleep,
    client(command) {
      const options = globals(command);
      const url = options.url ?? environment.env.LESSOR_URL ?? defaultUrl;
      const adminKey =
        options.adminKey ??
        (environment.env.LESSOR_ADMIN_KEY || undefined) ??
        localAdminKey(url, environment.cwd);
      const region = options.region ?? (environment.env.LESSOR_REGION || undefined) ?? null;
      return new LessorClient({ url, adminKey, fetch: environment.fetch, region });
    },
    json: (command) => globals(command).json === true,
    print(command, data, lines) {
      if (globals(command).json === true) environment.out.line(JSON.stringify(data, null, 2));
      else lines();
    },
  };
}
