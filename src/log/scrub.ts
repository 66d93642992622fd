/**
 * What the console guard (console-guard.ts) prints instead of what it was given: pure, so that it
 * is unit-tested without the runtime. Which secrets a configuration holds (`secretValues`), text
 * with them and every secret-shaped string taken out (`scrub`), and one console argument as text
 * (`renderArgument`).
 */
import { inspect } from "node:util";
import { redact } from "./index.ts";

/** The bindings that hold secrets, whole or inside JSON (docs/configuration.md). */
export const secretBindings = [
  "LESSOR_ADMIN_KEY",
  "LESSOR_METRICS_KEY",
  "LESSOR_SEAL_KEY",
  "LESSOR_KEY_MAC_KEYS",
  "LESSOR_CONTROL_PLANE_URL",
  "LESSOR_HOSTS",
  "LESSOR_REGIONS",
  "LESSOR_TUNNELS",
] as const;

/**
 * Values shorter than this are not redacted by value: a short value would take out ordinary words
 * (and no secret Lessor accepts is this short; `redact` still catches the shapes).
 */
const shortestSecret = 8;

/** Every string leaf of a JSON value. */
function stringLeaves(value: unknown, out: string[]): void {
  if (typeof value === "string") out.push(value);
  else if (Array.isArray(value)) for (const item of value) stringLeaves(item, out);
  else if (value !== null && typeof value === "object") {
    for (const item of Object.values(value)) stringLeaves(item, out);
  }
}

/**
 * The secret values in `bindings`: each secret binding whole, each string inside it if it is JSON,
 * and the password of each of those that is a URL (as written and decoded). Pure, for tests.
 */
export function secretValues(bindings: Readonly<Record<string, unknown>>): string[] {
  const found = new Set<string>();
  const add = (value: string) => {
    if (value.length >= shortestSecret) found.add(value);
  };
  for (const name of secretBindings) {
    const raw = bindings[name];
    if (typeof raw !== "string" || raw === "") continue;
    add(raw);
    const leaves: string[] = [raw];
    try {
      stringLeaves(JSON.parse(raw), leaves);
    } catch {
      // Not JSON: the value alone.
    }
    for (const leaf of leaves) {
      add(leaf);
      const password = urlPassword(leaf);
      if (password !== undefined) {
        add(password);
        add(safeDecode(password));
        add(encodeURIComponent(safeDecode(password)));
      }
    }
  }
  // Longest first, so that a secret containing another is taken out whole.
  return [...found].sort((a, b) => b.length - a.length);
}

function urlPassword(value: string): string | undefined {
  if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(value)) return undefined;
  try {
    const password = new URL(value).password;
    return password === "" ? undefined : password;
  } catch {
    return undefined;
  }
}

function safeDecode(value: string): string {
  try {
    return decodeURIComponent(value);
  } catch {
    return value;
  }
}

/** `text` with every value of `secrets` and everything `redact` recognises taken out. */
export function scrub(text: string, secrets: readonly string[]): string {
  let out = text;
  for (const secret of secrets) if (out.includes(secret)) out = out.split(secret).join("[redacted]");
  return redact(out);
}

/** One console argument as text: an Error by name and message, an object shallow, on one line. */
export function renderArgument(value: unknown): string {
  if (typeof value === "string") return value;
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  return inspect(value, { depth: 1, breakLength: Number.POSITIVE_INFINITY, compact: true });
}

const methods = ["log", "info", "warn", "error", "debug", "trace"] as const;

/** The console methods the guard replaces. */
export type ConsoleMethods = Record<(typeof methods)[number], (...args: unknown[]) => void>;

/**
 * Replaces each console method of `target` by one that prints its arguments as one scrubbed line
 * through the method it replaced. `trace` prints like `log`: a stack is never printed.
 */
export function guardMethods(target: ConsoleMethods, secrets: () => readonly string[]): void {
  const log = target.log.bind(target);
  for (const method of methods) {
    const print = method === "trace" ? log : target[method].bind(target);
    target[method] = (...args: unknown[]) => {
      print(scrub(args.map(renderArgument).join(" "), secrets()));
    };
  }
}
