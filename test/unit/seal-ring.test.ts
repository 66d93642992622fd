/**
 * The seal key ring (`LESSOR_SEAL_KEY`, issue 14): one base64 key (the `v1` format, key id `k0`)
 * or a JSON ring of named keys; values record the id of the key that sealed them (`v2.<id>.…`),
 * the id is bound into the AES-GCM associated data with the tenant id, and a value whose key left
 * the ring is a `misconfigured` error that names the key, never key material.
 */
import { describe, expect, it } from "vitest";
import { fromBase64, toBase64 } from "../../src/crypto/encoding.ts";
import {
  legacySealKeyId,
  parseSealRing,
  resealUnderCurrentKey,
  seal,
  sealKeyIdOf,
  unseal,
} from "../../src/crypto/seal.ts";
import { LessorError } from "../../src/errors/index.ts";

const keyA = toBase64(new Uint8Array(32).map((_, i) => i * 7 + 1));
const keyB = toBase64(new Uint8Array(32).map((_, i) => 255 - i));
const keyC = toBase64(new Uint8Array(32).fill(42));

function ring(current: string, keys: Record<string, string>): string {
  return JSON.stringify({ current, keys });
}

async function failure(work: Promise<unknown>): Promise<LessorError> {
  const error = await work.then(
    () => null,
    (cause: unknown) => cause,
  );
  expect(error).toBeInstanceOf(LessorError);
  if (!(error instanceof LessorError)) throw new Error("unreachable");
  expect(error.code).toBe("misconfigured");
  // The client sees only the stable public message.
  expect(error.body()).toEqual({
    code: "misconfigured",
    message: "Lessor is misconfigured; the operator has been told in the logs.",
  });
  return error;
}

/** Everything an error would show anywhere: internal message, public body, cause. */
function shown(error: LessorError): string {
  return `${error.message} ${JSON.stringify(error.body())} ${String(error.cause ?? "")}`;
}

/** A `v1` value exactly as the single-key code before the ring sealed it. */
async function sealedByV1(secret: string, tenantId: string, plaintext: string): Promise<string> {
  const key = await crypto.subtle.importKey("raw", fromBase64(secret), "AES-GCM", false, ["encrypt"]);
  const iv = crypto.getRandomValues(new Uint8Array(12));
  const ciphertext = await crypto.subtle.encrypt(
    { name: "AES-GCM", iv, additionalData: new TextEncoder().encode(tenantId) },
    key,
    new TextEncoder().encode(plaintext),
  );
  return `v1.${toBase64(iv)}.${toBase64(new Uint8Array(ciphertext))}`;
}

describe("LESSOR_SEAL_KEY parsing", () => {
  it("takes one base64 key as the ring {k0} whose seals stay v1", () => {
    expect(parseSealRing(keyA)).toEqual({ current: "k0", keys: new Map([["k0", keyA]]), legacy: true });
    expect(parseSealRing(` ${keyA}\n`)).toEqual({
      current: "k0",
      keys: new Map([["k0", keyA]]),
      legacy: true,
    });
    expect(legacySealKeyId).toBe("k0");
  });

  it("takes a JSON ring of named keys", () => {
    expect(parseSealRing(ring("k2", { k1: keyA, k2: keyB }))).toEqual({
      current: "k2",
      keys: new Map([
        ["k1", keyA],
        ["k2", keyB],
      ]),
      legacy: false,
    });
  });

  it.each([
    ["unset", undefined],
    ["empty", ""],
    ["a short key", toBase64(new Uint8Array(16))],
    ["not base64, not JSON", "this is not a key"],
    ["broken JSON holding a key", `{"current":"k1","keys":{"k1":"${keyA}"`],
    ["a JSON array", JSON.stringify([keyA])],
    ["no keys", JSON.stringify({ current: "k1" })],
    ["empty keys", ring("k1", {})],
    ["current missing", JSON.stringify({ keys: { k1: keyA } })],
    ["current not in the ring", ring("k3", { k1: keyA, k2: keyB })],
    ["a key id with a dot", ring("k.1", { "k.1": keyA })],
    ["a key id too long", ring("k1", { k1: keyA, [keyB]: keyA })],
    ["a key of 31 bytes", ring("k1", { k1: toBase64(new Uint8Array(31)) })],
    ["a key that is a number", JSON.stringify({ current: "k1", keys: { k1: 7 } })],
  ])("refuses %s, naming the problem and never a key", async (_name, secret) => {
    const parsed = parseSealRing(secret);
    expect(parsed).toHaveProperty("problem");
    const error = await failure(seal(secret ?? "", "acme", "pw"));
    expect(error.message).toMatch(/^LESSOR_SEAL_KEY/);
    for (const key of [keyA, keyB]) expect(shown(error)).not.toContain(key);
    await failure(unseal(secret ?? "", "acme", await seal(keyA, "acme", "pw")));
  });
});

