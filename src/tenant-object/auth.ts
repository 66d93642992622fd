/**
 * Who the object serves: the tenant record (installed by provisioning and operator actions, or
 * read from the catalog on first use) and the check of a caller's key hash against it.
 */
import { loadTenantRecord, withControlPlane } from "../control-plane/index.ts";
import { hashesEqual } from "../crypto/keys.ts";
import { LessorError } from "../errors/index.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import type { TenantRuntime } from "./runtime.ts";

/** How long an unknown tenant is remembered as unknown, so probes do not hammer the control plane. */
const negativeCacheMs = 5_000;

export class TenantAuth {
  private unknownUntil = 0;

  constructor(private readonly rt: TenantRuntime) {}

  /** Installs or replaces the catalog record; the tenant exists, so its storage may be created. */
  async install(record: TenantRecord): Promise<void> {
    await this.rt.storage.open();
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
   * The record, if `keyHash` is the tenant's key. An unknown tenant and a wrong key are
   * indistinguishable to the caller; a disabled tenant is refused only after the key checks out.
   */
  async authenticate(tenantId: string, keyHash: string): Promise<TenantRecord> {
    const record = await this.resolve(tenantId);
    if (!record || record.tenantId !== tenantId || !hashesEqual(record.keyHash, keyHash)) {
      throw new LessorError("invalid_credentials");
    }
    if (record.status === "disabled") throw new LessorError("tenant_disabled");
    return record;
  }

  /**
   * A tenant disabled while a request waited for its lease (behind a start, say) is refused with
   * the lease already in hand; the caller's `finally` releases it.
   */
  refuseIfDisabled(): void {
    if (this.rt.record?.status === "disabled") throw new LessorError("tenant_disabled");
  }
}
