import type { Context } from "hono";
import { LessorError } from "../errors/index.ts";

/** The Hono environment of every route. */
export interface AppEnv {
  Bindings: Env;
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

/** Parses a bounded page size (default 50, at most 200). */
export function pageLimit(raw: string | undefined): number {
  if (raw === undefined) return 50;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 1 || value > 200) {
    throw new LessorError("invalid_request", { publicMessage: "limit must be an integer from 1 to 200." });
  }
  return value;
}
