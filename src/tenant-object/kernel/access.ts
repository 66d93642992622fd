/**
 * A holder's access, re-checked rather than remembered (docs/adr/026-tenant-object-kernel.md,
 * invariant 17): a key's validity (present in the record, not expired) and the tenant's status are
 * checked when a holder is admitted, at every lease a long-lived holder takes (each transaction of
 * a transaction-mode wire connection), whenever the record changes (`configure`), and by the alarm
 * at the earliest expiry among the holders' keys, so that an idle connection ends with its key.
 */
import { accessRefusal } from "../../core/holders.ts";
import { LessorError } from "../../errors/index.ts";
import type { TenantRuntime } from "../runtime.ts";
import type { Holder } from "./holders.ts";

/** The refusal a holder gets when its key no longer opens anything: FATAL 28000 on the wire. */
export function accessError(code: "key_revoked" | "key_expired" | "tenant_disabled"): LessorError {
  return new LessorError(code);
}

/** Throws the refusal if the key `keyId` no longer gives access to the tenant (at a lease). */
export function requireAccess(rt: TenantRuntime, keyId: string): void {
  const refusal = accessRefusal(rt.record, keyId, Date.now());
  if (refusal !== null) throw accessError(refusal);
}

/**
 * Admits a holder: its access is checked now, it joins the registry, and the alarm is armed for
 * its key's expiry. The answer unregisters it.
 */
export function admitHolder(rt: TenantRuntime, holder: Holder): () => void {
  requireAccess(rt, holder.keyId);
  const leave = rt.holders.register(holder);
  const expiry = rt.holders.nextExpiry(rt.record);
  if (expiry !== null) rt.ctx.waitUntil(rt.alarms.wakeBy(expiry).catch(() => undefined));
  return leave;
}

/**
 * Re-checks every holder against the record as it is now (after `configure`, and when the alarm
 * fires), ending those whose key was revoked or expired or whose tenant was disabled, and re-arms
 * for the next expiry. Answers how many ended.
 */
export async function recheckAccess(rt: TenantRuntime): Promise<number> {
  const ended = rt.holders.recheck(rt.record, Date.now());
  const expiry = rt.holders.nextExpiry(rt.record);
  if (expiry !== null) await rt.alarms.wakeBy(expiry);
  return ended;
}

/** Installs the holders' key expiries among the alarm's wakers. */
export function installAccess(rt: TenantRuntime): void {
  rt.alarms.register("key_expiry", () => rt.holders.nextExpiry(rt.record));
}
