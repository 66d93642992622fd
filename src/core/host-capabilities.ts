/**
 * What a database host is, and whether its admin role can do what Lessor needs there: pure
 * decisions over facts a probe read from the host (src/tenant-db/capabilities.ts), so every verdict
 * is unit-tested without a database (docs/adr/016-host-kinds.md).
 *
 * Lessor never needs a superuser. On every host it needs an admin role that can create roles and
 * databases, end other backends and read their activity; for full containment it also needs a way to
 * create the login guard's event trigger (directly, as on Neon, RDS and Cloud SQL, or through the
 * provider function a self-hosted host's one-time setup installs).
 */

/** The kinds of host Lessor knows. The kind decides how passwords travel and what URLs are allowed. */
export const hostKinds = ["postgres", "neon"] as const;
export type HostKind = (typeof hostKinds)[number];

/** How a role's password is sent: as a SCRAM verifier (never the secret), or the secret over TLS. */
export type PasswordMode = "scram-verifier" | "plaintext-over-tls";

/**
 * Neon refuses hashed passwords ("hashed passwords are not supported", neon.com/docs/manage/roles,
 * read 2026-12-01): its compute forwards each `ALTER ROLE … PASSWORD` to Neon's control plane. Every
 * other Postgres takes a verifier, so the plaintext never reaches the server's logs or statements.
 */
export function passwordModeFor(kind: HostKind): PasswordMode {
  return kind === "neon" ? "plaintext-over-tls" : "scram-verifier";
}

/** The kind a host URL implies when its configuration names none. */
export function impliedHostKind(hostname: string): HostKind {
  return /\.neon\.(tech|build)$/i.test(hostname) ? "neon" : "postgres";
}

/**
 * Neon's `-pooler` endpoints are PgBouncer, which refuses startup parameters it does not know:
 * Lessor's login token and pinned settings ride in them, so a pooled endpoint cannot work at all.
 */
export function isPoolerHostname(hostname: string): boolean {
  return /-pooler\./i.test(hostname);
}

/** How the login guard's event trigger can be created on a host. */
export type EventTriggerPath = "direct" | "provider_function" | "none";

/** What the probe read from a host, as its admin role. */
export interface HostFacts {
  /** `server_version_num`, e.g. 180004. */
  serverVersionNum: number;
  role: string;
  superuser: boolean;
  createRole: boolean;
  createDb: boolean;
  /** Privileges of `pg_signal_backend` (end other roles' backends: fences, erase, the watchdog). */
  signalBackend: boolean;
  /** Privileges of `pg_read_all_stats` (see other roles' `backend_start`, `state`: reconcile, horizon). */
  readAllStats: boolean;
  eventTriggers: EventTriggerPath;
  /** `SET` on `temp_file_limit` (a per-role cap on temporary files). */
  tempFileLimit: boolean;
  maxPreparedTransactions: number;
  /** Databases other than tenants' where PUBLIC may connect (a tenant role could log in there). */
  publicConnectDatabases: string[];
}

/** The containment a host is configured to require. */
export type ContainmentLevel = "full" | "reduced";

export interface MissingCapability {
  /** A stable name: `superuser` (refused), `createrole`, `createdb`, … */
  capability: string;
  /** What is missing, and how the provider grants it. */
  remedy: string;
}

export interface HostVerdict {
  /** False: Lessor refuses to provision or start pools on this host. */
  fit: boolean;
  /** The containment Lessor provides on this host. */
  containment: ContainmentLevel;
  passwordMode: PasswordMode;
  missing: MissingCapability[];
  /** Weaker than ideal, but not refused; each says what it costs. */
  warnings: string[];
}

/** Postgres 16 is the oldest Lessor supports; the login guard needs 17's `login` event triggers. */
export const minimumServerVersion = 160000;
export const loginTriggerServerVersion = 170000;

