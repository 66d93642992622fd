import type { Context } from "hono";
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
