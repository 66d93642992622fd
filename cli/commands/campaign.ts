/** `lessorctl campaign …`: create, watch and steer migration campaigns (docs/migrations.md). */
import type { Command } from "commander";
import type { CampaignTally, CohortTally } from "../../src/core/campaign.ts";
import type { CommandContext } from "../context.ts";
import { kv, progressBar } from "../output.ts";

interface CampaignView {
  id: string;
  state: string;
  toVersion: number;
  concurrency: number;
  blockedReason: string | null;
  reason: string | null;
  scope?: string;
  createdAt?: string;
  finishedAt?: string | null;
}

interface CampaignAnswer {
  campaign: CampaignView;
  counts: {
    pending: number;
    running: number;
    succeeded: number;
    failed: number;
    skipped: number;
    total: number;
  };
  cohorts: CampaignTally;
}

const finished = new Set(["done", "cancelled", "failed"]);

/** Where a campaign stands: what the progress bar and `status` show. */
export interface CampaignProgress {
  done: number;
  failed: number;
  skipped: number;
  remaining: number;
  total: number;
  /** Tenants being migrated right now (the current batch). */
  batch: number;
  /** none (no canary cohort), running, stabilizing (all done, waiting out the stability window), passed, failed. */
  canary: "none" | "running" | "stabilizing" | "passed" | "failed";
}

function unfinished(t: CohortTally): number {
  return t.pending + t.running + t.skippedRetry;
}

/** Progress from a campaign's answer: skipped-for-good counts as skipped, skipped-to-retry as remaining. */
export function campaignProgress(answer: CampaignAnswer): CampaignProgress {
  const { canary, rollout } = answer.cohorts;
  const both = (pick: (t: CohortTally) => number) => pick(canary) + pick(rollout);
  const canaryTotal = unfinished(canary) + canary.succeeded + canary.failed + canary.skippedFinal;
  const verdict: CampaignProgress["canary"] =
    canaryTotal === 0
      ? "none"
      : canary.failed > 0
        ? "failed"
        : unfinished(canary) > 0
          ? "running"
          : answer.campaign.state === "canary" || answer.campaign.state === "pending"
            ? "stabilizing"
            : "passed";
  return {
    done: both((t) => t.succeeded),
    failed: both((t) => t.failed),
    skipped: both((t) => t.skippedFinal),
    remaining: both(unfinished),
    total: answer.counts.total,
    batch: both((t) => t.running),
    canary: verdict,
  };
}

/** The one-line summary `status` and `--watch` print. */
export function campaignLine(answer: CampaignAnswer): string {
  const p = campaignProgress(answer);
  return kv("", {
    campaign: answer.campaign.id,
    state: answer.campaign.state,
    to_version: answer.campaign.toVersion,
    done: p.done,
    failed: p.failed,
    skipped: p.skipped,
    remaining: p.remaining,
    total: p.total,
    // Only a campaign that still runs has a batch: a finished one shows `-`, not 0.
    batch: finished.has(answer.campaign.state) ? null : p.batch,
    canary: p.canary,
    blocked: answer.campaign.blockedReason,
    reason: answer.campaign.reason,
  });
}

function barLine(answer: CampaignAnswer): string {
  const p = campaignProgress(answer);
  const settled = p.done + p.failed + p.skipped;
  const percent = p.total === 0 ? 100 : Math.floor((settled / p.total) * 100);
  return `${progressBar(settled, p.total)} ${String(percent).padStart(3)}% ${campaignLine(answer)}`;
}

const list = (raw: string | undefined) =>
  raw === undefined ? undefined : raw.split(",").filter((s) => s !== "");

