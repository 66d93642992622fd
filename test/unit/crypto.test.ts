import { Client } from "@neondatabase/serverless";
import { describe, expect, it } from "vitest";
import { generateDatabasePassword, hashKey } from "../../src/crypto/keys.ts";
import { loginGuardKey, loginTokenMinter } from "../../src/crypto/login-guard.ts";
import {
  isScramVerifier,
  type ScramClientSession,
  scramClientFinal,
  scramMaxIterations,
  scramVerifier,
} from "../../src/crypto/scram.ts";
import { seal, unseal } from "../../src/crypto/seal.ts";
import {
  type KeyMacRing,
  mintTenantKey,
  parseKeyMacRing,
  verifyTenantKey,
} from "../../src/crypto/tenant-keys.ts";
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

const ring: KeyMacRing = { current: 1, keys: new Map([[1, base64(new Uint8Array(32).fill(3))]]) };
const rotated: KeyMacRing = {
  current: 2,
  keys: new Map([
    [1, base64(new Uint8Array(32).fill(3))],
    [2, base64(new Uint8Array(32).fill(9))],
  ]),
};

describe("tenant keys", () => {
  it("mints prefixed keys of 48 bytes that name their key id", async () => {
    const { key, keyId } = await mintTenantKey(ring, "acme");
    expect(key).toMatch(/^lsk_[A-Za-z0-9_-]{64}$/);
    expect(keyId).toMatch(/^k_[0-9a-f]{16}$/);
    expect(await verifyTenantKey(ring, "acme", key)).toEqual({ keyId, region: null });
  });

  it("never repeats a key, a key id or a password", async () => {
    const minted = await Promise.all(Array.from({ length: 500 }, () => mintTenantKey(ring, "acme")));
    expect(new Set(minted.map((m) => m.key)).size).toBe(500);
    expect(new Set(minted.map((m) => m.keyId)).size).toBe(500);
    const passwords = new Set(Array.from({ length: 1_000 }, generateDatabasePassword));
    expect(passwords.size).toBe(1_000);
  });

  it("refuses a key for another tenant, a forged MAC, a flipped bit, and anything not a key", async () => {
    const { key } = await mintTenantKey(ring, "acme");
    expect(await verifyTenantKey(ring, "acme2", key)).toBeNull();
    expect(await verifyTenantKey(ring, "acm", key)).toBeNull();
    const body = key.slice(4);
    for (let i = 0; i < body.length; i += 7) {
      const flipped = body.slice(0, i) + (body[i] === "A" ? "B" : "A") + body.slice(i + 1);
      expect(await verifyTenantKey(ring, "acme", `lsk_${flipped}`)).toBeNull();
    }
    for (const junk of [
      "",
      "lsk_",
      "hunter2",
      `lsk_${"A".repeat(64)}`,
      key.slice(0, -1),
      `${key}A`,
      key.toUpperCase(),
    ]) {
      expect(await verifyTenantKey(ring, "acme", junk)).toBeNull();
    }
  });

  it("keeps working across a MAC key rotation, and stops once the old key leaves the ring", async () => {
    const old = await mintTenantKey(ring, "acme");
    const fresh = await mintTenantKey(rotated, "acme");
    expect(await verifyTenantKey(rotated, "acme", old.key)).toEqual({ keyId: old.keyId, region: null });
    expect(await verifyTenantKey(rotated, "acme", fresh.key)).toEqual({ keyId: fresh.keyId, region: null });
    const retired: KeyMacRing = { current: 2, keys: new Map([[2, rotated.keys.get(2) ?? ""]]) };
    expect(await verifyTenantKey(retired, "acme", old.key)).toBeNull();
    expect(await verifyTenantKey(retired, "acme", fresh.key)).toEqual({ keyId: fresh.keyId, region: null });
  });

  it("parses LESSOR_KEY_MAC_KEYS as one key or a ring, naming the problem otherwise", () => {
    const one = base64(new Uint8Array(32).fill(1));
    expect(parseKeyMacRing(one)).toEqual({ current: 1, keys: new Map([[1, one]]) });
    expect(parseKeyMacRing(JSON.stringify({ current: 2, keys: { "1": one, "2": one } }))).toMatchObject({
      current: 2,
    });
    expect(parseKeyMacRing(undefined)).toEqual({ problem: "is not set" });
    expect(parseKeyMacRing("short")).toHaveProperty("problem");
    expect(parseKeyMacRing(JSON.stringify({ current: 3, keys: { "1": one } }))).toHaveProperty("problem");
    expect(parseKeyMacRing(JSON.stringify({ current: 1, keys: { "1": "c2hvcnQ=" } }))).toHaveProperty(
      "problem",
    );
  });
});

describe("SCRAM verifiers", () => {
  it("derives Postgres's verifier (RFC 7677's worked example: pencil, 4096 iterations)", async () => {
    const salt = Uint8Array.from(atob("W22ZaJ0SNY7soEsUEjb6gQ=="), (ch) => ch.charCodeAt(0));
    const verifier = await scramVerifier("pencil", { salt, iterations: 4096 });
    expect(verifier).toBe(
      "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU=",
    );
    expect(isScramVerifier(verifier)).toBe(true);
    expect(isScramVerifier("pencil")).toBe(false);
    expect(isScramVerifier("SCRAM-SHA-256$4096:abc$def:ghi")).toBe(false);
  });

  it("salts every verifier anew", async () => {
    expect(await scramVerifier("pw")).not.toBe(await scramVerifier("pw"));
  });
});

