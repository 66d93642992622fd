/**
 * What crosses between the edge (src/routes/wire.ts) and the objects behind the wire endpoint: the
 * tenant's object takes a connection with a `WireOpen` and answers with the connection's bounds
 * (docs/adr/017-wire-protocol.md), and the cancel registry (src/wire-cancel-object) is addressed by
 * a process id, or by a source's hash for its rate limit.
 */
import type { PoolMode } from "../core/pg-wire.ts";
import type { KeyProof } from "./tenant.ts";

/** What the edge hands the tenant's object with a wire connection (header `Lessor-Wire`). */
export interface WireOpen {
  tenantId: string;
  proof: KeyProof;
  mode: PoolMode;
  applicationName: string;
  /** The cancel key the client is given (BackendKeyData). */
  pid: number;
  secret: number;
}

/** The header that carries a `WireOpen` from the edge to the object. */
export const wireOpenHeader = "Lessor-Wire";

/** The header of the object's answer that carries the connection's bounds to the edge (core `WireBounds`). */
export const wireBoundsHeader = "Lessor-Wire-Bounds";

/** Reads a `WireOpen` from the edge's header; null if it is not one. */
export function parseWireOpen(raw: string | null): WireOpen | null {
  if (raw === null) return null;
  try {
    const value = JSON.parse(raw) as Partial<WireOpen>;
    if (
      typeof value.tenantId !== "string" ||
      typeof value.proof?.keyId !== "string" ||
      typeof value.proof.keyHash !== "string" ||
      (value.mode !== "transaction" && value.mode !== "session") ||
      typeof value.applicationName !== "string" ||
      !Number.isInteger(value.pid) ||
      !Number.isInteger(value.secret)
    ) {
      return null;
    }
    return value as WireOpen;
  } catch {
    return null;
  }
}

/** How many cancel-registry objects the process ids are spread over. */
export const cancelShards = 32;

/** How often a live connection's edge registers its cancel key again. */
export const cancelRefreshMs = 60_000;

/** The cancel-registry object a process id belongs to. */
export function cancelShardOf(pid: number): string {
  return `cancel-${(pid >>> 0) % cancelShards}`;
}

/** The cancel-registry object that counts a source's CancelRequests (an address, hashed: FNV-1a). */
export function cancelSourceShardOf(source: string): string {
  let hash = 0x811c9dc5;
  for (let i = 0; i < source.length; i++) {
    hash ^= source.charCodeAt(i);
    hash = Math.imul(hash, 0x01000193);
  }
  return `cancel-source-${(hash >>> 0) % cancelShards}`;
}
