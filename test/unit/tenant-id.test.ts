import { describe, expect, it } from "vitest";
import { parseTenantId, quoteIdent, quoteLiteral, tenantDatabaseName } from "../../src/core/tenant-id.ts";

describe("parseTenantId", () => {
  it.each([
    "a",
    "7",
    "acme",
    "acme-corp",
    "a-b-c-1-2-3",
    "a--b",
    "0day",
    "a".repeat(40),
    `a${"-".repeat(38)}z`,
  ])("accepts the slug %j", (raw) => {
    expect(parseTenantId(raw)).toBe(raw);
  });

  it.each([
    ["empty", ""],
    ["41 characters", "a".repeat(41)],
    ["leading hyphen", "-acme"],
    ["trailing hyphen", "acme-"],
    ["only a hyphen", "-"],
    ["uppercase", "Acme"],
    ["all uppercase", "ACME"],
    ["underscore", "acme_corp"],
    ["dot", "acme.corp"],
    ["space", "acme corp"],
    ["surrounding whitespace", " acme "],
    ["trailing newline", "acme\n"],
    ["path traversal", "../acme"],
    ["parent directory", ".."],
    ["slash", "acme/other"],
    ["percent-encoding", "acme%2f"],
    ["unicode letter", "acmé"],
    ["unicode digit", "acme١"],
    ["cyrillic look-alike", "аcme"],
    ["zero-width space", "ac\u200bme"],
    ["NUL byte", "acme\u0000"],
    ["quote", 'acme"'],
    ["semicolon", "acme;drop"],
  ])("rejects %s", (_name, raw) => {
    expect(parseTenantId(raw)).toBeNull();
  });

  it.each([
    ["a number", 42],
    ["null", null],
    ["undefined", undefined],
    ["an object", { id: "acme" }],
    ["an array", ["acme"]],
  ])("rejects %s", (_name, raw) => {
    expect(parseTenantId(raw)).toBeNull();
  });
});

describe("tenant database naming", () => {
  it("prefixes the database name so a tenant cannot be named like a cluster database", () => {
    const id = parseTenantId("postgres");
    expect(id).not.toBeNull();
    if (id) expect(tenantDatabaseName(id)).toBe("tenant_postgres");
  });

  it("quotes identifiers and literals by doubling the quote character", () => {
    expect(quoteIdent("tenant_acme")).toBe('"tenant_acme"');
    expect(quoteIdent('a"b')).toBe('"a""b"');
    expect(quoteLiteral("it's")).toBe("'it''s'");
  });
});
