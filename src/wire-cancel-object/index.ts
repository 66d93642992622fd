/**
 * WireCancelObject: where a wire connection's cancel key leads. A CancelRequest arrives on a
 * connection of its own carrying only the key Lessor gave the client (BackendKeyData: a process id
 * and a secret) — no user, no tenant. The edge registers each authenticated wire connection's
 * process id here, in one of `cancelShards` objects chosen by the id; a CancelRequest looks its
 * tenant up, and that tenant's object checks the secret (docs/adr/017-wire-protocol.md).
 *
 * The same class, under the names `cancelSourceShardOf`, counts CancelRequests per source; the
 * shard of a process id counts them per target. Past either limit (src/core/cancel-limits.ts) a
 * cancel goes no further. A key Lessor did not mint never gets here: its MAC fails at the edge.
 *
 * Memory only: a shard that restarts forgets its entries until their connections re-register
 * (the edge does so every `cancelRefreshMs`), and a cancel in that window does nothing, which
 * Postgres allows of any cancel. Nothing here is a secret: a process id alone cancels nothing.
 */
import { DurableObject } from "cloudflare:workers";
import { cancelLimits, WindowCounter } from "../core/cancel-limits.ts";
import { cancelRefreshMs } from "../rpc/wire.ts";

/** An entry older than this with no refresh is forgotten (its connection's edge is gone). */
const entryLifetimeMs = 3 * cancelRefreshMs;

/** What a cancel's lookup found: the tenant's object to ask, none, or a limit passed. */
export type CancelTarget = { tenantId: string } | { limited: true } | null;

export class WireCancelObject extends DurableObject<Env> {
  private readonly entries = new Map<number, { tenantId: string; at: number }>();
  private readonly perTarget = new WindowCounter(
    cancelLimits.perTarget,
    cancelLimits.windowMs,
    cancelLimits.maxKeys,
  );
  private readonly perSource = new WindowCounter(
    cancelLimits.perSource,
    cancelLimits.windowMs,
    cancelLimits.maxKeys,
  );

  /** Records (or refreshes) which tenant the connection with process id `pid` belongs to. */
  async register(pid: number, tenantId: string): Promise<void> {
    const now = Date.now();
    this.entries.set(pid, { tenantId, at: now });
    if (this.entries.size % 1024 === 0) this.trim(now);
  }

  /** Forgets a closed connection's entry (only if it is still that tenant's). */
  async unregister(pid: number, tenantId: string): Promise<void> {
    if (this.entries.get(pid)?.tenantId === tenantId) this.entries.delete(pid);
  }

  /** The tenant whose connection has process id `pid`, if one is registered. */
  async lookup(pid: number): Promise<string | null> {
    const entry = this.entries.get(pid);
    if (!entry || Date.now() - entry.at > entryLifetimeMs) return null;
    return entry.tenantId;
  }

  /**
   * A CancelRequest for `pid`: its tenant if one is registered and the connection has not had its
   * share of cancels in this window. An unknown pid is not counted (it costs no lookup downstream).
   */
  async lookupForCancel(pid: number): Promise<CancelTarget> {
    const tenantId = await this.lookup(pid);
    if (tenantId === null) return null;
    if (!this.perTarget.admit(String(pid), Date.now())) return { limited: true };
    return { tenantId };
  }

  /** Counts a CancelRequest from `source`; false past its limit. */
  async admitSource(source: string): Promise<boolean> {
    return this.perSource.admit(source, Date.now());
  }

  private trim(now: number): void {
    for (const [pid, entry] of this.entries) {
      if (now - entry.at > entryLifetimeMs) this.entries.delete(pid);
    }
  }
}
