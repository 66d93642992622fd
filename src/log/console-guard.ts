/**
 * The console guard: whatever anything in the isolate prints (Lessor's logger, a dependency's
 * warning, the driver's `console.warn(error)`), it reaches the runtime's console as one line of
 * text with every secret taken out (docs/invariants.md invariant 19).
 *
 * Lessor's own lines are redacted where they are made (`logEvent`). Dependencies print what they
 * like: the Neon driver's bundled EventEmitter warns of a listener leak with `console.warn(error)`
 * whose `emitter` is the leaking client, and the runtime's console prints that client whole,
 * connection string and password included (issue 39). So every console method is replaced, once,
 * by one that
 *
 * - prints an `Error` as its name and message only: never its stack (no stack reaches a log) nor
 *   its properties (where a dependency hangs the objects it complains about);
 * - prints any other object inspected shallowly, on one line;
 * - takes out every secret of the Worker's configuration by value (the admin and metrics keys,
 *   every seal and MAC key, every password in a configured connection string), and everything
 *   shaped like one (`redact`: connection strings with a password, tenant keys, `password=`).
 *
 * The secrets are read from the Worker's bindings on the first line printed, not at import: the
 * bindings are there by then, and a Worker that prints nothing pays nothing.
 */
import { env } from "cloudflare:workers";
import { guardMethods, secretValues } from "./scrub.ts";

let guarded = false;

/**
 * Replaces every console method by its guarded form (once; a second call does nothing), redacting
 * the secrets of this Worker's bindings.
 */
export function guardConsole(): void {
  if (guarded) return;
  guarded = true;
  let secrets: readonly string[] | null = null;
  guardMethods(console, () => {
    secrets ??= secretValues(env as unknown as Record<string, unknown>);
    return secrets;
  });
}