export function register(program: Command, ctx: CommandContext): void {
  const campaign = program
    .command("campaign")
    .description("migration campaigns: create, list, status (--watch), pause, resume, cancel");
  const path = (id: string) => `/v1/campaigns/${encodeURIComponent(id)}`;

  campaign
    .command("create")
    .description("start a campaign that migrates tenants to a bundled schema version, canary first")
    .requiredOption("--to-version <n>", "the target schema version (a bundled tenant migration)")
    .option("--concurrency <n>", "tenants migrated at once")
    .option("--canary <tenants>", "comma-separated canary tenants (or --canary-percent)")
    .option("--canary-percent <p>", "share of the fleet migrated first, greater than 0 and at most 100")
    .option(
      "--tenants <tenants>",
      "comma-separated: only these tenants (default: every tenant below the version)",
    )
    .option("--continue-on-failure", "keep going past a failed tenant")
    .option("--force", "apply contract steps although old app versions were seen recently")
    .option("--drain-timeout-ms <ms>", "how long a tenant's leases may take to drain before it is skipped")
    .option("--stability-window-ms <ms>", "how long the canary must stay healthy before the rollout")
    .option("--id", "print only the new campaign's id (for $(…))")
    .action(
      async (
        options: {
          toVersion: string;
          concurrency?: string;
          canary?: string;
          canaryPercent?: string;
          tenants?: string;
          continueOnFailure?: boolean;
          force?: boolean;
          drainTimeoutMs?: string;
          stabilityWindowMs?: string;
          id?: boolean;
        },
        command: Command,
      ) => {
        const numeric = (raw: string | undefined) => (raw === undefined ? undefined : Number(raw));
        const body = Object.fromEntries(
          Object.entries({
            toVersion: Number(options.toVersion),
            concurrency: numeric(options.concurrency),
            canary: list(options.canary),
            canaryPercent: numeric(options.canaryPercent),
            tenants: list(options.tenants),
            continueOnFailure: options.continueOnFailure,
            force: options.force,
            drainTimeoutMs: numeric(options.drainTimeoutMs),
            stabilityWindowMs: numeric(options.stabilityWindowMs),
          }).filter(([, value]) => value !== undefined),
        );
        const answer = await ctx.client(command).call<{
          campaign: CampaignView;
          enrolled: number;
          canary: string[];
          alreadyCurrent: number;
        }>("POST", "/v1/campaigns", { body });
        if (options.id === true) return ctx.out.line(answer.campaign.id);
        ctx.print(command, answer, () =>
          ctx.out.line(
            kv("", {
              campaign: answer.campaign.id,
              state: answer.campaign.state,
              to_version: answer.campaign.toVersion,
              enrolled: answer.enrolled,
              canary: answer.canary,
              already_current: answer.alreadyCurrent,
            }),
          ),
        );
      },
    );

  campaign
    .command("list")
    .description("campaigns, newest first (next_cursor=… if more)")
    .option("--limit <n>", "page size, 1 to 200", "20")
    .option("--cursor <cursor>", "the next_cursor of the previous page")
    .action(async (options: { limit: string; cursor?: string }, command: Command) => {
      const query = new URLSearchParams({ limit: options.limit });
      if (options.cursor !== undefined) query.set("cursor", options.cursor);
      const answer = await ctx
        .client(command)
        .call<{ campaigns: CampaignView[]; nextCursor: string | null }>("GET", `/v1/campaigns?${query}`);
      ctx.print(command, answer, () => {
        for (const c of answer.campaigns) {
          ctx.out.line(
            kv("", {
              campaign: c.id,
              state: c.state,
              to_version: c.toVersion,
              concurrency: c.concurrency,
              scope: c.scope,
              created_at: c.createdAt,
              finished_at: c.finishedAt,
              blocked: c.blockedReason,
            }),
          );
        }
        if (answer.nextCursor !== null) ctx.out.line(kv("", { next_cursor: answer.nextCursor }));
      });
    });

  campaign
    .command("status")
    .description("where a campaign stands; --watch draws a live progress bar until it ends")
    .argument("<campaign>", "campaign id (cmp_…)")
    .option("--watch", "poll until the campaign is done, cancelled or failed")
    .option("--interval <ms>", "poll interval with --watch", "2000")
    .addHelpText(
      "after",
      `
Output:
  campaign=cmp_… state=rollout to_version=3 done=27 failed=0 skipped=1 remaining=384 total=412
    batch=4 canary=passed blocked=- reason=-   (one line)
  cohort=canary pending=0 running=0 succeeded=5 failed=0 skipped_retry=0 skipped_final=0
  cohort=rollout pending=380 running=4 succeeded=22 failed=0 skipped_retry=0 skipped_final=1

  batch: tenants being migrated now. canary: none, running, stabilizing (waiting out the
  stability window), passed or failed. skipped counts tenants skipped for good; tenants skipped
  to be retried count as remaining.
  --watch redraws one line with a progress bar on a terminal (prints a line per change
  otherwise) and exits 0 when the campaign is done, 1 when it failed or was cancelled.`,
    )
    .action(async (id: string, options: { watch?: boolean; interval: string }, command: Command) => {
      const client = ctx.client(command);
      const read = () => client.call<CampaignAnswer>("GET", `${path(id)}?limit=1`);
      let answer = await read();
      if (options.watch === true) {
        const interval = Math.max(200, Number(options.interval) || 2000);
        let last = "";
        for (;;) {
          const line = ctx.json(command)
            ? JSON.stringify({ campaign: answer.campaign, progress: campaignProgress(answer) })
            : barLine(answer);
          if (ctx.out.isTTY && !ctx.json(command)) ctx.out.redraw(line);
          else if (line !== last) ctx.out.line(line);
          last = line;
          if (finished.has(answer.campaign.state)) break;
          await ctx.sleep(interval);
          answer = await read();
        }
        if (ctx.out.isTTY && !ctx.json(command)) ctx.out.redraw(`${last}\n`);
        if (answer.campaign.state !== "done") ctx.exit.code = 1;
        if (ctx.json(command)) return;
      }
      ctx.print(command, answer, () => {
        ctx.out.line(campaignLine(answer));
        for (const cohort of ["canary", "rollout"] as const) {
          const t = answer.cohorts[cohort];
          ctx.out.line(
            kv("", {
              cohort,
              pending: t.pending,
              running: t.running,
              succeeded: t.succeeded,
              failed: t.failed,
              skipped_retry: t.skippedRetry,
              skipped_final: t.skippedFinal,
            }),
          );
        }
      });
    });

  for (const [action, route, what] of [
    ["pause", "pause", "stop claiming tenants; the ones running finish"],
    ["resume", "resume", "go on from where the campaign was paused"],
    ["cancel", "cancel", "cancel the campaign for good; tenants already migrated stay migrated"],
  ] as const) {
    const steer = campaign.command(action).description(what);
    // `abort` was this command's first name; the API and the docs say cancel.
    if (action === "cancel") steer.alias("abort");
    steer
      .argument("<campaign>", "campaign id (cmp_…)")
      .action(async (id: string, _options: unknown, command: Command) => {
        const answer = await ctx
          .client(command)
          .call<{ campaign: CampaignView }>("POST", `${path(id)}/${route}`);
        ctx.print(command, answer, () =>
          ctx.out.line(
            kv("", {
              campaign: answer.campaign.id,
              state: answer.campaign.state,
              to_version: answer.campaign.toVersion,
              reason: answer.campaign.reason,
            }),
          ),
        );
      });
  }
}
