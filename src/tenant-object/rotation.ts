/**
 * Credential rotation through overlapping generations (docs/adr/013-rotation-through-overlapping-generations.md).
 *
 * A ready tenant: the next generation is admitted against the host's rotation reserve (bounded wait,
 * then `capacity_saturated`; nothing is evicted for it), the new password's guard key is added and
 * the password set on the role through the host admin, the password is resealed in the control
 * plane, the new generation's pool is opened and proved, and only then does it become current. The
 * old generation keeps the leases it holds (Postgres does not end sessions that logged in with an
 * old password) and retires when the last one ends; its guard key goes with it.
 *
 * A stopped tenant: only the credential changes; the next start uses it.
 *
 * The order is chosen so that an object killed at any step leaves a tenant that starts: before the
 * reseal, the control plane still holds the old password and the next start repairs the role back
 * to it (28P01 → repair); after it, the role and the control plane agree on the new one. Both
 * generations die with the object, so no two live generations are ever left without leases.
 */
import { eq, sql } from "drizzle-orm";
import { writeAudit } from "../audit/index.ts";
import {
  appendGeneration,
  type ControlPlane,
  resealCredential,
  withControlPlane,
} from "../control-plane/index.ts";
import { adoptedDatabases, tenants } from "../control-plane/schema.ts";
import {
  beginRotation,
  classifyStartFailure,
  credentialReplaced,
  rotationAbandoned,
  rotationDecision,
  rotationSwitched,
} from "../core/lifecycle.ts";
import { generateDatabasePassword } from "../crypto/keys.ts";
import { seal } from "../crypto/seal.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import { endPool } from "../postgres/index.ts";
import type { RotateOutcome, TenantRecord } from "../rpc/tenant.ts";
import { tunnelUnavailable } from "../tenant-db/customer.ts";
import { asLessorError } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { flushOutboxes } from "./outbox.ts";
import type { PreparedGeneration, TenantPool } from "./pool/index.ts";
import type { TenantRuntime } from "./runtime.ts";
import { type RotationStep, tenantHooksForTests } from "./test-hooks.ts";

/** Where a new credential comes from: Lessor makes it, or a customer supplied it. */
type CredentialSource =
  | { kind: "generated" }
  | { kind: "supplied"; user: string; password: string; actor: string };

/**
 * Keeps a new credential in the control plane, in one transaction: the sealed password, and for a
 * supplied one the role it names and an audit row (never the password). `sealed_at` moves with it.
 */
async function recordCredential(
  db: ControlPlane,
  record: TenantRecord,
  next: TenantRecord,
  sealed: string,
  source: CredentialSource,
  overlapped: boolean,
): Promise<void> {
  if (source.kind === "generated") {
    await resealCredential(db, record.tenantId, sealed);
    return;
  }
  await db.transaction(async (tx) => {
    const session = tx as unknown as ControlPlane;
    await resealCredential(session, record.tenantId, sealed);
    if (next.roleName !== record.roleName) {
      await tx
        .update(tenants)
        .set({ roleName: next.roleName, updatedAt: sql`now()` })
        .where(eq(tenants.id, record.tenantId));
    }
    await tx
      .update(adoptedDatabases)
      .set({ updatedAt: sql`now()` })
      .where(eq(adoptedDatabases.tenantId, record.tenantId));
    await writeAudit(tx, {
      actor: source.actor,
      action: "tenant.credentials",
      tenantId: record.tenantId,
      detail: { role: next.roleName, previousRole: record.roleName, overlapped },
    });
  });
}

export class CredentialRotation {
  /** The rotation in progress: one at a time per tenant. */
  private running: Promise<unknown> | null = null;
  /** The guard key of the credential now in force, kept until the old generation retires. */
  private currentKeyId: string | null = null;

  constructor(
    private readonly rt: TenantRuntime,
    private readonly auth: TenantAuth,
    private readonly pool: TenantPool,
  ) {}

  /** A credential change in progress (a start waits for it rather than race it). */
  get inProgress(): Promise<unknown> | null {
    return this.running;
  }

  /** Rotates to a password Lessor makes (its hosts' tenants, and customers' roles Lessor manages). */
  rotate(tenantId: string): Promise<RotateOutcome> {
    return this.change(tenantId, { kind: "generated" });
  }

  /**
   * Moves a customer's database to a credential its customer supplied (docs/customer-databases.md):
   * proved first (nothing changes if the server refuses it), then through overlapping generations
   * exactly as a rotation, so no request fails; the old credential may be revoked once the old
   * generation has retired.
   */
  supply(tenantId: string, user: string, password: string, actor: string): Promise<RotateOutcome> {
    return this.change(tenantId, { kind: "supplied", user, password, actor });
  }

