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
import { appendGeneration, resealCredential, withControlPlane } from "../control-plane/index.ts";
import {
  beginRotation,
  classifyStartFailure,
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
import { asLessorError } from "./answers.ts";
import type { TenantAuth } from "./auth.ts";
import { flushOutboxes } from "./outbox.ts";
import type { TenantPool } from "./pool.ts";
import type { TenantRuntime } from "./runtime.ts";
import { type RotationStep, tenantHooksForTests } from "./test-hooks.ts";

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

  async rotate(tenantId: string): Promise<RotateOutcome> {
    try {
      if (this.running) throw new LessorError("rotation_in_progress", { retryAfterSeconds: 1 });
      const record = await this.auth.resolve(tenantId);
      if (!record) throw new LessorError("tenant_not_found");
      const work = this.run(record);
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

  private async run(record: TenantRecord): Promise<RotateOutcome> {
    const rt = this.rt;
    const decision = rotationDecision(rt.lifecycle);
    if (decision.kind === "refuse") {
      throw new LessorError(decision.code, { retryAfterSeconds: 1 });
    }
    const password = generateDatabasePassword();
    const sealed = await seal(rt.env.LESSOR_SEAL_KEY, record.tenantId, password);

    if (decision.kind === "update_credential") {
      const keyId = await this.pool.credentials.changePassword(record, password, "rotate");
      await withControlPlane(rt.config, rt.env, (db) => resealCredential(db, record.tenantId, sealed));
      rt.note("credential_rotated: stopped, credential updated");
      logEvent("info", "credential_rotated", { tenant: record.tenantId, overlapped: false });
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
    const size = this.pool.rotationSize(record);
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
      throw new LessorError("capacity_saturated", { retryAfterSeconds: admitted.retryAfterMs / 1000 });
    }
    let prepared: Awaited<ReturnType<TenantPool["prepare"]>> | null = null;
    try {
      await this.step(record, "admitted");
      const keyId = await this.pool.credentials.changePassword(
        record,
        password,
        "rotate",
        2 * record.poolSize + 1,
      );
      await this.step(record, "password_changed");
      await withControlPlane(rt.config, rt.env, async (db) => {
        if (!(await appendGeneration(db, record.tenantId, to, record.poolSize))) {
          throw new LessorError("internal", { internal: "rotation generation already taken" });
        }
        await resealCredential(db, record.tenantId, sealed);
      });
      await this.step(record, "resealed");
      const credential = await this.pool.credentials.credentialFor(record, password);
      prepared = await this.pool.prepare(record, to, credential, size);
      await this.step(record, "prepared");
      const next = rotationSwitched(rt.lifecycle, from);
      if (!next) {
        // The pool stopped meanwhile (drained, evicted): the new credential stands, the next start uses it.
        throw new LessorError("tenant_draining", {
          internal: "the pool stopped during the rotation",
          retryAfterSeconds: 1,
        });
      }
      // Same turn, no await: from here new leases go to the new generation.
      this.pool.switchTo(prepared, to);
      rt.apply(next, "credential_rotated");
      prepared = null;
      this.currentKeyId = keyId;
      rt.usage.poolStarts++;
      logEvent("info", "credential_rotated", { tenant: record.tenantId, from, to, overlapped: true });
      await budget.confirm(record.host, record.tenantId, to, this.pool.report()).catch(() => undefined);
      if (this.pool.holds(from)) await budget.draining(record.tenantId, from).catch(() => undefined);
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
