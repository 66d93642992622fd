/**
 * Adopting a customer's database, as plain data (docs/adr/018-customer-databases-behind-tunnels.md):
 * the connection URL an operator hands Lessor, what the attach probe read on the customer's server,
 * and the verdict: whether Lessor can serve that database at all, what is weaker than ideal, and
 * the containment it gives there.
 *
 * Lessor creates nothing on a customer's server: no role, no database, no login guard, no schema.
 * Tenant SQL runs as the role the customer issued, so what that role may do, a tenant key may do;
 * the customer's network (the tunnel) and the role's own bounds are the containment, and the verdict
 * says which of them the probe found missing.
 */

/** Who changes the customer's credential: the customer, through the API, or Lessor itself. */
export type CredentialPolicy = "customer" | "lessor";

export const credentialPolicies = ["customer", "lessor"] as const;

/** Where an adopted database is, and as whom Lessor connects (the password is sealed elsewhere). */
export interface AdoptionUrl {
  hostname: string;
  port: number;
  database: string;
  user: string;
  password: string;
}

/** A Postgres role or database name Lessor will use as sent (quoted where it appears in SQL). */
const namePattern = /^[A-Za-z_][A-Za-z0-9_$-]{0,62}$/;

/**
 * Parses `postgres://user:password@host:port/database`. Every part is required but the port (5432);
 * the password is never echoed in a problem.
 */
