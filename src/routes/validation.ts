/**
 * Request validation: valibot schemas run by Hono's validator middleware (Standard Schema), so a
 * route reads typed input with `c.req.valid("json" | "query")`. Every refusal keeps Lessor's error
 * shape: `400 invalid_request` with a message that names the field (or a field's own stable code,
 * such as `invalid_tenant_id`), never valibot's raw issue list.
 *
 * JSON bodies are read whatever their Content-Type (`curl -d` sends a form type), so a body that is
 * not JSON is `invalid_json`, never silently `{}`.
 */
import { sValidator } from "@hono/standard-validator";
import type { StandardSchemaV1 } from "@standard-schema/spec";
import type { MiddlewareHandler } from "hono";
import * as v from "valibot";
import { parseTenantId, type TenantId } from "../core/tenant-id.ts";
import { type ErrorCode, LessorError } from "../errors/index.ts";
import { type AppEnv, readJson } from "./context.ts";

/** Stable codes for particular fields (`{ id: "invalid_tenant_id" }`); the rest are `invalid_request`. */
export type FieldCodes = Readonly<Record<string, ErrorCode>>;

/** The field an issue is about, as a dotted path (`queries.3.query`), or "" for the body itself. */
function issuePath(issue: StandardSchemaV1.Issue): string {
  return (issue.path ?? [])
    .map((segment) => String(typeof segment === "object" ? segment.key : segment))
    .join(".");
}

/** The refusal for a failed validation: the first issue, with its field's code if it has one. */
export function refusal(issues: readonly StandardSchemaV1.Issue[], codes: FieldCodes = {}): LessorError {
  const issue = issues[0];
  if (!issue) return new LessorError("invalid_request");
  const path = issuePath(issue);
  const code = codes[path.split(".")[0] ?? ""];
  if (code) return new LessorError(code);
  // Messages written for Lessor's schemas name their field; a library default gets the path.
  const message = path === "" || issue.message.includes(path) ? issue.message : `${path}: ${issue.message}`;
  return new LessorError("invalid_request", { publicMessage: message });
}

/** Validates the query string; `c.req.valid("query")` is the schema's output. */
export function query<Schema extends StandardSchemaV1>(schema: Schema, codes: FieldCodes = {}) {
  return sValidator("query", schema, (result) => {
    if (!result.success) throw refusal(result.error, codes);
  });
}

/** Validates the JSON body (any Content-Type); `c.req.valid("json")` is the schema's output. */
export function jsonBody<Schema extends StandardSchemaV1>(
  schema: Schema,
  codes: FieldCodes = {},
): MiddlewareHandler<
  AppEnv,
  string,
  {
    in: { json: StandardSchemaV1.InferInput<Schema> };
    out: { json: StandardSchemaV1.InferOutput<Schema> };
  }
> {
  return async (c, next) => {
    const result = await schema["~standard"].validate(await readJson(c));
    if (result.issues) throw refusal(result.issues, codes);
    c.req.addValidatedData("json", result.value as object);
    await next();
  };
}

/**
 * A JSON object with these fields (valibot alone would take an array for an object). Fields it
 * does not name are ignored.
 */
export function jsonObject<const Entries extends v.ObjectEntries>(entries: Entries) {
  return v.pipe(
    v.unknown(),
    v.check(
      (body) => typeof body === "object" && body !== null && !Array.isArray(body),
      "The body must be a JSON object.",
    ),
    v.object(entries),
  );
}

/** `?limit=`: a bounded page size, 1 to 200 (default 50). */
export const pageLimit = v.optional(
  v.pipe(
    v.string(),
    v.regex(/^[1-9][0-9]{0,2}$/, "limit must be an integer from 1 to 200."),
    v.transform((raw: string) => Number(raw)),
    v.maxValue(200, "limit must be an integer from 1 to 200."),
  ),
  "50",
);

/** The one refusal for a cursor this endpoint did not hand out. */
export const badCursor = "cursor is not a cursor this endpoint returned.";

/** A cursor that is a positive integer this endpoint handed out (`min` is 0 or 1). */
export function integerCursor(min: 0 | 1) {
  return v.optional(
    v.pipe(
      v.string(),
      v.regex(min === 1 ? /^[1-9][0-9]{0,17}$/ : /^[0-9]{1,18}$/, badCursor),
      v.transform((raw: string) => Number(raw)),
      v.check((n: number) => Number.isSafeInteger(n), badCursor),
    ),
  );
}

/** A tenant id (a validated slug), before anything is derived from it. */
export const tenantIdSchema = v.custom<TenantId>(
  (raw) => parseTenantId(raw) !== null,
  "not a tenant id (1 to 40 lowercase letters, digits or inner hyphens).",
);
