/**
 * The secret canary over `npm test`'s own output (test/run.ts): every line either half prints is
 * searched for every secret the test stacks were given (test/secrets.ts), and for anything shaped
 * like a credential (a connection string with a password, a tenant key, a sealed value: the same
 * shapes `redact` takes out, src/log/index.ts). One hit fails the run (docs/invariants.md
 * invariant 19).
 */
import { redact } from "../src/log/index.ts";

/** What a line holds that it must not, described without repeating it. */
export function secretsIn(line: string, secrets: readonly string[]): string[] {
  const found: string[] = [];
  for (const secret of secrets) {
    if (line.includes(secret) || line.includes(encodeURIComponent(secret))) {
      found.push(`the test secret that starts ${JSON.stringify(secret.slice(0, 4))}`);
    }
  }
  if (redact(line) !== line) found.push("text shaped like a credential");
  return found;
}

/** `line` as the canary reports it: the secrets it found taken out. */
export function reportable(line: string, secrets: readonly string[]): string {
  let out = line;
  for (const secret of secrets) out = out.split(secret).join("[secret]");
  return redact(out).slice(0, 300);
}
