/**
 * The console guard's text (src/log/scrub.ts): what any code in the isolate prints reaches the
 * runtime's console without a secret of the configuration, without a stack, and without the
 * objects a dependency hangs on its warnings (docs/invariants.md invariant 19).
 */
import { describe, expect, it } from "vitest";
import {
  type ConsoleMethods,
  guardMethods,
  renderArgument,
  scrub,
  secretValues,
} from "../../src/log/scrub.ts";

const controlPlanePassword = "cp-Pa55word/with+signs";
const hostPassword = "host-admin-secret-1234";
const sealKey = "c2VhbC1rZXktMzItYnl0ZXMtbG9uZy4uLi4uLi4uLi4=";
const macKey = "bWFjLWtleS0zMi1ieXRlcy1sb25nLi4uLi4uLi4uLi4=";
const bindings = {
  LESSOR_ADMIN_KEY: "admin-key-of-the-canary",
  LESSOR_SEAL_KEY: JSON.stringify({ current: "k2", keys: { k1: sealKey, k2: `${sealKey.slice(0, -2)}Q=` } }),
  LESSOR_KEY_MAC_KEYS: macKey,
  LESSOR_CONTROL_PLANE_URL: `postgres://lessor_admin:${encodeURIComponent(controlPlanePassword)}@db.example:5432/lessor`,
  LESSOR_HOSTS: JSON.stringify({ main: `postgres://admin:${hostPassword}@host.example/postgres` }),
  LESSOR_POOL_SIZES: '{"free":2}',
};

/** A console whose methods record what they print. */
function recordingConsole(): { console: ConsoleMethods; lines: string[] } {
  const lines: string[] = [];
  const record = (...args: unknown[]) => {
    lines.push(args.map(String).join(" "));
  };
  return {
    lines,
    console: { log: record, info: record, warn: record, error: record, debug: record, trace: record },
  };
}

describe("the console guard", () => {
  it("knows every secret of the configuration: keys, key rings, and passwords inside connection strings", () => {
    const secrets = secretValues(bindings);
    for (const secret of [
      bindings.LESSOR_ADMIN_KEY,
      sealKey,
      macKey,
      controlPlanePassword,
      encodeURIComponent(controlPlanePassword),
      hostPassword,
    ]) {
      expect(secrets).toContain(secret);
    }
    // Settings that are not secrets are left alone.
    expect(secrets.some((secret) => secret.includes("free"))).toBe(false);
  });

  it("prints the driver's listener-leak warning without the client it carries (issue 39)", () => {
    const { console: fake, lines } = recordingConsole();
    guardMethods(fake, () => secretValues(bindings));
    // What the Neon driver's bundled EventEmitter does past ten listeners: the warning's `emitter`
    // is the client, connection string and all.
    const warning = Object.assign(
      new Error("Possible EventEmitter memory leak detected. 11 error listeners added."),
      {
        name: "MaxListenersExceededWarning",
        emitter: { connectionString: bindings.LESSOR_CONTROL_PLANE_URL, password: controlPlanePassword },
      },
    );
    fake.warn(warning);
    fake.error("connect failed", { config: { connectionString: bindings.LESSOR_HOSTS } });
    fake.log(
      `admin ${bindings.LESSOR_ADMIN_KEY} sealed v2.k2.AAAAAAAAAAAAAAAAAAAAAA.BBBBBBBBBBBBBBBBBBBBBBBB`,
    );
    fake.trace("here");
    expect(lines[0]).toBe(
      "MaxListenersExceededWarning: Possible EventEmitter memory leak detected. 11 error listeners added.",
    );
    const all = lines.join("\n");
    for (const secret of secretValues(bindings)) expect(all).not.toContain(secret);
    expect(all).not.toContain("v2.k2.AAAA");
    expect(all).not.toMatch(/\n\s+at /); // no stack, not even from trace
    expect(lines).toHaveLength(4);
    expect(lines[3]).toBe("here");
  });

  it("takes out what is shaped like a secret even when the configuration does not hold it", () => {
    const text = scrub(
      "postgres://t_acme:unsealed-tenant-pw@h/acme password=hunter2-hunter2 key lsk_abcdefghijklmnop",
      [],
    );
    expect(text).not.toContain("unsealed-tenant-pw");
    expect(text).not.toContain("hunter2");
    expect(text).not.toContain("lsk_abcdefghijklmnop");
    expect(text).toContain("postgres://t_acme:[redacted]@h/acme");
  });

  it("renders an error by name and message, an object on one line", () => {
    const error = new TypeError("bad");
    expect(renderArgument(error)).toBe("TypeError: bad");
    expect(renderArgument({ a: { b: { c: 1 } } })).not.toContain("\n");
  });
});
