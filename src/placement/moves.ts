/**
 * Following a tenant that moved to another region (docs/adr/023-regions.md). A key names the region
 * it was minted in; after a move, that region's object is a pointer that answers `409
 * tenant_moved` with the new region, and the Worker asks the new region's object instead, and
 * remembers the move in this isolate so the next request goes there at once. No control plane is
 * read to follow a move: only the objects, which are where the truth of ownership lives.
 */

import { loadConfig } from "../config/index.ts";
import { maxMoveHops } from "../core/move.ts";
import type { WireError } from "../errors/index.ts";
import type { KeyProof } from "../rpc/tenant.ts";
import { tenantObject } from "./index.ts";

/** `<tenant>@<region>` → the region it moved to, as this isolate last heard. Bounded. */
const movedTo = new Map<string, string>();
const movedToLimit = 10_000;

/** The region a key naming `region` should be taken to, after the moves this isolate heard of. */
export function followMoves(tenantId: string, region: string): string {
  let current = region;
  for (let hop = 0; hop < maxMoveHops; hop++) {
    const next = movedTo.get(`${tenantId}@${current}`);
    if (next === undefined || next === region) return current;
    current = next;
  }
  return current;
}

/** Remembers that `tenantId` moved from `from` to `to` (and forgets that it left `to`, if it came back). */
export function noteMove(tenantId: string, from: string, to: string): void {
  if (movedTo.size >= movedToLimit) movedTo.clear();
  movedTo.set(`${tenantId}@${from}`, to);
  movedTo.delete(`${tenantId}@${to}`);
}

/** The region an object's answer says the tenant moved to, or null if it does not say so. */
export function movedRegionOf(answer: { ok: boolean } & ({ error?: WireError } | object)): string | null {
  if (answer.ok || !("error" in answer) || answer.error === undefined) return null;
  return answer.error.code === "tenant_moved" ? (answer.error.details?.region ?? null) : null;
}

/**
 * Calls the tenant's owner: the object of the region the key names, or of the region the tenant
 * moved to since, hop by hop (at most `maxMoveHops`). `call` gets the proof with the region it is
 * asked in; the answer comes back with the proof it was given (its `region` is the owner's).
 */
export async function callOwner<T extends { ok: boolean }>(
  env: Env,
  tenantId: string,
  proof: KeyProof,
  call: (object: ReturnType<typeof tenantObject>, proof: KeyProof) => Promise<T>,
): Promise<{ answer: T; proof: KeyProof }> {
  const config = loadConfig(env);
  let current: KeyProof = { ...proof, region: followMoves(tenantId, proof.region) };
  for (let hop = 0; ; hop++) {
    const answer = await call(tenantObject(env, current.region, tenantId), current);
    const to = movedRegionOf(answer);
    if (to === null || hop >= maxMoveHops || !config.regions.has(to)) return { answer, proof: current };
    noteMove(tenantId, current.region, to);
    current = { ...current, region: to };
  }
}
