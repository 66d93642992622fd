/**
 * Who the object serves: the tenant record (installed by provisioning and operator actions, or
 * read from the catalog on first use) and the check of a caller's key hash against it.
 */
import { loadTenantRecord, tierPoolSize, withControlPlane } from "../control-plane/index.ts";
import { hashesEqual } from "../crypto/keys.ts";
import { erasuresOf } from "../erase/store.ts";
import { LessorError } from "../errors/index.ts";
import type { KeyProof, KeyScope, TenantRecord } from "../rpc/tenant.ts";
import type { TenantRuntime } from "./runtime.ts";

/** Compared against when no key matches, so that path costs what a wrong key costs. */
const unknownKeyHash = "0".repeat(64);

/** How long an unknown tenant is remembered as unknown, so probes do not hammer the control plane. */
const negativeCacheMs = 5_000;

/** How long the ids of erased keys are remembered before the control plane is asked again. */
const erasedKeysCacheMs = 60_000;

/**
 * What a request is for: new work (a `/sql` request, a new lease, a key route), or a statement or
 * release on a session lease that was open before an erase closed the gate (allowed to finish,
 * until the erase's `leases` stage ends it).
 */
export type AuthPurpose = "new" | "lease";

interface ErasedKey {
  state: "erasing" | "erased";
  erasedAt: number | null;
}

export class TenantAuth {
  private unknownUntil = 0;
  /** Ids of keys of this tenant id's erased (or erasing) incarnations, and when they were read. */
  private erasedKeys: { readAt: number; byId: Map<string, ErasedKey> } | null = null;

  constructor(private readonly rt: TenantRuntime) {}

  /**
   * Installs or replaces the catalog record; the tenant exists, so its storage may be created.
   * Ignored while an erase runs (a late refresh must not bring keys back); after an erase it is a
   * new tenant with the same id, and the object serves it.
   */
  async install(catalogRecord: TenantRecord): Promise<void> {
    if (this.rt.erasing) return;
    if (this.rt.erase?.state === "erased") this.rt.erase = null;
    await this.rt.storage.open();
    // A migration the catalog has not heard of yet (a control-plane blip): the database's version wins.
    const pending = this.rt.storage.read("pendingCatalogSchemaVersion");
    const record =
      pending !== null && pending > catalogRecord.schemaVersion
        ? { ...catalogRecord, schemaVersion: pending }
        : catalogRecord;
    this.rt.record = record;
    this.unknownUntil = 0;
    this.rt.storage.write("record", record);
  }

  /**
   * Loads the record storage kept (at the object's start), with its tier's pool size as the
   * deployment configures it now: the stored one is the tier's when the record was kept, and a
   * deploy may have changed the tier since.
   */
  restoreRecord(): void {
    const stored = this.rt.storage.read("record");
    this.rt.record = stored;
    // Read after the record is in place: a test's settings for this tenant key on its id.
    if (stored) this.rt.record = { ...stored, poolSize: tierPoolSize(this.rt.config, stored.tier) };
  }

  /** The record, from memory or (once) from the catalog; null for a tenant that does not exist. */
  async resolve(tenantId: string): Promise<TenantRecord | null> {
    if (this.rt.record) return this.rt.record;
    if (Date.now() < this.unknownUntil) return null;
    const record = await withControlPlane(this.rt.config, this.rt.env, this.rt.region, (db) =>
      loadTenantRecord(db, this.rt.config, tenantId),
    );
    if (!record) {
      this.unknownUntil = Date.now() + negativeCacheMs;
      return null;
    }
    await this.install(record);
    return record;
  }

  /**
   * The record, if `proof` names one of the tenant's usable keys and carries its hash. A revoked,
   * expired or unknown key and an unknown tenant are indistinguishable to the caller; a disabled
   * tenant is refused only after the key checks out. An end-user key (scope `jwt`) opens only what
   * asks for it (`/sql`, with a token: `authenticateAny`); everywhere else it is refused.
   */
  async authenticate(tenantId: string, proof: KeyProof, purpose: AuthPurpose = "new"): Promise<TenantRecord> {
    const { record, scope } = await this.authenticateAny(tenantId, proof, purpose);
    if (scope !== "full") throw new LessorError("key_scope_refused");
    return record;
  }

