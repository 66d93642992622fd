/**
 * How failures leave the object: every error becomes a stable code (a LessorError on the wire),
 * or, for a statement's own Postgres error, the fields the Neon driver expects. Anything Lessor
 * did not expect is logged (secret-free) and answered `internal`.
 */
import { postgresErrorBody } from "../core/neon-protocol.ts";
import { describeFailure, LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import type { SqlOutcome } from "../rpc/tenant.ts";

/** The LessorError an object answers for `error`; unexpected ones are logged. */
export function asLessorError(tenantId: string, error: unknown): LessorError {
  if (error instanceof LessorError) {
    if (error.code === "internal" || error.code === "misconfigured") {
      logEvent("error", "tenant_object_error", { tenant: tenantId, failure: describeFailure(error) });
    }
    return error;
  }
  logEvent("error", "tenant_object_error", { tenant: tenantId, failure: describeFailure(error) });
  return new LessorError("internal", { cause: error });
}

/** A failed statement's answer: its Postgres error, or the refusal. */
export function sqlFailure(tenantId: string, error: unknown, authenticated: boolean): SqlOutcome {
  const postgres = postgresErrorBody(error);
  if (postgres) return { ok: false, postgres, authenticated };
  return { ok: false, error: asLessorError(tenantId, error).toWire(), authenticated };
}
