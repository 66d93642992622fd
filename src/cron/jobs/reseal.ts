/**
 * Cron job: the fleet reseals itself (docs/adr/015-seal-key-ring.md). While `LESSOR_SEAL_KEY` holds
 * more than one key, each tick moves at most `LESSOR_RESEAL_BATCH` credentials under the current
 * key, through the same batch as `POST /v1/credentials/reseal`, reading at most a few pages
 * from the beginning of the catalog (what is done is never read again, so no cursor needs to be
 * kept). With one key nothing can be moved and the job reads nothing. Idempotent; safe to cut short.
 */
import type { LessorConfig } from "../../config/index.ts";
import { loadConfig } from "../../config/index.ts";
import { withControlPlane } from "../../control-plane/index.ts";
import { sealRingSummary } from "../../crypto/seal.ts";
import { maxResealBatch, resealBatch } from "../../reseal/index.ts";
import type { CronJob } from "../fan-out.ts";

/** Pages one tick reads at most: unopenable values (reported, left in place) cannot starve the rest. */
const pagesPerTick = 4;

export interface ResealTick {
  currentKeyId: string;
  resealed: number;
  skipped: number;
  failed: number;
  remaining: number;
}

/** One tick's bounded reseal of `region`'s credentials whose tenant id starts with `prefix` ("" for all). */
export async function resealTick(
  env: Env,
  config: LessorConfig,
  options: { prefix?: string; batch: number; region: string },
): Promise<ResealTick> {
  return withControlPlane(
    config,
    env,
    options.region,
    async (db) => {
      const tick = { currentKeyId: "", resealed: 0, skipped: 0, failed: 0, remaining: 0 };
      let after: string | null = null;
      for (let page = 0; page < pagesPerTick && tick.resealed < options.batch; page++) {
        const limit: number = Math.min(options.batch - tick.resealed, maxResealBatch);
        const batch = await resealBatch(db, env.LESSOR_SEAL_KEY, {
          prefix: options.prefix ?? "",
          after,
          limit,
        });
        tick.currentKeyId = batch.currentKeyId;
        tick.resealed += batch.resealed;
        tick.skipped += batch.skipped;
        tick.failed += batch.failed.length;
        tick.remaining = batch.remaining;
        if (batch.done) break;
        after = batch.cursor;
      }
      return tick;
    },
    "lessor-reseal",
  );
}

export const resealJob: CronJob = {
  name: "reseal",
  timeoutMs: 30_000,
  async run(env, cron) {
    const config = loadConfig(env);
    if (config.resealBatch === 0) {
      return { summary: "off (LESSOR_RESEAL_BATCH=0)", fields: {}, changed: false };
    }
    const ring = await sealRingSummary(env.LESSOR_SEAL_KEY);
    if (ring.keyIds.length === 1) {
      return {
        summary: `LESSOR_SEAL_KEY holds one key (${ring.current}); nothing to reseal`,
        fields: {},
        changed: false,
      };
    }
    const tick = await resealTick(env, config, { batch: config.resealBatch, region: cron.region });
    return {
      summary: `resealed ${tick.resealed} credential(s) under ${tick.currentKeyId}; ${tick.remaining} not under it yet (${tick.failed} could not be opened)`,
      fields: { ...tick, keyIds: ring.keyIds },
      level: tick.failed > 0 ? "warn" : "info",
      changed: tick.resealed + tick.failed > 0,
    };
  },
};
