import { afterEach, describe, expect, it, vi } from "vitest";
import { describeFailure, errorCatalog, errorHeaders, LessorError } from "../../src/errors/index.ts";
import { logEvent, logEventSampled, redact, sampleWindowMs, setLogSink } from "../../src/log/index.ts";

const tenantKey = "lsk_Zm9vYmFyYmF6cXV4cXV1eDEyMzQ1Njc4OTBhYmNkZWY";
const password = "c2VjcmV0LXBhc3N3b3JkLXRoYXQtaXMtbG9uZy1lbm91Z2g";

describe("redact", () => {
  it("drops the password of a connection string but keeps the user and host", () => {
    const out = redact(`connect to postgres://tenant_acme:${password}@db.example:5432/tenant_acme failed`);
    expect(out).not.toContain(password);
    expect(out).toContain("postgres://tenant_acme:");
    expect(out).toContain("@db.example:5432/tenant_acme");
  });

  it("handles the postgresql scheme and every occurrence", () => {
    const out = redact(`postgresql://a:${password}@h/a and POSTGRES://b:other-secret@h/b`);
    expect(out).not.toContain(password);
    expect(out).not.toContain("other-secret");
  });

  it("drops a tenant connection string's key", () => {
    const out = redact(`postgres://acme:${tenantKey}@lessor.example/acme`);
    expect(out).not.toContain(tenantKey);
    expect(out).not.toMatch(/lsk_[A-Za-z0-9_-]{8,}/);
  });

  it("drops lsk_ keys wherever they appear", () => {
    const out = redact(`{"key":"${tenantKey}","again":"Bearer ${tenantKey}"}`);
    expect(out).not.toContain(tenantKey);
    expect(out).not.toContain(tenantKey.slice(4));
  });

  it.each([
    ["libpq form", `host=h user=u password=${password} dbname=d`],
    ["uppercase", `PASSWORD=${password}`],
    ["an environment variable", `PGPASSWORD=${password}`],
    ["JSON", `{"user":"u","password":"${password}"}`],
    ["single quotes", `password='${password}'`],
    ["a colon", `password: ${password}`],
  ])("drops password=… in %s", (_name, text) => {
    expect(redact(text)).not.toContain(password);
  });

  it("leaves text without credentials alone", () => {
    const text = 'tenant acme: pool start failed (unreachable) at generation 3, code "28P01"';
    expect(redact(text)).toBe(text);
  });
});

describe("describeFailure", () => {
  it("names the error and its code without the secret it carried", () => {
    const error = Object.assign(new Error(`could not connect to postgres://u:${password}@h/d`), {
      code: "28P01",
    });
    const out = describeFailure(error);
    expect(out).toContain("28P01");
    expect(out).not.toContain(password);
    expect(out).not.toMatch(/\n\s+at /);
  });

  it("is bounded", () => {
    expect(describeFailure(new Error("x".repeat(10_000))).length).toBeLessThanOrEqual(500);
  });
});

describe("logEvent", () => {
  afterEach(() => {
    vi.restoreAllMocks();
  });

  it("redacts credentials in every field", () => {
    const lines: string[] = [];
    vi.spyOn(console, "error").mockImplementation((line: string) => {
      lines.push(line);
    });
    logEvent("error", "boom", { url: `postgres://u:${password}@h/d`, key: tenantKey });
    expect(lines).toHaveLength(1);
    expect(lines[0]).not.toContain(password);
    expect(lines[0]).not.toContain(tenantKey);
    expect(JSON.parse(lines[0] ?? "")).toMatchObject({ level: "error", event: "boom" });
  });
});

describe("LessorError", () => {
  it("answers with the catalog's code, status and public message, never the internal one", () => {
    const error = new LessorError("invalid_credentials", { internal: `key ${tenantKey} did not match` });
    expect(error.status).toBe(401);
    expect(error.body()).toEqual({
      code: "invalid_credentials",
      message: errorCatalog.invalid_credentials.message,
    });
    expect(JSON.stringify(error.body())).not.toContain(tenantKey);
  });

  it("gives retryable refusals a Retry-After of at least one second", () => {
    expect(errorHeaders(new LessorError("tenant_draining", { retryAfterSeconds: 0.2 }))).toEqual({
      "Retry-After": "1",
    });
    expect(errorHeaders(new LessorError("tenant_starting_failed", { retryAfterSeconds: 2.1 }))).toEqual({
      "Retry-After": "3",
    });
    expect(errorHeaders(new LessorError("invalid_request"))).toEqual({});
  });

  it("crosses RPC as a wire object and comes back the same", () => {
    const error = new LessorError("lease_timeout", { retryAfterSeconds: 4, internal: "secret detail" });
    const wire = error.toWire();
    expect(wire).toEqual({
      code: "lease_timeout",
      message: errorCatalog.lease_timeout.message,
      retryAfterSeconds: 4,
    });
    const back = LessorError.fromWire(wire);
    expect(back.body()).toEqual(error.body());
    expect(back.status).toBe(503);
    expect(back.retryAfterSeconds).toBe(4);
  });

  it("has a client or server status for every catalog code", () => {
    for (const [code, spec] of Object.entries(errorCatalog)) {
      expect(code).toMatch(/^[a-z]+(_[a-z]+)*$/);
      expect(spec.status).toBeGreaterThanOrEqual(400);
      expect(spec.status).toBeLessThan(600);
    }
  });
});

describe("logEventSampled", () => {
  it("writes the first line of an event per key at once, then one a window, counting the rest", () => {
    const lines: string[] = [];
    const restore = setLogSink((_level, line) => lines.push(line));
    try {
      const t0 = 5_000_000;
      for (let i = 0; i < 50; i++) logEventSampled("warn", "flood_test", "tenant-a", { n: i }, t0 + i);
      logEventSampled("warn", "flood_test", "tenant-b", { n: 0 }, t0 + 10);
      logEventSampled("warn", "flood_test", "tenant-a", { n: 99 }, t0 + sampleWindowMs + 1);
      expect(lines.map((line) => JSON.parse(line))).toEqual([
        { level: "warn", event: "flood_test", n: 0 },
        { level: "warn", event: "flood_test", n: 0 },
        { level: "warn", event: "flood_test", n: 99, suppressed: 49 },
      ]);
    } finally {
      restore();
    }
  });
});