  private async change(tenantId: string, source: CredentialSource): Promise<RotateOutcome> {
    try {
      if (this.running) throw new LessorError("rotation_in_progress", { retryAfterSeconds: 1 });
      const record = await this.auth.resolve(tenantId);
      if (!record) throw new LessorError("tenant_not_found");
      const work = this.run(record, source);
      this.running = work;
      try {
        return await work;
      } finally {
        this.running = null;
      }
    } catch (error) {
      return { ok: false, error: asLessorError(this.rt.tenantId, hostFailure(error)).toWire() };
    }
  }

  private async run(record: TenantRecord, source: CredentialSource): Promise<RotateOutcome> {
    const rt = this.rt;
    if (source.kind === "generated" && record.adopted?.credentials === "customer") {
      throw new LessorError("adopted_database", {
        publicMessage:
          "This tenant's credential is its customer's: they issue a new one and hand it over (PUT /v1/tenants/:id/credentials); Lessor does not change it.",
      });
    }
    if (source.kind === "supplied" && !record.adopted) {
      throw new LessorError("invalid_request", {
        publicMessage:
          "Only a tenant attached to a customer's database takes a supplied credential; Lessor makes its own hosts' credentials (POST /v1/tenants/:id/rotate-credentials).",
      });
    }
    const decision = rotationDecision(rt.lifecycle);
    if (decision.kind === "refuse") {
      throw new LessorError(decision.code, { retryAfterSeconds: 1 });
    }
    // A supplied credential may name another role (a customer overlaps two roles, since a role has
    // one password): the record moves to it with the credential.
    const next: TenantRecord = source.kind === "supplied" ? { ...record, roleName: source.user } : record;
    const password = source.kind === "supplied" ? source.password : generateDatabasePassword();
    const sealed = await seal(rt.env.LESSOR_SEAL_KEY, record.tenantId, password);
    if (source.kind === "supplied") await this.pool.credentials.proveSupplied(next, password);

    if (decision.kind === "update_credential") {
      const keyId =
        source.kind === "generated"
          ? await this.pool.credentials.changePassword(record, password, "rotate")
          : "";
      await withControlPlane(rt.config, rt.env, rt.region, (db) =>
        recordCredential(db, record, next, sealed, source, false),
      );
      if (next !== record) await this.auth.install(next);
      // A tenant backing off after a refused credential may start again at once.
      rt.apply(credentialReplaced(rt.lifecycle), "credential_replaced");
      rt.note(`credential_rotated: stopped, credential updated (${source.kind})`);
      logEvent("info", "credential_rotated", {
        tenant: record.tenantId,
        overlapped: false,
        source: source.kind,
      });
      // No generation runs under an older password: its guard key can go now.
      await this.pool.credentials.retireGuardKeys(record, keyId).catch((error: unknown) => {
        logEvent("warn", "guard_key_retire_failed", {
          tenant: record.tenantId,
          failure: describeFailure(error),
        });
      });
      void flushOutboxes(rt).catch(() => undefined);
      return { ok: true, generation: rt.lifecycle.generation, overlapped: false };
    }

    const from = rt.lifecycle.generation;
    rt.apply(beginRotation(rt.lifecycle), "rotation_started");
    const to = rt.lifecycle.rotatingTo ?? from + 1;
    rt.note(`rotation_started: generation ${to} prepares under a new credential`);
    const budget = rt.budget(record.host);
    // The new generation holds what the current one holds now (a grown or shrunk pool keeps its size).
    const size = this.pool.generations.rotationSize(record);
    const bounds = this.pool.sizing.bounds(record);
    let admitted: Awaited<ReturnType<typeof budget.admitRotation>>;
    try {
      admitted = await budget.admitRotation(
        record.host,
        record.tenantId,
        to,
        size,
        rt.config.admissionWaitMs,
        bounds.adaptive ? bounds.floor : null,
      );
    } catch (error) {
      await budget.release(record.host, record.tenantId, to).catch(() => undefined);
      rt.apply(rotationAbandoned(rt.lifecycle), "rotation_abandoned");
      throw new LessorError("capacity_saturated", { retryAfterSeconds: 1, cause: error });
    }
    if (!admitted.granted) {
      rt.apply(rotationAbandoned(rt.lifecycle), "rotation_abandoned");
      rt.note("rotation_refused: no room in the rotation reserve");
      void flushOutboxes(rt).catch(() => undefined);
      // A customer's tunnel has no rotation reserve beyond its capacity: both generations fit in it.
      if (admitted.tunnel) throw tunnelUnavailable(admitted.tunnel, admitted.retryAfterMs / 1000);
      throw new LessorError("capacity_saturated", { retryAfterSeconds: admitted.retryAfterMs / 1000 });
    }
    let prepared: PreparedGeneration | null = null;
    try {
      await this.step(record, "admitted");
      const keyId =
        source.kind === "generated"
          ? await this.pool.credentials.changePassword(record, password, "rotate", 2 * record.poolSize + 1)
          : "";
      await this.step(record, "password_changed");
      await withControlPlane(rt.config, rt.env, rt.region, async (db) => {
        if (!(await appendGeneration(db, record.tenantId, to, record.poolSize))) {
          throw new LessorError("internal", { internal: "rotation generation already taken" });
        }
        await recordCredential(db, record, next, sealed, source, true);
      });
      await this.step(record, "resealed");
      const credential = await this.pool.credentials.credentialFor(next, password);
      prepared = await this.pool.generations.prepare(next, to, credential, size);
      await this.step(record, "prepared");
      const switched = rotationSwitched(rt.lifecycle, from);
      if (!switched) {
        // The pool stopped meanwhile (drained, evicted): the new credential stands, the next start uses it.
        if (next !== record) await this.auth.install(next);
        throw new LessorError("tenant_draining", {
          internal: "the pool stopped during the rotation",
          retryAfterSeconds: 1,
        });
      }
      // Same turn, no await: from here new leases go to the new generation.
      this.pool.generations.switchTo(prepared, to);
      rt.apply(switched, "credential_rotated");
      // What a rotation does to each holder is the holders' table's (src/core/holders.ts `rotate`:
      // every kind keeps what it holds, on the retiring generation), like every other operation's.
      rt.holders.apply("rotate");
      prepared = null;
      this.currentKeyId = keyId;
      rt.usage.poolStarts++;
      if (next !== record) await this.auth.install(next);
      logEvent("info", "credential_rotated", {
        tenant: record.tenantId,
        from,
        to,
        overlapped: true,
        source: source.kind,
      });
      await budget.confirm(record.host, record.tenantId, to, this.pool.report()).catch(() => undefined);
      if (this.pool.generations.holds(from))
        await budget.draining(record.tenantId, from).catch(() => undefined);
      await this.step(record, "switched");
      void flushOutboxes(rt).catch(() => undefined);
      return { ok: true, generation: to, overlapped: true };
    } catch (error) {
      if (prepared) await endPool(prepared.pool);
      await budget.release(record.host, record.tenantId, to).catch(() => undefined);
      rt.apply(rotationAbandoned(rt.lifecycle), "rotation_abandoned");
      rt.note("rotation_failed");
      logEvent("warn", "credential_rotation_failed", {
        tenant: record.tenantId,
        generation: to,
        failure: describeFailure(error),
      });
      throw error;
    }
  }

