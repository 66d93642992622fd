/**
 * `POST /v1/credentials/reseal` (admin): one bounded batch of the reseal that moves every sealed
 * credential under the current key of `LESSOR_SEAL_KEY` (src/reseal, docs/adr/015-seal-key-ring.md).
 *
 *     {"limit"?: 1..500 (100), "after"?: <cursor>, "prefix"?: <tenant-id prefix>}
 *       → 200 {currentKeyId, resealed, skipped, failed: [{tenantId, keyId, problem}], remaining, cursor, done}
 *
 * `npm run reseal` (`lessorctl reseal`) calls it with the returned cursor until `done`. A run can
 * stop anywhere and start again from no cursor: what is already under the current key is never
 * read again. `prefix` limits a run to tenant ids that start with it (a canary slice first).
 */
import { Hono } from "hono";
import * as v from "valibot";
import { writeAudit } from "../audit/index.ts";
import { loadConfig } from "../config/index.ts";
import { withControlPlane } from "../control-plane/index.ts";
import { parseTenantId } from "../core/tenant-id.ts";
import { maxResealBatch, resealBatch } from "../reseal/index.ts";
import { requireAdmin } from "./auth.ts";
import { type AppEnv, regionParam } from "./context.ts";
import { jsonBody, jsonObject } from "./validation.ts";

export const credentialRoutes = new Hono<AppEnv>();

const afterMessage = "after must be a cursor this endpoint returned (or null).";
const limitMessage = `limit must be an integer from 1 to ${maxResealBatch}.`;

const resealBody = jsonObject({
  limit: v.optional(
    v.pipe(
      v.number(limitMessage),
      v.integer(limitMessage),
      v.minValue(1, limitMessage),
      v.maxValue(maxResealBatch, limitMessage),
    ),
    100,
  ),
  after: v.optional(
    v.nullable(
      v.pipe(
        v.string(afterMessage),
        v.check((raw) => parseTenantId(raw) !== null, afterMessage),
      ),
    ),
    null,
  ),
  prefix: v.optional(
    v.pipe(
      v.string("prefix must be a string."),
      v.regex(/^[a-z0-9-]{0,40}$/, "prefix must be up to 40 lowercase letters, digits or hyphens."),
    ),
    "",
  ),
});

credentialRoutes.post("/v1/credentials/reseal", requireAdmin, jsonBody(resealBody), async (c) => {
  const { limit, after, prefix } = c.req.valid("json");
  const progress = await withControlPlane(
    loadConfig(c.env),
    c.env,
    regionParam(c),
    async (db) => {
      const batch = await resealBatch(db, c.env.LESSOR_SEAL_KEY, { limit, after, prefix });
      if (batch.resealed > 0 || batch.failed.length > 0) {
        await writeAudit(db, {
          actor: c.var.actor,
          action: "credentials.reseal",
          tenantId: null,
          detail: {
            keyId: batch.currentKeyId,
            resealed: batch.resealed,
            skipped: batch.skipped,
            failed: batch.failed.length,
            ...(prefix === "" ? {} : { prefix }),
          },
        });
      }
      return batch;
    },
    "lessor-reseal",
  );
  return c.json(progress);
});
