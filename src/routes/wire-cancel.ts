/**
 * CancelRequests at the edge (docs/adr/017-wire-protocol.md, "Bounds"). A cancel key is minted by
 * the edge for each wire connection: a random process id, and a secret that is a MAC of it under the
 * deployment's key MAC ring (`LESSOR_KEY_MAC_KEYS`, with a label of its own). So a CancelRequest
 * whose key Lessor did not mint fails here, in microseconds, and costs no object, no storage and no
 * connection; one that passes is counted per source and per target by the cancel registry
 * (src/wire-cancel-object) before it reaches the tenant's object, which checks the secret again
 * against the connection it names.
 */
import { loadConfig } from "../config/index.ts";
import { parseTenantObjectName } from "../core/placement.ts";
import { fromBase64 } from "../crypto/encoding.ts";
import type { KeyMacRing } from "../crypto/tenant-keys.ts";
import { describeFailure } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { tenantObject } from "../placement/index.ts";
import { cancelShardOf, cancelSourceShardOf } from "../rpc/wire.ts";

const imported = new Map<string, Promise<CryptoKey>>();

function macKey(secret: string): Promise<CryptoKey> {
  let key = imported.get(secret);
  if (!key) {
    key = crypto.subtle.importKey("raw", fromBase64(secret), { name: "HMAC", hash: "SHA-256" }, false, [
      "sign",
    ]);
    imported.set(secret, key);
  }
  return key;
}

async function secretOf(secret: string, pid: number): Promise<number> {
  const mac = await crypto.subtle.sign(
    "HMAC",
    await macKey(secret),
    new TextEncoder().encode(`lessor-wire-cancel|${pid}`),
  );
  return new DataView(mac).getInt32(0);
}

/** A new cancel key: a process id (positive, never 0: drivers take 0 for "no key") and its MAC. */
export async function mintCancelKey(ring: KeyMacRing): Promise<{ pid: number; secret: number }> {
  const key = ring.keys.get(ring.current);
  if (key === undefined) throw new Error("the current MAC key is not in the ring");
  const [random = 1] = crypto.getRandomValues(new Uint32Array(1));
  const pid = random & 0x7fffffff || 1;
  return { pid, secret: await secretOf(key, pid) };
}

/** Whether Lessor minted the cancel key (`pid`, `secret`) under a MAC key still in the ring. */
export async function cancelKeyMinted(ring: KeyMacRing, pid: number, secret: number): Promise<boolean> {
  let matches = 0;
  for (const key of ring.keys.values()) matches |= ((await secretOf(key, pid)) ^ secret) === 0 ? 1 : 0;
  return matches === 1 && pid > 0;
}

/** What became of a CancelRequest. */
export type CancelOutcome = "sent" | "not_running" | "unknown" | "forged" | "limited";

/**
 * Routes a CancelRequest to the tenant whose connection its key names; best effort, as Postgres's
 * own. `source` is where it came from (the client's address).
 */
export async function routeCancel(
  env: Env,
  source: string,
  pid: number,
  secret: number,
): Promise<CancelOutcome> {
  const config = loadConfig(env);
  if (!(await cancelKeyMinted(config.keyMacRing, pid, secret))) return "forged";
  try {
    if (!(await env.WIRE_CANCELS.getByName(cancelSourceShardOf(source)).admitSource(source))) {
      return "limited";
    }
    const target = await env.WIRE_CANCELS.getByName(cancelShardOf(pid)).lookupForCancel(pid);
    if (target === null) return "unknown";
    if ("limited" in target) return "limited";
    // The registry holds the object's name (`<tenant>@<region>` outside the default region).
    const named = parseTenantObjectName(target.tenantId);
    const region = named.region ?? config.defaultRegion;
    return (await tenantObject(env, region, named.tenantId).cancelWire(pid, secret)) ? "sent" : "not_running";
  } catch (error) {
    logEvent("warn", "wire_cancel_failed", { failure: describeFailure(error) });
    return "unknown";
  }
}
