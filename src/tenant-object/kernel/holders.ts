/**
 * The one registry of a tenant object's holders (docs/adr/026-tenant-object-kernel.md, invariant 17
 * in docs/invariants.md): every `/sql` flight, REST session lease and wire connection registers
 * here when it is admitted and leaves when it ends. Every operation that must end, refuse or wait
 * for holders (erase, move, disable, key revocation and expiry, rotation, drain, eviction) goes
 * through `apply`, which does to each holder what src/core/holders.ts decides for its kind; no
 * operation keeps a list of its own.
 */
import {
  type AccessKey,
  accessRefusal,
  type HolderEndCode,
  type HolderKind,
  type HolderOperation,
  holderOutcome,
  operationOfRefusal,
} from "../../core/holders.ts";
import { LessorError } from "../../errors/index.ts";
import { logEventSampled } from "../../log/index.ts";

/** One holder, as the registry knows it. */
export interface Holder {
  readonly kind: HolderKind;
  /** The public id of the key it was admitted with. */
  readonly keyId: string;
  /** Whether it holds a pooled connection right now. */
  leased(): boolean;
  /** Ends it with `error` (a wire connection sends it as a FATAL); ends nothing twice. */
  end(error: LessorError): void;
}

/** What one `apply` did. */
export interface Applied {
  ended: number;
  /** Holders the operation waits for (they end on their own, bounded). */
  waiting: number;
  /** Holders that keep the operation from happening now. */
  blocking: number;
}

export interface ApplyOptions {
  /** Only the holders admitted with this key (a key's revocation or expiry). */
  keyId?: string;
  /** The error a holder ends with, for a code that needs more than its catalog text (`tenant_moved`'s region). */
  errorFor?: (code: HolderEndCode) => LessorError;
}

/** The catalog's error for `code`, with a retry hint for the retryable ones. */
export function holderEndError(code: HolderEndCode): LessorError {
  switch (code) {
    case "tenant_erasing":
      return new LessorError(code, { retryAfterSeconds: 5 });
    case "tenant_moving":
    case "stale_generation":
      return new LessorError(code, { retryAfterSeconds: 1 });
    default:
      return new LessorError(code);
  }
}

export class HolderRegistry {
  private readonly live = new Set<Holder>();

  /** Called each time a holder leaves (the pool tells a waiting budget it may be idle now). */
  onLeave: () => void = () => undefined;

  /** Registers a holder; the answer unregisters it (once). */
  register(holder: Holder): () => void {
    this.live.add(holder);
    return () => {
      if (this.live.delete(holder)) this.onLeave();
    };
  }

  get size(): number {
    return this.live.size;
  }

  /** How many live holders of `kind` there are. */
  count(kind: HolderKind): number {
    let n = 0;
    for (const holder of this.live) if (holder.kind === kind) n++;
    return n;
  }

  /** The keys the live holders of `kind` were admitted with. */
  keyIds(kind?: HolderKind): Set<string> {
    const ids = new Set<string>();
    for (const holder of this.live) if (kind === undefined || holder.kind === kind) ids.add(holder.keyId);
    return ids;
  }

  /** Does to every holder (of `options.keyId`, if given) what `operation` decides for its kind. */
  apply(operation: HolderOperation, options: ApplyOptions = {}): Applied {
    const applied: Applied = { ended: 0, waiting: 0, blocking: 0 };
    for (const holder of [...this.live]) {
      if (options.keyId !== undefined && holder.keyId !== options.keyId) continue;
      this.applyTo(holder, operation, applied, options.errorFor ?? holderEndError);
    }
    return applied;
  }

  private applyTo(
    holder: Holder,
    operation: HolderOperation,
    applied: Applied,
    errorFor: (code: HolderEndCode) => LessorError,
  ): void {
    const outcome = holderOutcome(operation, holder.kind);
    switch (outcome.do) {
      case "end":
        if (outcome.leasedOnly === true && !holder.leased()) return;
        logEventSampled("warn", "holder_ended", operation, {
          kind: holder.kind,
          operation,
          code: outcome.code,
        });
        this.live.delete(holder);
        holder.end(errorFor(outcome.code));
        applied.ended++;
        return;
      case "wait":
        applied.waiting++;
        return;
      case "block":
        if (holder.leased()) applied.blocking++;
        return;
      case "keep":
        return;
    }
  }

  /**
   * Checks every holder's access against the record as the object holds it now (a key revoked or
   * expired, the tenant disabled) and applies what that refusal decides. Answers how many ended.
   */
  recheck(record: { status: string; keys: readonly AccessKey[] } | null, now: number): number {
    const applied: Applied = { ended: 0, waiting: 0, blocking: 0 };
    for (const holder of [...this.live]) {
      const refusal = accessRefusal(record, holder.keyId, now);
      if (refusal !== null) this.applyTo(holder, operationOfRefusal(refusal), applied, holderEndError);
    }
    return applied.ended;
  }

  /**
   * The earliest expiry among the keys of holders that an expiry ends (a flight is waited for, so
   * it needs no wake): when the alarm must fire so that an idle connection ends with its key.
   */
  nextExpiry(record: { keys: readonly AccessKey[] } | null): number | null {
    if (!record) return null;
    let earliest: number | null = null;
    for (const holder of this.live) {
      if (holderOutcome("key_expired", holder.kind).do !== "end") continue;
      const key = record.keys.find((k) => k.keyId === holder.keyId);
      const at = key?.expiresAt ?? null;
      if (at !== null && (earliest === null || at < earliest)) earliest = at;
    }
    return earliest;
  }
}
