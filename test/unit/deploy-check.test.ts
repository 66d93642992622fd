/** `npm run deploy:check`'s findings (local/deploy-check.ts), on configurations made up here. */
import { describe, expect, it } from "vitest";
import { type DeployConfig, deployFindings } from "../../local/deploy-check.ts";

const ready: DeployConfig = {
  name: "lessor",
  compatibility_date: "2026-11-01",
  vars: { LESSOR_WS_PROXY: "" },
  limits: { cpu_ms: 30_000 },
  ratelimits: [{ name: "AUTH_FAILURES", namespace_id: "7341" }],
  migrations: [{ tag: "v1" }, { tag: "v2" }],
  triggers: { crons: ["* * * * *"] },
};

const errors = (config: DeployConfig, gzipBytes = 300_000, today = "2026-12-01") =>
  deployFindings(config, { gzipBytes }, today)
    .filter((f) => f.level === "error")
    .map((f) => `${f.check}: ${f.detail}`);

describe("deployFindings", () => {
  it("passes a configuration ready for production", () => {
    expect(errors(ready)).toEqual([]);
  });

  it("names each thing that would break or weaken a production deploy", () => {
    const problems = errors(
      {
        ...ready,
        compatibility_date: "2027-01-01",
        vars: { LESSOR_WS_PROXY: "127.0.0.1:8787", LESSOR_SEAL_KEY: "oops" },
        limits: {},
        ratelimits: [
          { name: "AUTH_FAILURES", namespace_id: "1001" },
          { name: "OTHER", namespace_id: "1001" },
        ],
        migrations: [{ tag: "v1" }, { tag: "v1" }],
        triggers: { crons: [] },
      },
      11 * 1024 * 1024,
    );
    expect(problems).toEqual([
      expect.stringMatching(/^bundle: .*over the 10 MB Workers Paid limit/),
      "compatibility_date: 2027-01-01 is in the future (today is 2026-12-01)",
      "ratelimits: namespace_id 1001 is used twice",
      expect.stringMatching(/^ratelimits: AUTH_FAILURES: namespace_id 1001 is the example's/),
      expect.stringMatching(/^ratelimits: OTHER: namespace_id 1001 is the example's/),
      expect.stringMatching(/^limits: set \[limits\] cpu_ms/),
      "secrets: LESSOR_SEAL_KEY is in [vars]: set it with wrangler secret put",
      expect.stringMatching(/^LESSOR_WS_PROXY: must be empty in production/),
      "migrations: a Durable Object migration tag repeats",
      expect.stringMatching(/^triggers: no cron trigger/),
    ]);
  });

  it("warns, without failing, past the Free plan's 3 MB", () => {
    const findings = deployFindings(ready, { gzipBytes: 4 * 1024 * 1024 }, "2026-12-01");
    expect(findings.find((f) => f.check === "bundle")).toMatchObject({ level: "warn" });
  });
});