export function parseAdoptionUrl(raw: string): AdoptionUrl | { problem: string } {
  if (!/^postgres(ql)?:\/\//.test(raw)) return { problem: "url must start with postgres://" };
  let url: URL;
  try {
    url = new URL(raw.replace(/^postgres(ql)?:/, "http:"));
  } catch {
    return { problem: "url is not a valid connection string" };
  }
  const user = decodeURIComponent(url.username);
  const password = decodeURIComponent(url.password);
  const database = decodeURIComponent(url.pathname.replace(/^\//, ""));
  if (!user || !namePattern.test(user)) return { problem: "url needs a user (a plain role name)" };
  if (!password) return { problem: "url needs the password the customer issued" };
  if (!database || !namePattern.test(database)) {
    return { problem: "url needs a database (a plain database name)" };
  }
  if (!url.hostname) return { problem: "url needs the database's host, as the tunnel reaches it" };
  const port = Number(url.port || 5432);
  return { hostname: url.hostname, port, database, user, password };
}

/** Whether `name` is a role name Lessor accepts for a customer credential. */
export function isCustomerRoleName(name: string): boolean {
  return namePattern.test(name);
}

/** What the attach probe read on the customer's server, as the customer's role. */
export interface AdoptedFacts {
  /** `server_version_num`, e.g. 180004. */
  serverVersionNum: number;
  /** `server_version` as the server says it (for operators). */
  serverVersion: string;
  role: string;
  superuser: boolean;
  /** `CREATEROLE`: the role can manage roles (and so can a tenant key). */
  createRole: boolean;
  createDb: boolean;
  /** `rolconnlimit`; -1: none. */
  connectionLimit: number;
  /** `rolvaliduntil`, ISO, or null: the password does not expire. */
  validUntil: string | null;
  /** The role owns the database it was issued for (it can then `ALTER DATABASE`). */
  ownsDatabase: boolean;
  /** Other databases the role may connect to. */
  otherDatabases: string[];
  maxPreparedTransactions: number;
  /**
   * Whether a login guard could be installed there at all: Postgres 17+ and the role a member of a
   * provider group that may create event triggers (rds_superuser, cloudsqlsuperuser, neon_superuser,
   * azure_pg_admin) or granted Lessor's provider function. Lessor installs none either way.
   */
  loginGuardPossible: boolean;
}

/** The oldest server whose settings Lessor's connections start with (`client_connection_check_interval`). */
export const minimumAdoptedServerVersion = 140000;

export interface AdoptionRefusal {
  /** Stable: `superuser`, `version`, `pool_size`. */
  reason: string;
  remedy: string;
}

export interface AdoptionVerdict {
  /** False: the attach is refused and nothing is kept. */
  fit: boolean;
  refused: AdoptionRefusal[];
  /** Weaker than ideal, kept and shown; each says what the customer can do. */
  warnings: string[];
  /** Always `customer`: the customer's network and role bounds contain a tenant key, not a guard. */
  containment: "customer";
  loginGuard: "possible" | "not_possible";
  credentials: CredentialPolicy;
}

/**
 * Whether Lessor can serve an adopted database with these facts. Refused: a superuser credential
 * (Lessor never runs as one, and a tenant key would be one), a server older than
 * `minimumAdoptedServerVersion`, and a pool that does not fit the tunnel. Everything else the
 * customer should tighten is a warning.
 */
export function evaluateAdoption(
  facts: AdoptedFacts,
  context: { poolSize: number; tunnelPoolCapacity: number; credentials: CredentialPolicy; now: number },
): AdoptionVerdict {
  const refused: AdoptionRefusal[] = [];
  const warnings: string[] = [];
  if (facts.superuser) {
    refused.push({
      reason: "superuser",
      remedy:
        "The credential is a superuser's: Lessor never runs as one, and every tenant key would be one. Issue a role with only the rights the application needs.",
    });
  }
  if (facts.serverVersionNum < minimumAdoptedServerVersion) {
    refused.push({
      reason: "version",
      remedy: `The server is ${facts.serverVersion}; Lessor's connections need Postgres 14 or later.`,
    });
  }
  if (context.poolSize > context.tunnelPoolCapacity) {
    refused.push({
      reason: "pool_size",
      remedy: `The tier's pool (${context.poolSize}) does not fit the tunnel's capacity for pools (${context.tunnelPoolCapacity}); pick a smaller tier or declare the tunnel larger.`,
    });
  }
  if (facts.connectionLimit < 0 || facts.connectionLimit > context.tunnelPoolCapacity + 1) {
    warnings.push(
      `the role's CONNECTION LIMIT is ${facts.connectionLimit < 0 ? "unlimited" : facts.connectionLimit}: set it to the pool size plus one (ALTER ROLE … CONNECTION LIMIT), so a tenant key can never hold more`,
    );
  }
  if (facts.createRole) {
    warnings.push("the role has CREATEROLE: a tenant key can create and change roles on your server");
  }
  if (facts.createDb)
    warnings.push("the role has CREATEDB: a tenant key can create databases on your server");
  if (facts.ownsDatabase) {
    warnings.push(
      "the role owns its database: a tenant key can ALTER DATABASE (Lessor's connections pin their own settings, but the owner can also drop the database)",
    );
  }
  if (facts.otherDatabases.length > 0) {
    warnings.push(
      `the role may connect to other databases (${facts.otherDatabases.slice(0, 5).join(", ")}): revoke CONNECT there, Lessor connects to one`,
    );
  }
  if (facts.maxPreparedTransactions > 0) {
    warnings.push(
      `max_prepared_transactions is ${facts.maxPreparedTransactions}: Lessor rolls back a prepared transaction at once, but 0 refuses them outright`,
    );
  }
  if (facts.validUntil !== null) {
    const expires = Date.parse(facts.validUntil);
    warnings.push(
      Number.isFinite(expires) && expires <= context.now
        ? `the role's password expired at ${facts.validUntil}`
        : `the role's password expires at ${facts.validUntil} (VALID UNTIL): rotate it before then`,
    );
  }
  return {
    fit: refused.length === 0,
    refused,
    warnings,
    containment: "customer",
    loginGuard: facts.loginGuardPossible ? "possible" : "not_possible",
    credentials: context.credentials,
  };
}

/** The operator's one line on why an attach was refused. */
export function describeRefusal(verdict: AdoptionVerdict): string {
  return `The database cannot be attached: ${verdict.refused.map((r) => `${r.reason}: ${r.remedy}`).join(" ")}`;
}

/** What the attach probe found, kept in the catalog and shown to operators. */
export interface AdoptionReport {
  probedAt: number;
  facts: AdoptedFacts;
  verdict: AdoptionVerdict;
}
