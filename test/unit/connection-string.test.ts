import { describe, expect, it } from "vitest";
import { parseSqlConnectionString } from "../../src/core/connection-string.ts";

const key = "lsk_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";

describe("parseSqlConnectionString", () => {
  it("reads the tenant and the key", () => {
    expect(parseSqlConnectionString(`postgres://acme:${key}@lessor.example/acme`)).toEqual({
      tenantId: "acme",
      key,
    });
  });

  it("accepts the postgresql scheme, a port, and the query the Neon driver appends", () => {
    const header = `postgresql://acme-2:${key}@lessor.example:8787/acme-2?application_name=pkg%3Anpm%2Fx&sslmode=require`;
    expect(parseSqlConnectionString(header)).toEqual({ tenantId: "acme-2", key });
  });

  it("percent-decodes the key", () => {
    expect(parseSqlConnectionString("postgres://acme:a%2Fb%40c@h/acme")).toEqual({
      tenantId: "acme",
      key: "a/b@c",
    });
  });

  it.each([
    ["null", null],
    ["undefined", undefined],
    ["empty", ""],
  ])("reports a %s header as missing", (_name, header) => {
    expect(parseSqlConnectionString(header)).toBe("missing");
  });

  it("reports a user and a database that name different tenants as a mismatch", () => {
    expect(parseSqlConnectionString(`postgres://acme:${key}@h/other`)).toBe("mismatch");
  });

  it.each([
    ["no key", "postgres://acme@h/acme"],
    ["an empty key", "postgres://acme:@h/acme"],
    ["bad percent-encoding in the key", "postgres://acme:%zz@h/acme"],
    ["bad percent-encoding in the user", `postgres://ac%E0me:${key}@h/acme`],
    ["an http scheme", `http://acme:${key}@h/acme`],
    ["a mysql scheme", `mysql://acme:${key}@h/acme`],
    ["no scheme", `acme:${key}@h/acme`],
    ["a scheme not at the start", ` postgres://acme:${key}@h/acme`],
    ["no host", `postgres://acme:${key}@/acme`],
  ])("calls a connection string with %s malformed", (_name, header) => {
    expect(parseSqlConnectionString(header)).toBe("malformed");
  });

  it.each([
    ["an empty database", `postgres://acme:${key}@h/`],
    ["no database path at all", `postgres://acme:${key}@h`],
  ])("refuses a connection string with %s", (_name, header) => {
    expect(["malformed", "invalid_tenant_id"]).toContain(parseSqlConnectionString(header));
  });

  it.each([
    ["uppercase", `postgres://ACME:${key}@h/ACME`],
    ["a leading hyphen", `postgres://-acme:${key}@h/-acme`],
    ["41 characters", `postgres://${"a".repeat(41)}:${key}@h/${"a".repeat(41)}`],
    ["path traversal in the user", `postgres://..%2Facme:${key}@h/..%2Facme`],
    ["a unicode user", `postgres://acm%C3%A9:${key}@h/acm%C3%A9`],
    ["a valid user but an invalid database", `postgres://acme:${key}@h/Acme`],
    ["a nested database path", `postgres://acme:${key}@h/acme/acme`],
  ])("calls a tenant id with %s invalid", (_name, header) => {
    expect(parseSqlConnectionString(header)).toBe("invalid_tenant_id");
  });
});
