/**
 * `lessorctl jwt dev <tenant>`: row-level security on this machine without an identity provider.
 * It keeps an ES256 key pair in `.lessor/jwt-dev/<tenant>.json` (made on the first run, reused
 * after, so tokens minted earlier keep working), switches the tenant to JWT mode trusting that key
 * as a static key set (`PUT /v1/tenants/:id/jwt`), and mints a token for each named user.
 *
 * Only against a loopback Lessor: a key pair on a laptop must never be what a deployed tenant
 * trusts. Deployed, tokens come from the tenant's identity provider.
 */
import { chmodSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, relative } from "node:path";
import type { Command } from "commander";
import { ApiError } from "../client.ts";
import type { CommandContext } from "../context.ts";
import {
  type DevSigningKey,
  devJwtConfig,
  isDevSigningKey,
  mintDevToken,
  newDevSigningKey,
  tokenVariable,
  userProblem,
} from "../jwt-dev.ts";
import { kv } from "../output.ts";

interface StoredJwt {
  issuer: string;
  audiences: string[];
  role: string;
  algorithms: string[];
}

const loopbackHosts = new Set(["127.0.0.1", "localhost", "[::1]"]);

/** The kept key pair, or a new one written there (owner-only). */
async function devKey(file: string, fresh: boolean): Promise<{ key: DevSigningKey; made: boolean }> {
  if (!fresh) {
    try {
      const kept: unknown = JSON.parse(readFileSync(file, "utf8"));
      if (isDevSigningKey(kept)) return { key: kept, made: false };
    } catch {
      // No key kept yet (or an unreadable one): make a new one.
    }
  }
  const key = await newDevSigningKey();
  mkdirSync(dirname(file), { recursive: true, mode: 0o700 });
  writeFileSync(file, `${JSON.stringify(key, null, 2)}\n`, { mode: 0o600 });
  chmodSync(file, 0o600);
  return { key, made: true };
}

export function register(program: Command, ctx: CommandContext): void {
  const jwt = program.command("jwt").description("end-user JWTs for row-level security: a local recipe");

  jwt
    .command("dev")
    .description(
      "a key pair, JWT mode with it as a static key set, and tokens for named users (loopback Lessor only)",
    )
    .argument("<tenant>", "tenant id")
    .option("--user <name...>", "users to mint a token for (their `sub`)", ["alice", "bob"])
    .option("--ttl <seconds>", "how long each token is valid", "86400")
    .option("--new-key", "make a new key pair (tokens minted with the old one stop working)")
    .option("--export", "print `export LESSOR_<USER>_TOKEN='…'` lines for eval, nothing else")
    .addHelpText(
      "after",
      `
Output:
  jwt tenant=acme issuer=https://lessorctl.invalid/jwt-dev audience=lessor-dev algorithm=ES256
    role=authenticated kid=dev-1a2b3c4d key_file=.lessor/jwt-dev/acme.json key=kept   (one line)
  token user=alice variable=LESSOR_ALICE_TOKEN expires_at=2026-12-02T14:02:31.000Z token=eyJ…
  token user=bob variable=LESSOR_BOB_TOKEN expires_at=… token=eyJ…

  Export the tokens for examples/rls.mjs in one step:
    eval "$(npx lessorctl jwt dev acme --export)"

  Running it again keeps the key (and the tokens minted with it), sets JWT mode again and mints
  new tokens. The private key stays in .lessor/ (git-ignored). Deployed, a tenant's tokens come
  from its identity provider: PUT /v1/tenants/:id/jwt with its jwksUrl.`,
    )
    .action(
      async (
        tenantId: string,
        options: { user: string[]; ttl: string; newKey?: boolean; export?: boolean },
        command: Command,
      ) => {
        const client = ctx.client(command);
        const host = new URL(client.url).hostname;
        if (!loopbackHosts.has(host)) {
          throw new ApiError(
            "not_local",
            `jwt dev only talks to a Lessor on this machine (127.0.0.1, localhost), not ${client.url}: a deployed tenant trusts its identity provider's keys (PUT /v1/tenants/${tenantId}/jwt with its jwksUrl).`,
            0,
          );
        }
        const ttl = Number(options.ttl);
        if (!Number.isInteger(ttl) || ttl < 60 || ttl > 30 * 86_400) {
          throw new ApiError("invalid_option", "--ttl must be whole seconds, 60 to 2592000 (30 days).", 0);
        }
        const users = [...new Set(options.user)];
        for (const user of users) {
          const problem = userProblem(user);
          if (problem) throw new ApiError("invalid_option", `--user ${problem}.`, 0);
        }

        const file = join(ctx.cwd, ".lessor", "jwt-dev", `${tenantId}.json`);
        const { key, made } = await devKey(file, options.newKey === true);
        const answer = await client.call<{ jwt: StoredJwt }>(
          "PUT",
          `/v1/tenants/${encodeURIComponent(tenantId)}/jwt`,
          { body: devJwtConfig(key) },
        );
        const tokens = await Promise.all(
          users.map(async (user) => ({
            user,
            variable: tokenVariable(user),
            ...(await mintDevToken(key, user, ttl)),
          })),
        );

        if (options.export === true) {
          for (const t of tokens) ctx.out.line(`export ${t.variable}='${t.token}'`);
          return;
        }
        ctx.print(command, { jwt: answer.jwt, kid: key.kid, keyFile: file, tokens }, () => {
          ctx.out.line(
            kv("jwt", {
              tenant: tenantId,
              issuer: answer.jwt.issuer,
              audience: answer.jwt.audiences,
              algorithm: answer.jwt.algorithms,
              role: answer.jwt.role,
              kid: key.kid,
              key_file: relative(ctx.cwd, file),
              key: made ? "new" : "kept",
            }),
          );
          for (const t of tokens) {
            ctx.out.line(
              kv("token", { user: t.user, variable: t.variable, expires_at: t.expiresAt, token: t.token }),
            );
          }
        });
      },
    );
}
