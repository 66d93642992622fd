/**
 * `lessorctl reseal` (`npm run reseal`): moves every sealed credential under the current key of
 * `LESSOR_SEAL_KEY`, one bounded batch of `POST /v1/credentials/reseal` after another, until the
 * catalog has been walked to its end (docs/rotation.md). Killed half way, it is simply run
 * again: what is already under the current key is never read again.
 */
import type { Command } from "commander";
import { ApiError, type LessorClient } from "../client.ts";
import type { CommandContext } from "../context.ts";
import { kv } from "../output.ts";

/** A credential the batch could not move (src/reseal/index.ts). */
export interface ResealFailure {
  tenantId: string;
  keyId: string | null;
  problem: string;
}

/** One batch's answer of `POST /v1/credentials/reseal`. */
export interface ResealProgress {
  currentKeyId: string;
  resealed: number;
  skipped: number;
  failed: ResealFailure[];
  remaining: number;
  cursor: string | null;
  done: boolean;
}

/** What a whole run did. */
export interface ResealRun {
  currentKeyId: string;
  batches: number;
  resealed: number;
  skipped: number;
  failed: ResealFailure[];
  /** Credentials not under the current key once the run ended: 0 means the old keys can go. */
  remaining: number;
}

/** Tries per batch when Lessor answers 503 (its control plane briefly out of reach). */
const attemptsPerBatch = 4;

async function batch(
  client: LessorClient,
  body: { limit: number; after: string | null; prefix: string },
  sleep: (ms: number) => Promise<void>,
): Promise<ResealProgress> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await client.call<ResealProgress>("POST", "/v1/credentials/reseal", { body });
    } catch (error) {
      const retry = error instanceof ApiError && error.status === 503;
      if (!retry || attempt >= attemptsPerBatch) throw error;
      await sleep(1_000 * attempt);
    }
  }
}

/** Calls the reseal route until it is done; `onBatch` sees each batch's answer. */
export async function resealAll(
  client: LessorClient,
  options: { batch: number; prefix: string },
  sleep: (ms: number) => Promise<void>,
  onBatch: (progress: ResealProgress, index: number) => void,
): Promise<ResealRun> {
  const run: ResealRun = { currentKeyId: "", batches: 0, resealed: 0, skipped: 0, failed: [], remaining: 0 };
  let after: string | null = null;
  for (;;) {
    const progress = await batch(client, { limit: options.batch, after, prefix: options.prefix }, sleep);
    run.batches++;
    run.currentKeyId = progress.currentKeyId;
    run.resealed += progress.resealed;
    run.skipped += progress.skipped;
    run.failed.push(...progress.failed);
    run.remaining = progress.remaining;
    onBatch(progress, run.batches);
    if (progress.done || progress.cursor === null) return run;
    if (progress.cursor === after) {
      throw new ApiError("unexpected_answer", "the reseal cursor did not advance", 200);
    }
    after = progress.cursor;
  }
}

export function register(program: Command, ctx: CommandContext): void {
  program
    .command("reseal")
    .description("re-seal every tenant credential under the current key of LESSOR_SEAL_KEY, in batches")
    .option("--batch <n>", "credentials per request, 1 to 500", "100")
    .option("--prefix <prefix>", "only tenants whose id starts with this (a canary slice first)", "")
    .addHelpText(
      "after",
      `
Output:
  reseal batch=1 resealed=100 skipped=0 failed=0 remaining=2400 cursor=acme-0099
  …
  reseal_done resealed=2500 skipped=0 failed=0 remaining=0 current_key=k2

  skipped: changed by a rotation or a create while the batch ran (already under the current key).
  A credential that cannot be opened is listed on stderr (reseal_failed tenant=… key=k1
  problem=key_missing) and the exit code is 1; so it is while remaining is not 0. Remove an old
  key from LESSOR_SEAL_KEY only after a run that ends with remaining=0. Safe to stop and run again.`,
    )
    .action(async (options: { batch: string; prefix: string }, command: Command) => {
      const size = Number(options.batch);
      if (!Number.isInteger(size) || size < 1 || size > 500) {
        throw new ApiError("invalid_request", "--batch must be an integer from 1 to 500.", 0);
      }
      const json = ctx.json(command);
      const run = await resealAll(
        ctx.client(command),
        { batch: size, prefix: options.prefix },
        ctx.sleep,
        (p, n) => {
          if (json) return;
          ctx.out.line(
            kv("reseal", {
              batch: n,
              resealed: p.resealed,
              skipped: p.skipped,
              failed: p.failed.length,
              remaining: p.remaining,
              cursor: p.cursor,
            }),
          );
          for (const f of p.failed) {
            ctx.out.error(kv("reseal_failed", { tenant: f.tenantId, key: f.keyId, problem: f.problem }));
          }
        },
      );
      ctx.print(command, run, () =>
        ctx.out.line(
          kv("reseal_done", {
            resealed: run.resealed,
            skipped: run.skipped,
            failed: run.failed.length,
            remaining: run.remaining,
            current_key: run.currentKeyId,
          }),
        ),
      );
      if (run.failed.length > 0 || run.remaining > 0) ctx.exit.code = 1;
    });
}