  /**
   * As `authenticate`, for a route that serves end-user keys too: says which scope the key has.
   *
   * An erase changes two answers, and only for keys this tenant id really had (the Worker checked
   * the key's MAC, so no forged key gets here): while the erase runs, new work gets `503
   * tenant_erasing` (a statement on a lease opened before still runs, until the erase ends the
   * lease); once it committed, a key of the erased tenant gets `410 tenant_erased`, also after the
   * id was created again.
   */
  async authenticateAny(
    tenantId: string,
    proof: KeyProof,
    purpose: AuthPurpose = "new",
  ): Promise<{ record: TenantRecord; scope: KeyScope }> {
    const gate = this.rt.erase?.tenantId === tenantId && this.rt.erasing ? this.rt.erase : null;
    // While erasing, the catalog holds nothing to load: what the object still has is all there is.
    const record = gate ? this.rt.record : await this.resolve(tenantId);
    const key = record?.tenantId === tenantId ? record.keys.find((k) => k.keyId === proof.keyId) : undefined;
    // The hash is compared whatever happened before, so a known key id answers no faster.
    const matches = hashesEqual(key?.hash ?? unknownKeyHash, proof.keyHash);
    const valid =
      record !== null &&
      key !== undefined &&
      matches &&
      (key.expiresAt === null || Date.now() < key.expiresAt);
    if (gate) {
      // A record installed before keys had scopes has none: those keys are full keys.
      if (valid && purpose === "lease") return { record, scope: key.scope ?? "full" };
      if (valid || gate.keyIds.includes(proof.keyId)) {
        throw new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
      }
      throw new LessorError("invalid_credentials");
    }
    if (!valid) {
      throw (await this.erasedKeyRefusal(tenantId, proof.keyId)) ?? new LessorError("invalid_credentials");
    }
    if (record.status === "disabled") throw new LessorError("tenant_disabled");
    this.rt.noteKeyUse(key.keyId);
    return { record, scope: key.scope ?? "full" };
  }

  /** Remembers the keys of an incarnation this object just erased. */
  rememberErased(keyIds: readonly string[], erasedAt: number): void {
    const byId = this.erasedKeys?.byId ?? new Map<string, ErasedKey>();
    for (const keyId of keyIds) byId.set(keyId, { state: "erased", erasedAt });
    this.erasedKeys = { readAt: this.erasedKeys?.readAt ?? Date.now(), byId };
  }

  /**
   * Why a key this object does not accept is refused, if it is a key of an erased (or erasing)
   * incarnation of this tenant id: `tenant_erased` with `erasedAt`, or `tenant_erasing`. Null for
   * any other key. Asks the control plane at most once a minute (only for keys with a valid MAC); if
   * it cannot be reached, the answer is the plain refusal.
   */
  private async erasedKeyRefusal(tenantId: string, keyId: string): Promise<LessorError | null> {
    const cached = this.erasedKeys;
    if (!cached || Date.now() - cached.readAt > erasedKeysCacheMs) {
      try {
        const rows = await withControlPlane(this.rt.config, this.rt.env, this.rt.region, (db) =>
          erasuresOf(db, tenantId),
        );
        const byId = new Map<string, ErasedKey>();
        for (const row of rows) {
          for (const id of row.keyIds) {
            byId.set(id, { state: row.state, erasedAt: row.erasedAt?.getTime() ?? null });
          }
        }
        this.erasedKeys = { readAt: Date.now(), byId };
      } catch {
        return null;
      }
    }
    const erased = this.erasedKeys?.byId.get(keyId);
    if (!erased) return null;
    if (erased.state === "erasing") return new LessorError("tenant_erasing", { retryAfterSeconds: 5 });
    return new LessorError("tenant_erased", {
      details: { erasedAt: new Date(erased.erasedAt ?? 0).toISOString() },
    });
  }

  /**
   * A tenant disabled while a request waited for its lease (behind a start, say) is refused with
   * the lease already in hand; the caller's `finally` releases it.
   */
  refuseIfDisabled(): void {
    if (this.rt.record?.status === "disabled") throw new LessorError("tenant_disabled");
  }
}
