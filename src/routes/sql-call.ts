/**
 * The one RPC of a `/sql` request (docs/architecture.md, "Hot path"): to the tenant's object in the
 * region its key names inside its MAC, or wherever the tenant moved since (placement/moves.ts), and
 * nothing of another region. Without `Lessor-Schema-Version` this is the warm path: one RPC and
 * nothing else. With it, what a named version adds (recording it for the contract guard, an upgrade
 * on demand) is the campaigns' (src/campaigns/schema-version.ts).
 */
import { afterSchemaVersion } from "../campaigns/schema-version.ts";
import type { SqlRequest } from "../core/neon-protocol.ts";
import { callOwner } from "../placement/moves.ts";
import type { KeyProof, SqlOutcome } from "../rpc/tenant.ts";

export async function callSql(
  env: Env,
  waitUntil: (promise: Promise<unknown>) => void,
  tenantId: string,
  proof: KeyProof,
  request: SqlRequest,
  required: number | null,
  bearer: string | null,
): Promise<SqlOutcome> {
  const { answer, proof: owner } = await callOwner<SqlOutcome>(env, tenantId, proof, (object, asked) =>
    object.sql(tenantId, asked, request, required, bearer),
  );
  if (required === null) return answer;
  return afterSchemaVersion(env, waitUntil, { tenantId, owner, request, required, bearer }, answer);
}
