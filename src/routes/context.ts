import type { Context } from "hono";
import { loadConfig, regionNamed } from "../config/index.ts";
import { LessorError } from "../errors/index.ts";

/** The Hono environment of every route. */
export interface AppEnv {
  Bindings: Env;
  Variables: {
    /** Who an admin request is from (`admin:<fingerprint>`), set by `requireAdmin` for the audit log. */
    actor: string;
  };
}

export type AppContext = Context<AppEnv>;

/** Reads a JSON body, mapping malformed JSON to `invalid_json`. An empty body reads as `{}`. */
export async function readJson(c: AppContext): Promise<unknown> {
  const text = await c.req.text();
  if (text.trim() === "") return {};
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new LessorError("invalid_json");
  }
}

/**
 * The region an operator request is for: `?region=<name>`, or the default region without it
 * (docs/adr/023-regions.md). A name the deployment lacks is `400 region_unknown`. A request reads
 * and writes that region's control plane only.
 */
export function regionParam(c: AppContext): string {
  const raw = c.req.query("region");
  return regionNamed(loadConfig(c.env), raw === undefined || raw === "" ? null : raw).name;
}
