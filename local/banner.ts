/**
 * What `npm start` prints once Lessor answers: where it runs, where its admin key is, and the next
 * commands to paste. The key itself is never printed (docs/invariants.md, invariant 19): a
 * terminal's scrollback, a CI log or a screen share is output too. A first start (no `.lessor/pg` yet) suggests the quickstart's tenant; a restart does
 * not, because that tenant exists by then and a second create answers 409 tenant_exists.
 */
export interface BannerFacts {
  baseUrl: string;
  pid: number;
  /** Where the admin key came from: the environment's `LESSOR_ADMIN_KEY`, or `.lessor/secrets.json`. */
  adminKeyFrom: "environment" | "secrets-file";
  pgPort: number;
  /** Whether this start created the Postgres data folder (nothing existed before). */
  firstStart: boolean;
  /** Whether `npm start` fires the cron itself, and the setting that turned it off. */
  cron: { on: true } | { on: false; setting: string | undefined };
}

export function startBanner(facts: BannerFacts): string[] {
  const cronUrl = `"${facts.baseUrl}/__scheduled?cron=*+*+*+*+*"`;
  return [
    "",
    `Lessor is running at ${facts.baseUrl} (pid ${facts.pid}; Ctrl-C stops it)`,
    facts.adminKeyFrom === "environment"
      ? "Admin key: the LESSOR_ADMIN_KEY you set (not printed; export KEY=$LESSOR_ADMIN_KEY)"
      : `Admin key: in .lessor/secrets.json (not printed; export KEY=$(node -p 'require("./.lessor/secrets.json").adminKey'))`,
    `Postgres: 127.0.0.1:${facts.pgPort} (data in .lessor/pg; to start over: stop Lessor, rm -rf .lessor, npm start)`,
    facts.cron.on
      ? `Cron: the scheduled handler runs every minute (LESSOR_LOCAL_CRON=off turns that off); now: curl ${cronUrl}`
      : `Cron: off (LESSOR_LOCAL_CRON=${facts.cron.setting}); run it by hand: curl ${cronUrl}`,
    "",
    "In another terminal, in this folder:",
    `  export LESSOR_URL=${facts.baseUrl}`,
    ...(facts.firstStart
      ? [
          "  export LESSOR_CONNECTION_STRING=$(npx lessorctl tenants create acme --connection-string)",
          "  node examples/quickstart.mjs",
        ]
      : [
          "  npx lessorctl tenants list                                  # the tenants you have",
          "  npx lessorctl tenants create <new id> --connection-string   # a new one",
          "  npx lessorctl tenants key <id> --connection-string          # a new key for one you have",
        ]),
    "",
  ];
}
