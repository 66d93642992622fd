/**
 * lessor/client: reading Lessor's answers into typed errors, defensively (no JSON, no Retry-After,
 * an HTTP-date Retry-After), and telling Postgres errors from Lessor's own.
 */
import { describe, expect, it } from "vitest";
import { parseConnectionString } from "../../src/client/client.ts";
import {
  isPostgresError,
  LessorResponseError,
  parseRetryAfter,
  readErrorAnswer,
} from "../../src/client/errors.ts";

const now = Date.parse("2026-11-30T12:00:00Z");

function answer(status: number, body: string, headers: Record<string, string> = {}): Response {
  return new Response(body, { status, headers });
}

describe("parseRetryAfter", () => {
  it.each([
    ["delta-seconds", "3", 3],
    ["zero", "0", 0],
    ["padded", " 2 ", 2],
    ["an HTTP date 5 s ahead", "Mon, 30 Nov 2026 12:00:05 GMT", 5],
    ["an HTTP date in the past", "Mon, 30 Nov 2026 11:59:00 GMT", 0],
  ])("reads %s", (_name, header, seconds) => {
    expect(parseRetryAfter(header, now)).toBe(seconds);
  });

  it.each([
    ["absent", null],
    ["empty", ""],
    ["negative", "-1"],
    ["fractional", "1.5"],
    ["words", "soon"],
  ])("ignores %s", (_name, header) => {
    expect(parseRetryAfter(header, now)).toBeUndefined();
  });
});

describe("readErrorAnswer", () => {
  it("reads Lessor's {code, message} and Retry-After", async () => {
    const read = await readErrorAnswer(
      answer(503, JSON.stringify({ code: "tenant_draining", message: "The pool is draining." }), {
        "Retry-After": "1",
      }),
      now,
    );
    expect(read).toMatchObject({
      status: 503,
      code: "tenant_draining",
      message: "The pool is draining.",
      retryAfter: 1,
    });
    expect(isPostgresError(read)).toBe(false);
  });

  it("names a body that is not Lessor's JSON unexpected_response, with a short excerpt", async () => {
    const html = `<html><body>${"Bad gateway ".repeat(100)}</body></html>`;
    const read = await readErrorAnswer(answer(502, html), now);
    expect(read.code).toBe("unexpected_response");
    expect(read.message).toMatch(/^Lessor answered HTTP 502: <html><body>Bad gateway/);
    expect(read.message.length).toBeLessThan(260);
    expect(read.retryAfter).toBeUndefined();
  });

  it("survives an empty body, a JSON array and a code that is not a string", async () => {
    expect(await readErrorAnswer(answer(500, ""), now)).toMatchObject({
      code: "unexpected_response",
      message: "Lessor answered HTTP 500",
    });
    expect((await readErrorAnswer(answer(500, "[1,2]"), now)).code).toBe("unexpected_response");
    expect((await readErrorAnswer(answer(409, '{"code": 7, "message": "x"}'), now)).code).toBe(
      "unexpected_response",
    );
  });

  it("tells a Postgres error (a SQLSTATE in a 400) from Lessor's own 400s", async () => {
    const unique = await readErrorAnswer(answer(400, JSON.stringify({ code: "23505", message: "dup" })), now);
    const auth = await readErrorAnswer(
      answer(
        400,
        JSON.stringify({ code: "28P01", message: "password authentication failed for user 'acme'" }),
      ),
      now,
    );
    const timeout = await readErrorAnswer(
      answer(400, JSON.stringify({ code: "statement_timeout", message: "stopped" })),
      now,
    );
    const tooLarge = await readErrorAnswer(answer(507, JSON.stringify({ code: "response_too_large" })), now);
    expect(isPostgresError(unique)).toBe(true);
    expect(isPostgresError(auth)).toBe(true);
    expect(isPostgresError(timeout)).toBe(false);
    expect(isPostgresError(tooLarge)).toBe(false);
  });
});

describe("LessorResponseError", () => {
  it("carries code, status, retryAfter, attempts and Lessor's message", () => {
    const error = new LessorResponseError(
      { status: 503, code: "capacity_saturated", message: "The budget is full.", retryAfter: 1 },
      3,
    );
    expect(error).toBeInstanceOf(Error);
    expect(error).toMatchObject({
      name: "LessorResponseError",
      code: "capacity_saturated",
      status: 503,
      retryAfter: 1,
      attempts: 3,
      message: "The budget is full.",
    });
  });
});

describe("parseConnectionString", () => {
  it("reads tenant, key and host:port", () => {
    expect(parseConnectionString("postgres://acme:lsk_abc@127.0.0.1:8787/acme")).toEqual({
      tenantId: "acme",
      key: "lsk_abc",
      host: "127.0.0.1:8787",
    });
    expect(parseConnectionString("postgresql://acme:lsk_abc@lessor.example.com/acme").host).toBe(
      "lessor.example.com",
    );
  });

  it.each([
    ["another scheme", "mysql://acme:lsk_secret1@h/acme"],
    ["no key", "postgres://acme@h/acme"],
    ["no host", "postgres://acme:lsk_secret1@/acme"],
    ["a broken escape", "postgres://acme:lsk_secret1%zz@h/acme"],
  ])("refuses %s without repeating the key", (_name, connectionString) => {
    expect(() => parseConnectionString(connectionString)).toThrow(
      /postgres:\/\/<tenant>:<tenant key>@<host>/,
    );
    try {
      parseConnectionString(connectionString);
    } catch (error) {
      expect(String(error)).not.toContain("secret1");
    }
  });
});