  /** A test's hook at a named step (test-hooks.ts); nothing in production. */
  private async step(record: TenantRecord, step: RotationStep): Promise<void> {
    const hook = tenantHooksForTests.onRotationStep;
    if (hook) await hook({ tenantId: record.tenantId, step, abortObject: (why) => this.rt.ctx.abort(why) });
  }

  /** The old generation stopped: remove every guard key but the one of the credential in force. */
  retired(generation: number): void {
    const record = this.rt.record;
    const keep = this.currentKeyId;
    if (!record || !keep) return;
    this.rt.ctx.waitUntil(
      this.pool.credentials
        .retireGuardKeys(record, keep)
        .then((removed) => {
          if (removed > 0) this.rt.note(`guard_keys_retired: ${removed} (generation ${generation})`);
        })
        .catch((error: unknown) => {
          logEvent("warn", "guard_key_retire_failed", {
            tenant: record.tenantId,
            failure: describeFailure(error),
          });
        }),
    );
  }
}

/**
 * A connection to the host that failed mid-rotation (a restart, a cut or silent network) is a
 * retryable `connection_lost`, as on `/sql`: the rotation may or may not have changed the password,
 * and asking again is safe (every rotation makes a new one). Anything else stays what it was.
 */
function hostFailure(error: unknown): unknown {
  if (error instanceof LessorError) return error;
  const reason = classifyStartFailure(error);
  if (reason !== "unreachable" && reason !== "timeout") return error;
  return new LessorError("connection_lost", {
    internal: `a connection to the host failed during the rotation (${reason})`,
    cause: error,
    retryAfterSeconds: 1,
  });
}
