import { parseTenantId, type TenantId } from "./tenant-id.ts";

/** What `/sql` learns from `Neon-Connection-String`: which tenant, and the key that claims it. */
export interface SqlCredentials {
  tenantId: TenantId;
  key: string;
}

export type ConnectionStringProblem = "missing" | "malformed" | "invalid_tenant_id" | "mismatch";

/**
 * Parses `postgres://<tenant>:<key>@<host>/<tenant>`. The user and the database must name the same
 * tenant: a connection string cannot authenticate as one tenant and address another.
 */
export function parseSqlConnectionString(
  header: string | null | undefined,
): SqlCredentials | ConnectionStringProblem {
  if (!header) return "missing";
  let url: URL;
  try {
    // Parse as http: so the URL parser splits user, password, host and path for any scheme.
    const scheme = /^(postgres|postgresql):\/\//i.exec(header);
    if (!scheme) return "malformed";
    url = new URL(`http://${header.slice(scheme[0].length)}`);
  } catch {
    return "malformed";
  }
  const user = safeDecode(url.username);
  const key = safeDecode(url.password);
  const database = safeDecode(url.pathname.replace(/^\//, ""));
  if (user === null || key === null || database === null || !key) return "malformed";
  const tenantId = parseTenantId(user);
  if (!tenantId || parseTenantId(database) === null) return "invalid_tenant_id";
  if (database !== user) return "mismatch";
  return { tenantId, key };
}

function safeDecode(part: string): string | null {
  try {
    return decodeURIComponent(part);
  } catch {
    return null;
  }
}