describe("sealing under a ring", () => {
  it("keeps the single-key format v1: existing values open, new ones are what old code reads", async () => {
    const old = await sealedByV1(keyA, "acme", "old-password");
    expect(await unseal(keyA, "acme", old)).toBe("old-password");
    const fresh = await seal(keyA, "acme", "new-password");
    expect(fresh).toMatch(/^v1\.[A-Za-z0-9+/=]+\.[A-Za-z0-9+/=]+$/);
    expect(sealKeyIdOf(fresh)).toBe("k0");
  });

  it("opens v1 values under the ring's k0 once the single key becomes a ring", async () => {
    const old = await sealedByV1(keyA, "acme", "old-password");
    expect(await unseal(ring("k1", { k0: keyA, k1: keyB }), "acme", old)).toBe("old-password");
  });

  it("records the current key's id: v2.<id>.<iv>.<ciphertext>", async () => {
    const secret = ring("k2", { k1: keyA, k2: keyB });
    const sealed = await seal(secret, "acme", "s3cret-pässword");
    expect(sealed).toMatch(/^v2\.k2\.[A-Za-z0-9+/=]+\.[A-Za-z0-9+/=]+$/);
    expect(sealed).not.toContain("s3cret");
    expect(sealKeyIdOf(sealed)).toBe("k2");
    expect(await unseal(secret, "acme", sealed)).toBe("s3cret-pässword");
    // Under the key alone, in a ring whose current key is another one.
    expect(await unseal(ring("k3", { k2: keyB, k3: keyC }), "acme", sealed)).toBe("s3cret-pässword");
  });

  it("binds the tenant id: a value moved to another tenant does not open", async () => {
    const secret = ring("k1", { k1: keyA });
    const sealed = await seal(secret, "tenant-a", "password-of-a");
    const error = await failure(unseal(secret, "tenant-b", sealed));
    expect(shown(error)).not.toContain("password-of-a");
    expect(error.message).toContain("k1");
  });

  it("binds the key id: relabelling a value to another id of the same key material fails", async () => {
    // k1 and k2 hold the same bytes, so only the associated data can tell them apart.
    const secret = ring("k1", { k1: keyA, k2: keyA });
    const sealed = await seal(secret, "acme", "pw");
    const relabelled = sealed.replace(/^v2\.k1\./, "v2.k2.");
    expect(relabelled).not.toBe(sealed);
    await failure(unseal(secret, "acme", relabelled));
    // A v2 value turned into a v1 one (k0 holding the same bytes) fails too.
    const legacy = ring("k1", { k0: keyA, k1: keyA });
    const [, , iv, ciphertext] = sealed.split(".");
    await failure(unseal(legacy, "acme", `v1.${iv}.${ciphertext}`));
  });

  it("refuses key ids outside [A-Za-z0-9_-]{1,16} and other formats as unknown", async () => {
    const secret = ring("k1", { k1: keyA });
    const sealed = await seal(secret, "acme", "pw");
    const [, , iv, ciphertext] = sealed.split(".");
    for (const bad of [
      `v2.k!1.${iv}.${ciphertext}`,
      `v2..${iv}.${ciphertext}`,
      `v2.${"k".repeat(17)}.${iv}.${ciphertext}`,
      `v2.k1.${iv}`,
      `v3.k1.${iv}.${ciphertext}`,
      `v1.k1.${iv}.${ciphertext}`,
      "not sealed at all",
    ]) {
      const error = await failure(unseal(secret, "acme", bad));
      expect(error.message).toContain("unknown format");
      expect(sealKeyIdOf(bad)).toBeNull();
    }
  });

  it("names the key id when the value's key left the ring, and shows no key", async () => {
    const sealed = await seal(ring("k1", { k1: keyA }), "acme", "pw");
    const error = await failure(unseal(ring("k2", { k2: keyB }), "acme", sealed));
    expect(error.message).toContain("sealed with key k1, which LESSOR_SEAL_KEY no longer holds");
    for (const key of [keyA, keyB]) expect(shown(error)).not.toContain(key);

    const old = await sealedByV1(keyA, "acme", "pw");
    const legacy = await failure(unseal(ring("k2", { k2: keyB }), "acme", old));
    expect(legacy.message).toContain("sealed with key k0, which LESSOR_SEAL_KEY no longer holds");
  });

  it("reseals under the current key, and leaves a value already under it alone", async () => {
    const before = ring("k1", { k1: keyA });
    const during = ring("k2", { k1: keyA, k2: keyB });
    const after = ring("k2", { k2: keyB });
    const sealed = await seal(before, "acme", "the-password");
    const resealed = await resealUnderCurrentKey(during, "acme", sealed);
    expect(resealed).toMatch(/^v2\.k2\./);
    if (resealed === null) throw new Error("unreachable");
    expect(await unseal(after, "acme", resealed)).toBe("the-password");
    expect(await resealUnderCurrentKey(during, "acme", resealed)).toBeNull();

    // v1 values are under k0: current in the single-key form, resealed once a ring names another.
    const old = await sealedByV1(keyA, "acme", "pw");
    expect(await resealUnderCurrentKey(keyA, "acme", old)).toBeNull();
    expect(await resealUnderCurrentKey(ring("k0", { k0: keyA, k1: keyB }), "acme", old)).toBeNull();
    const moved = await resealUnderCurrentKey(ring("k1", { k0: keyA, k1: keyB }), "acme", old);
    expect(moved).toMatch(/^v2\.k1\./);
  });

  it("a reseal of a value whose key left the ring fails like an unseal: misconfigured, naming it", async () => {
    const sealed = await seal(ring("k1", { k1: keyA }), "acme", "pw");
    const error = await failure(resealUnderCurrentKey(ring("k2", { k2: keyB }), "acme", sealed));
    expect(error.message).toContain("k1");
  });
});
