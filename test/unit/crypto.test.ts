import { describe, expect, it } from "vitest";
import { generateDatabasePassword, generateTenantKey, hashKey } from "../../src/crypto/keys.ts";
import { seal, unseal } from "../../src/crypto/seal.ts";
import { LessorError } from "../../src/errors/index.ts";

function base64(bytes: Uint8Array): string {
  return btoa(String.fromCharCode(...bytes));
}

const sealKey = base64(new Uint8Array(32).map((_, i) => i * 7 + 1));
const otherSealKey = base64(new Uint8Array(32).map((_, i) => 255 - i));

async function misconfigured(work: Promise<unknown>): Promise<LessorError> {
  const error = await work.then(
    () => null,
    (cause: unknown) => cause,
  );
  expect(error).toBeInstanceOf(LessorError);
  if (!(error instanceof LessorError)) throw new Error("unreachable");
  expect(error.code).toBe("misconfigured");
  return error;
}

describe("seal", () => {
  it("round-trips a password for its tenant", async () => {
    const sealed = await seal(sealKey, "acme", "s3cret-pässword");
    expect(await unseal(sealKey, "acme", sealed)).toBe("s3cret-pässword");
  });

  it("never contains the plaintext and uses a fresh IV each time", async () => {
    const a = await seal(sealKey, "acme", "plaintext-password");
    const b = await seal(sealKey, "acme", "plaintext-password");
    expect(a).not.toContain("plaintext-password");
    expect(a).toMatch(/^v1\.[A-Za-z0-9+/=]+\.[A-Za-z0-9+/=]+$/);
    expect(a).not.toBe(b);
    expect(a.split(".")[1]).not.toBe(b.split(".")[1]);
  });

  it("does not open for another tenant", async () => {
    const sealed = await seal(sealKey, "tenant-a", "password-of-a");
    const error = await misconfigured(unseal(sealKey, "tenant-b", sealed));
    expect(error.message).not.toContain("password-of-a");
  });

  it("does not open under another key", async () => {
    const sealed = await seal(sealKey, "acme", "pw");
    await misconfigured(unseal(otherSealKey, "acme", sealed));
  });

  it("does not open once the ciphertext is altered", async () => {
    const sealed = await seal(sealKey, "acme", "a password long enough to flip bits in");
    const [version, iv, ciphertext] = sealed.split(".");
    if (!version || !iv || !ciphertext) throw new Error("unexpected format");
    const bytes = Uint8Array.from(atob(ciphertext), (c) => c.charCodeAt(0));
    bytes[0] = (bytes[0] ?? 0) ^ 0x01;
    await misconfigured(unseal(sealKey, "acme", `${version}.${iv}.${base64(bytes)}`));

    const ivBytes = Uint8Array.from(atob(iv), (c) => c.charCodeAt(0));
    ivBytes[0] = (ivBytes[0] ?? 0) ^ 0x80;
    await misconfigured(unseal(sealKey, "acme", `${version}.${base64(ivBytes)}.${ciphertext}`));
  });

  it("refuses an unknown format", async () => {
    await misconfigured(unseal(sealKey, "acme", "v2.aaaa.bbbb"));
    await misconfigured(unseal(sealKey, "acme", "not sealed at all"));
  });

  it.each([
    ["16 bytes", base64(new Uint8Array(16))],
    ["31 bytes", base64(new Uint8Array(31))],
    ["33 bytes", base64(new Uint8Array(33))],
    ["empty", ""],
    ["not base64", "this is not base64!!"],
  ])("calls a seal key of %s misconfigured", async (_name, badKey) => {
    await misconfigured(seal(badKey, "acme", "pw"));
    await misconfigured(unseal(badKey, "acme", "v1.AAAAAAAAAAAAAAAA.AAAA"));
  });
});

describe("keys", () => {
  it("generates prefixed tenant keys of at least 128 bits", () => {
    const key = generateTenantKey();
    expect(key).toMatch(/^lsk_[A-Za-z0-9_-]+$/);
    // base64url carries 6 bits a character.
    expect((key.length - "lsk_".length) * 6).toBeGreaterThanOrEqual(128);
  });

  it("never repeats a key or a password", () => {
    const keys = new Set(Array.from({ length: 1_000 }, generateTenantKey));
    expect(keys.size).toBe(1_000);
    const passwords = new Set(Array.from({ length: 1_000 }, generateDatabasePassword));
    expect(passwords.size).toBe(1_000);
  });

  it("spreads keys over the whole alphabet (not a counter or a timestamp)", () => {
    const bodies = Array.from({ length: 200 }, () => generateTenantKey().slice(4));
    const characters = new Set(bodies.join(""));
    expect(characters.size).toBeGreaterThan(60);
    const firstCharacters = new Set(bodies.map((body) => body[0]));
    expect(firstCharacters.size).toBeGreaterThan(20);
  });

  it("generates URL-safe database passwords of at least 128 bits", () => {
    const password = generateDatabasePassword();
    expect(password).toMatch(/^[A-Za-z0-9_-]+$/);
    expect(password.length * 6).toBeGreaterThanOrEqual(128);
  });

  it("hashes a key to lowercase hex SHA-256", async () => {
    expect(await hashKey("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const hash = await hashKey(generateTenantKey());
    expect(hash).toMatch(/^[0-9a-f]{64}$/);
    expect(await hashKey("abd")).not.toBe(await hashKey("abc"));
  });
});
