/**
 * The holders of a tenant and what each operation does to them (docs/adr/026-tenant-object-kernel.md,
 * docs/invariants.md invariant 17): pure policy, no runtime.
 *
 * A holder is anything that holds a tenant's connection or keeps a tenant's client attached: a
 * `/sql` request in flight, a REST session lease, a wire connection in transaction or in session
 * mode. Every holder registers in the tenant object's one registry
 * (src/tenant-object/kernel/holders.ts), and every operation that must end, refuse or wait for
 * holders asks this table what to do with each kind. The table is typed over every kind and every
 * operation: a kind added to `holderKinds` without a row in every operation does not compile, and
 * test/integration/holders.test.ts runs every cell against a live holder.
 */
import type { ErrorCode } from "../errors/index.ts";

export const holderKinds = ["flight", "session_lease", "wire_transaction", "wire_session"] as const;
export type HolderKind = (typeof holderKinds)[number];

export const holderOperations = [
  "erase",
  "move_drain",
  "move_switch",
  "disable",
  "key_revoked",
  "key_expired",
  "rotate",
  "drain",
  "drain_forced",
  "evict",
] as const;
export type HolderOperation = (typeof holderOperations)[number];

/**
 * What an operation does to one holder:
 * - `end`: the holder is ended with `code` (a wire connection gets it as a FATAL); with `leasedOnly`,
 *   only while it holds a pooled connection (an idle transaction-mode connection stays, and meets
 *   the gate at its next transaction);
 * - `wait`: the operation waits for the holder to finish on its own (a flight is bounded by the
 *   statement timeout), within the operation's own wait;
 * - `block`: the operation does not happen while the holder holds a connection (an eviction);
 * - `keep`: the holder is not touched (a rotation: old generations finish their leases).
 */
export type HolderOutcome =
  | { do: "end"; code: HolderEndCode; leasedOnly?: boolean }
  | { do: "wait" }
  | { do: "block" }
  | { do: "keep" };

/** A flight is never cut short by the registry: it ends with its statement (bounded), or is waited for. */
type FlightOutcome = { do: "wait" } | { do: "block" } | { do: "keep" };

/** The codes holders end with. */
export type HolderEndCode = Extract<
  ErrorCode,
  | "tenant_erasing"
  | "tenant_moving"
  | "tenant_moved"
  | "tenant_disabled"
  | "key_revoked"
  | "key_expired"
  | "stale_generation"
>;

type Row = { readonly flight: FlightOutcome } & {
  readonly [K in Exclude<HolderKind, "flight">]: HolderOutcome;
};

const end = (code: HolderEndCode, leasedOnly = false): HolderOutcome =>
  leasedOnly ? { do: "end", code, leasedOnly } : { do: "end", code };
const wait = { do: "wait" } as const;
const keep = { do: "keep" } as const;
const block = { do: "block" } as const;

/**
 * Operation × holder kind. The operations that end holders run after their own bounded wait for
 * running statements (erase's and move's `LESSOR_ERASE_LEASE_WAIT_MS`); what is still held then is
 * ended as below.
 */
export const holderPolicy: { readonly [O in HolderOperation]: Row } = {
  erase: {
    flight: wait,
    session_lease: end("tenant_erasing"),
    wire_transaction: end("tenant_erasing"),
    wire_session: end("tenant_erasing"),
  },
  // At the move's drain: what holds a connection lets go; an idle transaction-mode connection
  // stays until the switch, which ends it with a FATAL its driver answers by reconnecting (to the
  // new owner).
  move_drain: {
    flight: wait,
    session_lease: end("tenant_moving"),
    wire_transaction: end("tenant_moving", true),
    wire_session: end("tenant_moving"),
  },
  move_switch: {
    flight: wait,
    session_lease: end("tenant_moved"),
    wire_transaction: end("tenant_moved"),
    wire_session: end("tenant_moved"),
  },
  disable: {
    flight: wait,
    session_lease: end("tenant_disabled"),
    wire_transaction: end("tenant_disabled"),
    wire_session: end("tenant_disabled"),
  },
  key_revoked: {
    flight: wait,
    session_lease: end("key_revoked"),
    wire_transaction: end("key_revoked"),
    wire_session: end("key_revoked"),
  },
  key_expired: {
    flight: wait,
    session_lease: end("key_expired"),
    wire_transaction: end("key_expired"),
    wire_session: end("key_expired"),
  },
  rotate: { flight: keep, session_lease: keep, wire_transaction: keep, wire_session: keep },
  drain: { flight: wait, session_lease: wait, wire_transaction: wait, wire_session: wait },
  drain_forced: {
    flight: wait,
    session_lease: end("stale_generation"),
    wire_transaction: end("stale_generation"),
    wire_session: end("stale_generation"),
  },
  evict: { flight: block, session_lease: block, wire_transaction: keep, wire_session: block },
};

/** What `operation` does to a holder of `kind`. */
export function holderOutcome(operation: HolderOperation, kind: HolderKind): HolderOutcome {
  return holderPolicy[operation][kind];
}

/** The operation an access check's refusal stands for (kernel/access.ts). */
export function operationOfRefusal(code: AccessRefusal): HolderOperation {
  switch (code) {
    case "key_revoked":
      return "key_revoked";
    case "key_expired":
      return "key_expired";
    case "tenant_disabled":
      return "disable";
  }
}

/** Why a holder's key no longer gives access (src/tenant-object/kernel/access.ts). */
export type AccessRefusal = "key_revoked" | "key_expired" | "tenant_disabled";

/** A key as the access check reads it. */
export interface AccessKey {
  keyId: string;
  expiresAt: number | null;
}

/**
 * Whether a holder that authenticated with `keyId` still has access, read from the tenant's record
 * as the object holds it now: the key must still be there and not expired, the tenant not disabled.
 * Checked when a holder is admitted, at every lease of a long-lived holder, and on every change of
 * the record; never remembered from the holder's start.
 */
export function accessRefusal(
  record: { status: string; keys: readonly AccessKey[] } | null,
  keyId: string,
  now: number,
): AccessRefusal | null {
  const key = record?.keys.find((k) => k.keyId === keyId);
  if (!record || !key) return "key_revoked";
  if (key.expiresAt !== null && now >= key.expiresAt) return "key_expired";
  if (record.status === "disabled") return "tenant_disabled";
  return null;
}