const remedies = {
  superuser:
    "Lessor refuses to run as a superuser: give it a role with CREATEROLE and CREATEDB instead (Neon: the project's owner role; RDS: a member of rds_superuser; self-hosted: node local/host-setup.ts prints the setup).",
  createrole:
    "The admin role needs CREATEROLE (Neon and RDS admin roles have it; self-hosted: ALTER ROLE … CREATEROLE).",
  createdb:
    "The admin role needs CREATEDB (Neon and RDS admin roles have it; self-hosted: ALTER ROLE … CREATEDB).",
  signal:
    "The admin role needs the privileges of pg_signal_backend to end tenant backends (Neon: neon_superuser has it; RDS: rds_superuser has it; self-hosted: GRANT pg_signal_backend TO <admin>).",
  stats:
    "The admin role needs the privileges of pg_read_all_stats (or pg_monitor) to see tenant backends (Neon and RDS admin roles have it; self-hosted: GRANT pg_monitor TO <admin>).",
  version: "Lessor needs Postgres 16 or later.",
  guard:
    'The login guard needs Postgres 17 or later and a way to create event triggers (Neon, RDS and Cloud SQL admin roles can; self-hosted: install lessor_provider.create_event_trigger with node local/host-setup.ts), or set this host\'s containment to "reduced" knowingly (docs/containment.md).',
} as const;

/**
 * Whether Lessor can run on a host with these facts, at the containment the host's configuration
 * asks for. A host that cannot install the login guard is refused unless its configuration says
 * `"containment": "reduced"`; it never runs without the guard silently.
 */
export function evaluateHost(kind: HostKind, facts: HostFacts, required: ContainmentLevel): HostVerdict {
  const missing: MissingCapability[] = [];
  const warnings: string[] = [];
  if (facts.superuser) missing.push({ capability: "superuser", remedy: remedies.superuser });
  if (facts.serverVersionNum < minimumServerVersion)
    missing.push({ capability: "version", remedy: remedies.version });
  if (!facts.createRole) missing.push({ capability: "createrole", remedy: remedies.createrole });
  if (!facts.createDb) missing.push({ capability: "createdb", remedy: remedies.createdb });
  if (!facts.signalBackend) missing.push({ capability: "pg_signal_backend", remedy: remedies.signal });
  if (!facts.readAllStats) missing.push({ capability: "pg_read_all_stats", remedy: remedies.stats });
  const guardPossible = facts.serverVersionNum >= loginTriggerServerVersion && facts.eventTriggers !== "none";
  let containment: ContainmentLevel = "full";
  if (!guardPossible) {
    if (required === "full") missing.push({ capability: "event_trigger", remedy: remedies.guard });
    else {
      containment = "reduced";
      warnings.push(
        "no login guard: a tenant that sets its own password can log in to its database directly, around Lessor's bounds; the host's network allow-list is the only line (docs/containment.md)",
      );
    }
  }
  if (!facts.tempFileLimit) {
    warnings.push(
      "temp_file_limit cannot be set per tenant role: the host's own limit bounds a tenant's temporary files",
    );
  }
  if (facts.maxPreparedTransactions > 0) {
    warnings.push(
      `max_prepared_transactions is ${facts.maxPreparedTransactions}: Lessor rolls back every prepared transaction a tenant makes, but 0 refuses them outright (the safer setting)`,
    );
  }
  if (facts.publicConnectDatabases.length > 0) {
    warnings.push(
      `PUBLIC may connect to ${facts.publicConnectDatabases.join(", ")}, which Lessor's admin does not own: a tenant that set its own password could log in there (but create nothing and reach no tenant); revoke CONNECT from PUBLIC there as its owner`,
    );
  }
  return { fit: missing.length === 0, containment, passwordMode: passwordModeFor(kind), missing, warnings };
}

/** The operator's one-line summary of what is missing (an error message names each remedy). */
export function describeMissing(host: string, verdict: HostVerdict): string {
  return `Host ${host} cannot run Lessor: ${verdict.missing.map((m) => `${m.capability}: ${m.remedy}`).join(" ")}`;
}

/** A probe's report, kept by the host's BudgetObject and shown to operators. */
export interface HostReport {
  kind: HostKind;
  probedAt: number;
  facts: HostFacts;
  verdict: HostVerdict;
}

/** How long a report stands before the next admin connection probes again. */
export const hostReportMaxAgeMs = 10 * 60_000;

export function reportIsFresh(report: HostReport | null, now: number): report is HostReport {
  return report !== null && now - report.probedAt < hostReportMaxAgeMs;
}
