import { describe, expect, it } from "vitest";
import {
  generationOfApplicationName,
  newTenantObjectName,
  poolApplicationName,
  tenantObjectNamePattern,
} from "../../src/core/names.ts";
import { parseTenantId } from "../../src/core/tenant-id.ts";
import { quoteIdent, quoteLiteral } from "../../src/tenant-db/host-admin.ts";

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
  it("names a tenant's database and role opaquely: nothing of the tenant id, never a cluster name", () => {
    const names = new Set<string>();
    for (let i = 0; i < 200; i++) names.add(newTenantObjectName(crypto.getRandomValues(new Uint8Array(8))));
    expect(names.size).toBe(200);
    for (const name of names) {
      expect(name).toMatch(/^t_[0-9a-f]{16}$/);
      expect(name).toMatch(tenantObjectNamePattern);
      expect(["postgres", "template0", "template1"]).not.toContain(name);
    }
  });

  it("reads a pooled connection's generation back from its application_name, and nothing else", () => {
    expect(generationOfApplicationName("t_00ff", poolApplicationName("t_00ff", 42))).toBe(42);
    expect(generationOfApplicationName("t_00ff", "lessor:t_00ff:migrate")).toBeNull();
    expect(generationOfApplicationName("t_00ff", "lessor:t_00ffee:42")).toBeNull();
    expect(generationOfApplicationName("t_00ff", "lessor:t_00ff:0")).toBeNull();
  });

  it("quotes identifiers and literals by doubling the quote character", () => {
    expect(quoteIdent("tenant_acme")).toBe('"tenant_acme"');
    expect(quoteIdent('a"b')).toBe('"a""b"');
    expect(quoteLiteral("it's")).toBe("'it''s'");
  });
});
