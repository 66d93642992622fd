/**
 * The one error catalog. Every refusal Lessor makes has a stable `code`, an HTTP status and a
 * public message that is safe to show a caller. The internal message and the cause are for logs
 * only, and even there never carry a credential (see `redact` in src/log).
 */
import type { PostgresErrorFields } from "../core/pg-wire.ts";
import { redact } from "../log/index.ts";

export interface ErrorSpec {
  readonly status: 400 | 401 | 403 | 404 | 409 | 410 | 413 | 423 | 429 | 500 | 502 | 503 | 504 | 507;
  readonly message: string;
  /** Retryable refusals carry a hint in seconds; it becomes `Retry-After`. */
  readonly retryable?: boolean;
}

export const errorCatalog = {
  not_found: { status: 404, message: "No such route." },
  invalid_json: { status: 400, message: "The request body is not valid JSON." },
  invalid_request: { status: 400, message: "The request is not valid." },
  payload_too_large: { status: 413, message: "The request body is larger than this deployment accepts." },
  invalid_tenant_id: {
    status: 400,
    message: "A tenant id is 1 to 40 lowercase letters, digits or hyphens, starting with a letter or digit.",
  },
  missing_credentials: { status: 401, message: "No credentials were sent." },
  invalid_credentials: { status: 401, message: "Unknown tenant or invalid key." },
  authentication_rate_limited: {
    status: 429,
    message: "Too many failed authentications for this tenant; retry after Retry-After.",
    retryable: true,
  },
  jwt_not_configured: {
    status: 401,
    message:
      "This tenant has no end-user JWT configuration, so it does not accept Authorization: Bearer on /sql; send no Authorization header, or configure JWT mode (PUT /v1/tenants/:id/jwt).",
  },
  jwt_required: {
    status: 401,
    message:
      "This is an end-user key: /sql needs an end user's token in Authorization: Bearer (neon()'s authToken).",
  },
  jwt_invalid: {
    status: 401,
    message: "The end-user token is not a valid JWT signed by one of the tenant's keys.",
  },
  jwt_expired: { status: 401, message: "The end-user token has expired (exp); get a fresh one." },
  jwt_not_yet_valid: { status: 401, message: "The end-user token is not valid yet (nbf)." },
  jwt_issuer_mismatch: {
    status: 401,
    message: "The end-user token was issued by an issuer this tenant does not accept (iss).",
  },
  jwt_audience_mismatch: {
    status: 401,
    message: "The end-user token is not meant for this tenant (aud).",
  },
  jwt_algorithm_refused: {
    status: 401,
    message:
      "The end-user token's algorithm (alg) is not one this tenant accepts; unsigned tokens never are.",
  },
  jwt_key_unknown: {
    status: 401,
    message: "No key of the tenant's key set matches the end-user token's key id (kid).",
  },
  jwks_unavailable: {
    status: 503,
    message: "The tenant's identity provider key set (JWKS URL) could not be fetched; retry shortly.",
    retryable: true,
  },
  key_revoked: {
    status: 401,
    message:
      "The key this connection or lease was opened with was revoked; it is closed. Connect again with a key the tenant holds.",
  },
  key_expired: {
    status: 401,
    message:
      "The key this connection or lease was opened with expired; it is closed. Connect again with a key that has not expired.",
  },
  key_scope_refused: {
    status: 403,
    message: "This is an end-user key: it opens /sql with an end user's token, and nothing else.",
  },
  jwt_role_unavailable: {
    status: 409,
    message: "That role name is taken on the tenant's host by a role Lessor did not create; choose another.",
  },
  jwt_setup_failed: {
    status: 502,
    message: "JWT mode could not be installed in the tenant's database; send the same request again.",
    retryable: true,
  },
  invalid_connection_string: {
    status: 400,
    message: "Neon-Connection-String must be postgres://<tenant>:<tenant key>@<host>/<tenant>.",
  },
  tenant_not_found: { status: 404, message: "No such tenant." },
  host_full: {
    status: 507,
    message:
      'The database host holds as many tenants as it may (its databases or roles per host, docs/scaling.md); name another host of the region, or add one (docs/operating.md, "When a region fills").',
  },
  tenant_exists: {
    status: 409,
    message:
      "A tenant with this id already exists; its key was shown once, when it was created. Pick another id, or mint a new key for it: POST /v1/tenants/<id>/keys with the admin key (npx lessorctl tenants key <id>).",
  },
  provisioning_in_progress: {
    status: 409,
    message: "This tenant is being provisioned by another request; retry shortly.",
    retryable: true,
  },
  tenant_disabled: { status: 423, message: "The tenant is disabled." },
  confirm_mismatch: {
    status: 400,
    message: "An erase must be confirmed: send ?confirm=<tenant id>, the same id as in the path.",
  },
  tenant_erasing: {
    status: 503,
    message: "The tenant is being erased; nothing new is served for it.",
    retryable: true,
  },
  tenant_erased: { status: 410, message: "The tenant was erased." },
  tenant_pinned: {
    status: 409,
    message: "The tenant is pinned; pass ?force=true to erase it anyway.",
  },
  tenant_in_campaign: {
    status: 409,
    message: "A migration campaign is migrating this tenant right now; retry once its migration ends.",
    retryable: true,
  },
  erase_not_found: { status: 404, message: "This tenant has no erase." },
  unknown_host: { status: 400, message: "No database host with that name is configured." },
  region_unknown: { status: 400, message: "No region with that name is configured." },
  tenant_moving: {
    status: 503,
    message: "The tenant is moving to another region; it is served again once the move switches over.",
    retryable: true,
  },
  tenant_moved: {
    status: 409,
    message: "The tenant moved to another region (details.region); ask that region (?region=).",
  },
  tenant_attached: {
    status: 409,
    message:
      "The tenant's database is its customer's, reached through a tunnel of the default region; an attached tenant stays in the default region and cannot be moved.",
  },
  move_same_region: { status: 409, message: "The tenant is already in that region." },
  move_not_found: { status: 404, message: "This tenant has no move in this region." },
  host_not_in_region: {
    status: 400,
    message: "That database host is in another region; a tenant's host is in the tenant's region.",
  },
  unknown_tier: { status: 400, message: "No tier with that name is configured." },
  stale_generation: {
    status: 409,
    message: "The pool generation this work was bound to has ended; retry to get a lease on the current one.",
    retryable: true,
  },
  tenant_starting_failed: {
    status: 503,
    message: "The tenant's database could not be reached; Lessor is backing off before it tries again.",
    retryable: true,
  },
  tenant_draining: {
    status: 503,
    message: "The tenant's pool is draining; retry shortly.",
    retryable: true,
  },
  connection_lost: {
    status: 503,
    message: "The connection to the tenant database was lost mid-query; the query may not have run. Retry.",
    retryable: true,
  },
  lease_timeout: {
    status: 503,
    message: "No connection of the tenant's pool became free in time; retry shortly.",
    retryable: true,
  },
  tenant_migrating: {
    status: 503,
    message: "The tenant's schema is being migrated; retry shortly.",
    retryable: true,
  },
  tenant_database_conflict: {
    status: 409,
    message:
      "The tenant's database holds an object in a place Lessor keeps its own (a schema named lessor_guard or auth); the tenant must rename it, then the request can be sent again.",
  },
  host_unfit: {
    status: 503,
    message:
      "The tenant's database host cannot run Lessor right now: its admin role lacks a capability Lessor needs. An operator must fix the host (GET /v1/capacity names what is missing); retry after that.",
    retryable: true,
  },
  host_tls_refused: {
    status: 503,
    message:
      "The tenant's database host did not give Lessor a verified TLS connection (no TLS offered, or a certificate that is not trusted or does not name the host); Lessor never connects without it. An operator must fix the host's TLS; retry after that.",
    retryable: true,
  },
  host_auth_refused: {
    status: 503,
    message:
      "The tenant's database host asked for a password method other than SCRAM-SHA-256 (cleartext or MD5), which Lessor never sends. An operator must set the host to SCRAM (password_encryption, pg_hba.conf); retry after that.",
    retryable: true,
  },
  maintenance_busy: {
    status: 503,
    message:
      "Every maintenance connection of the database host's reserve is in use (migrations, provisioning); retry shortly.",
    retryable: true,
  },
  rotation_in_progress: {
    status: 409,
    message:
      "A credential rotation of this tenant is still in progress (its previous generation is finishing its leases); retry once it ends.",
    retryable: true,
  },
  tenant_busy: {
    status: 503,
    message: "The tenant's pool is starting; retry shortly.",
    retryable: true,
  },
  tunnel_unavailable: {
    status: 503,
    message:
      "The tenant's database is reached through its own tunnel, which is full, too slow or down right now; only tenants behind that tunnel are affected. Retry after Retry-After.",
    retryable: true,
  },
  credential_revoked: {
    status: 503,
    message:
      "The tenant's database refused Lessor's credential (revoked or changed by the database's owner); an operator must supply a new one (PUT /v1/tenants/:id/credentials). Retrying will not help until then.",
    retryable: true,
  },
  credential_rejected: {
    status: 409,
    message:
      "The database refused the credential that was supplied; nothing changed, the current one stays in use. Check the user and password, and that the role may connect.",
  },
  attach_refused: {
    status: 409,
    message: "The database cannot be attached; the answer says why. Nothing was kept.",
  },
  unknown_tunnel: { status: 400, message: "No tunnel with that name is configured (LESSOR_TUNNELS)." },
  adopted_database: {
    status: 409,
    message:
      "This tenant's database belongs to its customer, who manages it: Lessor creates nothing there, so this operation does not apply.",
  },
  capacity_saturated: {
    status: 503,
    message: "The database host's connection budget is full and no idle pool can be evicted; retry shortly.",
    retryable: true,
  },
  statement_timeout: {
    status: 400,
    message:
      "The statement ran longer than this deployment allows (LESSOR_STATEMENT_TIMEOUT_MS) and was stopped; its transaction did not commit.",
  },
  response_too_large: {
    status: 507,
    message: "The answer is larger than this deployment returns (LESSOR_MAX_RESPONSE_BYTES).",
  },
  prepared_transaction_refused: {
    status: 400,
    message:
      "Prepared transactions (PREPARE TRANSACTION) are not supported through Lessor; the transaction was rolled back.",
  },
  lease_not_found: { status: 404, message: "No such lease." },
  key_not_found: { status: 404, message: "The tenant has no key with this id." },
  key_limit: { status: 409, message: "The tenant holds as many keys as it may; revoke one first." },
  last_key: {
    status: 409,
    message:
      "This is the tenant's last usable key; revoking it locks the tenant out. Pass ?force=true to do it anyway.",
  },
  lease_expired: {
    status: 409,
    message:
      "The lease expired (unused past its TTL, or past LESSOR_LEASE_MAX_LIFETIME_MS) and was reclaimed; its transaction was rolled back. Open a new lease.",
  },
  lease_lost: {
    status: 409,
    message: "The connection behind this lease was lost; its transaction did not commit. Open a new lease.",
  },
  lease_limit: {
    status: 503,
    message:
      "Every connection of the tenant's pool is held by a session lease; release one or retry shortly.",
    retryable: true,
  },
  schema_version_unknown: {
    status: 409,
    message:
      "The request needs a schema version this deployment does not bundle; deploy a Lessor whose tenant migrations include it.",
  },
  schema_too_old: {
    status: 409,
    message: "The tenant's schema is older than the version this request needs.",
  },
  schema_upgrade_failed: {
    status: 409,
    message:
      "The tenant's schema could not be upgraded to the version this request needs; the operator can see why in the logs.",
  },
  campaign_not_found: { status: 404, message: "No such campaign." },
  campaign_state_conflict: {
    status: 409,
    message: "The campaign's state does not allow this; read it again and decide.",
  },
  provisioning_failed: {
    status: 502,
    message: "Provisioning could not finish; send the same create request again to resume it.",
    retryable: true,
  },
  provisioning_interrupted: {
    status: 503,
    message:
      "Provisioning was interrupted by a transient fault (the database host restarted or could not be reached); send the same create request again to resume it.",
    retryable: true,
  },
  object_unavailable: {
    status: 503,
    message:
      "A Durable Object this request needed restarted or could not be reached (a deploy, a crash, overload); the request may or may not have run. Retry.",
    retryable: true,
  },
  control_plane_unavailable: {
    status: 503,
    message: "Lessor's control plane is not reachable right now.",
    retryable: true,
  },
  protocol_violation: {
    status: 400,
    message:
      "The client broke the Postgres protocol (a malformed message, or one out of order); the connection is closed.",
  },
  prepared_statement_limit: {
    status: 400,
    message:
      "The connection holds as many named prepared statements as Lessor keeps for it (256, or 4 MiB of their text); close some (DEALLOCATE, or the driver's Close) first.",
  },
  pipeline_limit: {
    status: 413,
    message:
      "The wire client pipelined more than Lessor holds for a connection (statements behind one the server has not answered, past LESSOR_WIRE_BUFFER_BYTES); the connection is closed. Wait for answers before sending more.",
  },
  frame_limit: {
    status: 400,
    message:
      "The wire client split a message into more WebSocket frames than Lessor takes (16, and one more per 4 KiB of the message); the connection is closed.",
  },
  client_not_reading: {
    status: 400,
    message:
      "The wire client did not take the answers sent to it within LESSOR_WIRE_DRAIN_MS; the connection is closed.",
  },
  wire_lifetime: {
    status: 503,
    message:
      "The wire connection reached its lifetime (LESSOR_WIRE_MAX_LIFETIME_MS or LESSOR_WIRE_MAX_FRAMES) and was closed between transactions; open another (a pool does so by itself).",
    retryable: true,
  },
  cancel_rate_limited: {
    status: 429,
    message:
      "Too many CancelRequests from this client or for this connection; nothing was cancelled. Retry later.",
    retryable: true,
  },
  wire_upgrade_required: {
    status: 400,
    message:
      "This is the Postgres wire protocol endpoint: it takes a WebSocket upgrade, as the Neon driver's Pool and Client send it (neonConfig.wsProxy).",
  },
  misconfigured: { status: 500, message: "Lessor is misconfigured; the operator has been told in the logs." },
  internal: { status: 500, message: "Internal error." },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof errorCatalog;

/** The JSON body of every error answer (outside `/sql`'s Postgres errors). */
export interface ErrorBody {
  code: ErrorCode;
  message: string;
  /** Safe extra fields of some refusals (`erasedAt` of `tenant_erased`). */
  [detail: string]: string;
}

/** A refusal with a stable code. Throw it anywhere; `app.onError` turns it into an answer. */
export class LessorError extends Error {
  override readonly name = "LessorError";
  readonly code: ErrorCode;
  readonly status: ErrorSpec["status"];
  readonly publicMessage: string;
  readonly retryAfterSeconds: number | undefined;
  /** Safe fields the answer carries beside code and message (`erasedAt`, say). */
  readonly details: Readonly<Record<string, string>> | undefined;

  constructor(
    code: ErrorCode,
    options: {
      internal?: string;
      cause?: unknown;
      retryAfterSeconds?: number;
      publicMessage?: string;
      details?: Record<string, string>;
    } = {},
  ) {
    const spec: ErrorSpec = errorCatalog[code];
    super(options.internal ?? spec.message, { cause: options.cause });
    this.code = code;
    this.status = spec.status;
    this.publicMessage = options.publicMessage ?? spec.message;
    this.retryAfterSeconds = spec.retryable
      ? Math.max(1, Math.ceil(options.retryAfterSeconds ?? 1))
      : undefined;
    this.details = options.details;
  }

  /** The answer a caller sees. */
  body(): ErrorBody {
    return { ...this.details, code: this.code, message: this.publicMessage };
  }

  /** A plain object that crosses RPC and rebuilds the same error on the other side. */
  toWire(): WireError {
    return {
      code: this.code,
      message: this.publicMessage,
      ...(this.retryAfterSeconds === undefined ? {} : { retryAfterSeconds: this.retryAfterSeconds }),
      ...(this.details === undefined ? {} : { details: { ...this.details } }),
    };
  }

  static fromWire(wire: WireError): LessorError {
    return new LessorError(wire.code, {
      publicMessage: wire.message,
      ...(wire.retryAfterSeconds === undefined ? {} : { retryAfterSeconds: wire.retryAfterSeconds }),
      ...(wire.details === undefined ? {} : { details: wire.details }),
    });
  }
}

/** How a LessorError travels inside an RPC result. */
export interface WireError {
  code: ErrorCode;
  message: string;
  retryAfterSeconds?: number;
  details?: Record<string, string>;
}

/**
 * The SQLSTATE a refusal carries on the Postgres wire protocol (an ErrorResponse's `C`), chosen so
 * that drivers and poolers classify it as Postgres's own refusal of the same kind: 28P01/28000 for
 * authentication, 53300 and 57P03 for "try again", 57014 for a statement stopped, 54000 for a bound,
 * 57P01 for a connection ended on purpose that a pool replaces (a stale generation, a wire lifetime).
 */
export function sqlstateOf(code: ErrorCode): string {
  switch (code) {
    case "invalid_credentials":
    case "missing_credentials":
    case "invalid_connection_string":
    case "invalid_tenant_id":
      return "28P01";
    case "tenant_disabled":
    case "key_revoked":
    case "key_expired":
    case "key_scope_refused":
    case "jwt_required":
      return "28000";
    case "authentication_rate_limited":
    case "cancel_rate_limited":
    case "capacity_saturated":
    case "lease_limit":
    case "lease_timeout":
      return "53300";
    case "stale_generation":
    case "wire_lifetime":
    case "tenant_moved":
      return "57P01";
    case "statement_timeout":
      return "57014";
    case "lease_expired":
      return "57P05";
    case "lease_lost":
    case "connection_lost":
      return "08006";
    case "response_too_large":
    case "payload_too_large":
    case "prepared_statement_limit":
    case "pipeline_limit":
    case "frame_limit":
    case "client_not_reading":
      return "54000";
    case "prepared_transaction_refused":
      return "0A000";
    case "protocol_violation":
    case "invalid_request":
      return "08P01";
    case "tenant_erased":
    case "tenant_not_found":
      return "3D000";
    case "misconfigured":
    case "internal":
      return "XX000";
    default:
      return errorCatalog[code].status === 503 ? "57P03" : "XX000";
  }
}

/**
 * A refusal as the wire protocol answers it: its SQLSTATE, its public message, Lessor's stable code
 * in `detail` (what an app branches on, as `error.detail`), and for a retryable one the wait in `hint`.
 */
export function postgresFieldsOf(error: WireError, severity: "ERROR" | "FATAL"): PostgresErrorFields {
  return {
    severity,
    code: sqlstateOf(error.code),
    message: error.message,
    detail: error.code,
    ...(error.retryAfterSeconds === undefined
      ? {}
      : { hint: `Retryable: try again in ${error.retryAfterSeconds} s.` }),
  };
}

/** Headers an error answer carries. */
export function errorHeaders(error: LessorError): Record<string, string> {
  return error.retryAfterSeconds === undefined ? {} : { "Retry-After": String(error.retryAfterSeconds) };
}

/**
 * Whether `error` is a Durable Object's infrastructure failure, as a stub call reports it: the object
 * was reset (a deploy, a crash, `ctx.abort()`: `durableObjectReset`), could not be reached
 * (`retryable`), or is overloaded (`overloaded`). Errors thrown by an object's own code carry
 * `remote` instead, and are not this. Lessor's objects answer refusals as values, never as throws,
 * so an infrastructure failure is the one way a stub call rejects; the caller answers
 * `object_unavailable` (retryable), never a 500.
 */
export function durableObjectFailure(error: unknown): "reset" | "unreachable" | "overloaded" | null {
  if (typeof error !== "object" || error === null) return null;
  const flags = error as {
    durableObjectReset?: unknown;
    retryable?: unknown;
    overloaded?: unknown;
    remote?: unknown;
  };
  if (flags.remote === true) return null;
  if (flags.overloaded === true) return "overloaded";
  if (flags.durableObjectReset === true) return "reset";
  if (flags.retryable === true) return "unreachable";
  return null;
}

/** A short, secret-free description of an unknown failure, for logs. */
export function describeFailure(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code;
    return redact(`${error.name}${typeof code === "string" ? ` ${code}` : ""}: ${error.message}`).slice(
      0,
      500,
    );
  }
  if (typeof error === "object" && error !== null && "type" in error) {
    const event = error as { type?: unknown; message?: unknown; constructor?: { name?: string } };
    return redact(
      `${event.constructor?.name ?? "Event"} ${String(event.type)}: ${String(event.message ?? "")}`,
    ).slice(0, 500);
  }
  return redact(String(error)).slice(0, 500);
}