describe("the SCRAM client-final step (src/postgres's clients log in with it)", () => {
  /** What the Neon driver's own Client computes for the same exchange. */
  async function driversAnswer(password: string, clientNonce: string, serverFirst: string) {
    const sent: string[] = [];
    const self = {
      saslSession: { message: "SASLInitialResponse", clientNonce } as ScramClientSession,
      password,
      connection: { sendSCRAMClientFinalMessage: (response: string) => sent.push(response) },
    };
    const handler = (
      Client.prototype as unknown as { _handleAuthSASLContinue: (m: unknown) => Promise<void> }
    )._handleAuthSASLContinue;
    await handler.call(self, { data: serverFirst });
    return { session: self.saslSession, sent };
  }

  const clientNonce = "rOprNGfwEbeRWgbNEkqO";
  const serverFirst = `r=${clientNonce}%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096`;

  it("answers exactly what the driver answers, and expects the same server signature", async () => {
    const driver = await driversAnswer("pencil", clientNonce, serverFirst);
    for (const round of [1, 2]) {
      // The second time, the salted password comes from the cache.
      const ours: ScramClientSession = { message: "SASLInitialResponse", clientNonce };
      await scramClientFinal(ours, "pencil", serverFirst);
      expect(ours, `round ${round}`).toEqual(driver.session);
      expect(ours.response).toBe(driver.sent[0]);
    }
    // RFC 7677's worked example, with the driver's n=* for the user Postgres ignores.
    expect(driver.session.response).toMatch(
      /^c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj\)hNlF\$k0,p=/,
    );
  });

  it("never reuses a salted password across passwords, salts or iteration counts", async () => {
    const cases = [
      ["pencil", serverFirst],
      ["pencil2", serverFirst],
      ["pencil", serverFirst.replace("W22ZaJ0SNY7soEsUEjb6gQ==", "AAAAAAAAAAAAAAAAAAAAAA==")],
      ["pencil", serverFirst.replace("i=4096", "i=4097")],
    ] as const;
    const responses = new Set<string>();
    for (const [password, first] of cases) {
      const ours: ScramClientSession = { message: "SASLInitialResponse", clientNonce };
      await scramClientFinal(ours, password, first);
      expect(ours).toEqual((await driversAnswer(password, clientNonce, first)).session);
      responses.add(ours.response ?? "");
    }
    expect(responses.size).toBe(cases.length);
  });

  it("refuses what the driver refuses (a nonce not its own, a bad salt, no iteration count), and an absurd count", async () => {
    const refusals = [
      `r=someoneelse,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096`,
      `r=${clientNonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096`,
      `r=${clientNonce}x,s=not base64!,i=4096`,
      `r=${clientNonce}x,s=W22ZaJ0SNY7soEsUEjb6gQ==`,
      // A count no sane server asks for: the derivation would stall the object's thread (the
      // driver would take it, one awaited HMAC at a time).
      `r=${clientNonce}x,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=${scramMaxIterations + 1}`,
      `r=${clientNonce}x,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=99999999999999999999`,
      "garbage",
    ];
    for (const first of refusals) {
      const ours: ScramClientSession = { message: "SASLInitialResponse", clientNonce };
      const error = await scramClientFinal(ours, "pencil", first).then(
        () => null,
        (e: unknown) => (e as Error).message,
      );
      expect(error, first).toMatch(/^SASL: /);
      expect(ours.response).toBeUndefined();
    }
  });
});

describe("login tokens", () => {
  it("binds a token to its role, expires it, and never repeats its nonce", async () => {
    const key = await loginGuardKey("the-password");
    const mint = await loginTokenMinter("t_0123456789abcdef", key);
    const now = Date.parse("2026-11-30T00:00:00Z");
    const tokens = await Promise.all(Array.from({ length: 50 }, () => mint(now)));
    expect(new Set(tokens.map((t) => t.split(".")[0])).size).toBe(50);
    for (const token of tokens) expect(token).toMatch(/^[0-9a-f]{32}\.[0-9]+\.[0-9a-f]{64}$/);
    expect(Number(tokens[0]?.split(".")[1])).toBe(now / 1000 + 120);
    // The key depends on the password (a tenant-chosen password derives another key).
    expect(await loginGuardKey("the-password")).toEqual(key);
    expect(await loginGuardKey("another")).not.toEqual(key);
  });
});

describe("keys", () => {
  it("generates URL-safe database passwords of at least 128 bits", () => {
    const password = generateDatabasePassword();
    expect(password).toMatch(/^[A-Za-z0-9_-]+$/);
    expect(password.length * 6).toBeGreaterThanOrEqual(128);
  });

  it("hashes a key to lowercase hex SHA-256", async () => {
    expect(await hashKey("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const hash = await hashKey((await mintTenantKey(ring, "acme")).key);
    expect(hash).toMatch(/^[0-9a-f]{64}$/);
    expect(await hashKey("abd")).not.toBe(await hashKey("abc"));
  });
});
