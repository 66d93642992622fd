/**
 * Who the object serves: the tenant record (installed by provisioning and operator actions, or
 * read from the catalog on first use) and the check of a caller's key hash against it.
 */
import { loadTenantRecord, withControlPlane } from "../control-plane/index.ts";
import { hashesEqual } from "../crypto/keys.ts";
import { LessorError } from "../errors/index.ts";
import type { KeyProof, KeyScope, TenantRecord } from "../rpc/tenant.ts";
import { pendingCatalogVersionKey } from "./migrate.ts";
import type { TenantRuntime } from "./runtime.ts";

/** Compared against when no key matches, so that path costs what a wrong key costs. */
const unknownKeyHash = "0".repeat(64);

/** How long an unknown tenant is remembered as unknown, so probes do not hammer the control plane. */
const negativeCacheMs = 5_000;

export class TenantAuth {
  private unknownUntil = 0;

  constructor(private readonly rt: TenantRuntime) {}

  /** Installs or replaces the catalog record; the tenant exists, so its storage may be created. */
  async install(catalogRecord: TenantRecord): Promise<void> {
    await this.rt.storage.open();
    // A migration the catalog has not heard of yet (a control-plane blip): the database's version wins.
    const pending = this.rt.storage.read<number>(pendingCatalogVersionKey);
    const record =
      pending !== null && pending > catalogRecord.schemaVersion
        ? { ...catalogRecord, schemaVersion: pending }
        : catalogRecord;
    this.rt.record = record;
    this.unknownUntil = 0;
    this.rt.storage.write("record", record);
  }

  /** The record, from memory or (once) from the catalog; null for a tenant that does not exist. */
  async resolve(tenantId: string): Promise<TenantRecord | null> {
    if (this.rt.record) return this.rt.record;
    if (Date.now() < this.unknownUntil) return null;
    const record = await withControlPlane(this.rt.config, this.rt.env, (db) =>
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
  async authenticate(tenantId: string, proof: KeyProof): Promise<TenantRecord> {
    const { record, scope } = await this.authenticateAny(tenantId, proof);
    if (scope !== "full") throw new LessorError("key_scope_refused");
    return record;
  }

  /** As `authenticate`, for a route that serves end-user keys too: says which scope the key has. */
  async authenticateAny(
    tenantId: string,
    proof: KeyProof,
  ): Promise<{ record: TenantRecord; scope: KeyScope }> {
    const record = await this.resolve(tenantId);
    const key = record?.tenantId === tenantId ? record.keys.find((k) => k.keyId === proof.keyId) : undefined;
    // The hash is compared whatever happened before, so a known key id answers no faster.
    const matches = hashesEqual(key?.hash ?? unknownKeyHash, proof.keyHash);
    if (!record || !key || !matches || (key.expiresAt !== null && Date.now() >= key.expiresAt)) {
      throw new LessorError("invalid_credentials");
    }
    if (record.status === "disabled") throw new LessorError("tenant_disabled");
    this.rt.noteKeyUse(key.keyId);
    // A record installed before keys had scopes has none: those keys are full keys.
    return { record, scope: key.scope ?? "full" };
  }

  /**
   * A tenant disabled while a request waited for its lease (behind a start, say) is refused with
   * the lease already in hand; the caller's `finally` releases it.
   */
  refuseIfDisabled(): void {
    if (this.rt.record?.status === "disabled") throw new LessorError("tenant_disabled");
  }
}
