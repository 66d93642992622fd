/**
 * lessorctl's command tree (commander) and the one place errors become output and an exit code.
 * Commands live one group per file in commands/; adding keys, erase or rotate is a new file and a
 * line in `commandGroups`.
 */
import { Command, CommanderError } from "commander";
import { ApiError } from "./client.ts";
import * as campaign from "./commands/campaign.ts";
import * as capacity from "./commands/capacity.ts";
import * as jwt from "./commands/jwt.ts";
import * as reseal from "./commands/reseal.ts";
import * as tenant from "./commands/tenant.ts";
import * as tenants from "./commands/tenants.ts";
import { type CliEnvironment, type CommandContext, commandContext } from "./context.ts";
import { kv } from "./output.ts";

const commandGroups: readonly { register(program: Command, ctx: CommandContext): void }[] = [
  capacity,
  tenant,
  tenants,
  campaign,
  reseal,
  jwt,
];

/** Builds the program; `--help` output is commander's, from the descriptions below. */
export function buildProgram(ctx: CommandContext, environment: CliEnvironment): Command {
  const program = new Command("lessorctl")
    .description(
      "Operate a running Lessor over its HTTP API. Output is key=value lines; --json for machines.",
    )
    .option("--url <url>", "Lessor's base URL (env LESSOR_URL; default http://127.0.0.1:8787)")
    .option(
      "--admin-key <key>",
      "the admin key (env LESSOR_ADMIN_KEY; for a loopback URL, .lessor/secrets.json of npm start)",
    )
    .option("--json", "print the API's JSON instead of key=value lines")
    .option(
      "--region <region>",
      "the region an operator command is for (env LESSOR_REGION; default: the default region)",
    )
    .showHelpAfterError()
    .exitOverride()
    .configureOutput({
      writeOut: (text) => {
        for (const line of text.replace(/\n$/, "").split("\n")) environment.out.line(line);
      },
      writeErr: (text) => {
        for (const line of text.replace(/\n$/, "").split("\n")) environment.out.error(line);
      },
    })
    .addHelpText(
      "after",
      `
Errors print the API's code and message on stderr and exit non-zero:
  error code=tenant_not_found status=404 message="No such tenant."

Examples:
  npx lessorctl tenants create acme --connection-string
  npx lessorctl capacity
  npx lessorctl status acme
  npx lessorctl evict --dry-run --host local
  npx lessorctl campaign status cmp_0123456789abcdef --watch
  npx lessorctl reseal
  npx lessorctl --region eu tenants list
  npx lessorctl tenants move acme --to eu`,
    );
  for (const group of commandGroups) group.register(program, ctx);
  // Subcommands report usage errors through the same output and never exit the process themselves.
  const configure = (command: Command) => {
    for (const sub of command.commands) {
      sub.exitOverride().showHelpAfterError().configureOutput(program.configureOutput());
      configure(sub);
    }
  };
  configure(program);
  return program;
}

/** Runs lessorctl with `argv` (without node and the script) and returns the exit code. */
export async function runCli(argv: readonly string[], environment: CliEnvironment): Promise<number> {
  const ctx = commandContext(environment);
  const program = buildProgram(ctx, environment);
  try {
    await program.parseAsync([...argv], { from: "user" });
    return ctx.exit.code;
  } catch (error) {
    if (error instanceof CommanderError) {
      // --help and --version "fail" with exit code 0; usage errors were already printed.
      return error.exitCode;
    }
    if (error instanceof ApiError) {
      const fields = { code: error.code, status: error.status, message: error.message };
      environment.out.error(
        program.opts<{ json?: boolean }>().json ? JSON.stringify({ error: fields }) : kv("error", fields),
      );
      return 1;
    }
    environment.out.error(
      kv("error", { code: "cli_failed", message: error instanceof Error ? error.message : String(error) }),
    );
    return 1;
  }
}
