/** `npm run deploy:check`'s findings (local/deploy-check.ts), on configurations made up here. */
import { describe, expect, it } from "vitest";
import { type DeployConfig, deployFindings, hostPathFindings } from "../../local/deploy-check.ts";

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

describe("hostPathFindings", () => {
  it("explains each host's deployed path, and refuses the paths that exist only locally", () => {
    const findings = hostPathFindings(
      JSON.stringify({
        neon: "postgres://owner:secret-pw@ep-cool-1.eu-central-1.aws.neon.tech/neondb",
        rds: "postgres://admin:secret-pw@db.abc.eu-west-1.rds.amazonaws.com:5432/postgres",
        proxied: { url: "postgres://a:secret-pw@db.example.com/postgres", path: "websocket" },
        plain: { url: "postgres://a:secret-pw@db.example.com:6543/postgres", sslmode: "disable" },
      }),
    );
    expect(findings.map((f) => [f.level, f.detail])).toEqual([
      ["ok", expect.stringMatching(/^neon \(neon, .*\): Neon's WebSocket endpoint wss:\/\/ep-cool-1/)],
      [
        "ok",
        expect.stringMatching(
          /^rds \(postgres, .*:5432\): TCP \(connect\(\) \+ STARTTLS\), certificate verified/,
        ),
      ],
      ["error", expect.stringMatching(/exists only through LESSOR_WS_PROXY/)],
      [
        "error",
        expect.stringMatching(/sslmode "disable" is allowed only for a host on this machine's loopback/),
      ],
    ]);
    // Nothing of a connection string is printed.
    expect(JSON.stringify(findings)).not.toContain("secret-pw");
  });

  it("says how to have the hosts checked when LESSOR_HOSTS is not in the environment", () => {
    expect(hostPathFindings(undefined)).toEqual([expect.objectContaining({ level: "warn", check: "hosts" })]);
  });
});
