/**
 * The tenant role's credential and what the object does with the host's admin role: unseal the
 * password for a start, repair the role's password when it drifted (the tenant set its own: the
 * start sees 28P01), and fence a dead generation (end its backends before a new one serves, so
 * none of its writes can commit after).
 */
import type { Client } from "@neondatabase/serverless";
import { loadSealedPassword, withControlPlane } from "../../control-plane/index.ts";
import type { HostReport } from "../../core/host-capabilities.ts";
import { jwtLoginRoleName } from "../../core/jwt-config.ts";
import { classifyStartFailure } from "../../core/lifecycle.ts";
import { tenantMaintenanceApplicationName } from "../../core/names.ts";
import { tunnelFaultOf } from "../../core/tunnel.ts";
import { claimsSigner, hmacPads, jwtClaimsKey, jwtLoginPassword } from "../../crypto/jwt-claims.ts";
import { loginGuardKey, loginTokenMinter } from "../../crypto/login-guard.ts";
import { unseal } from "../../crypto/seal.ts";
import { LessorError } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import type { ConnectionTarget } from "../../postgres/index.ts";
import type { TenantRecord } from "../../rpc/tenant.ts";
import { guardKeyId, type TenantCredential, tenantCredential } from "../../tenant-db/connect.ts";
import {
  type CustomerPurpose,
  setOwnPassword,
  terminateOwnBackend,
  terminateOwnBackends,
  tunnelOf,
  tunnelUnavailable,
  withCustomerSession,
} from "../../tenant-db/customer.ts";
import {
  openTenantDatabase,
  quoteIdent,
  roleExists,
  setRolePassword,
  terminateRoleBackends,
} from "../../tenant-db/host-admin.ts";
import { ensureJwtRoles, installAuthFunctions, retireClaimKeys } from "../../tenant-db/jwt-install.ts";
import { installLoginGuard } from "../../tenant-db/login-guard.ts";
import { withHostAdmin } from "../../tenant-db/maintenance.ts";
import type { TenantRuntime } from "../runtime.ts";

/** The password and the ways to connect with it. */
export interface UnsealedCredential extends TenantCredential {
  password: string;
}

/** How end-user connections log in (as `<tenant role>_jwt`), and the signer of their claims. */
export interface JwtCredential extends TenantCredential {
  password: string;
  signClaims: (backendPid: number, claims: string) => Promise<string>;
}

export class TenantCredentials {
  constructor(private readonly rt: TenantRuntime) {}

  /** Opens the sealed password of `record` and builds its credential. */
  async open(record: TenantRecord, sealed: string): Promise<UnsealedCredential> {
    const password = await unseal(this.rt.env.LESSOR_SEAL_KEY, record.tenantId, sealed);
    return this.credentialFor(record, password);
  }

  /** The credential of `password` (a rotation's new one, before it is sealed anywhere). */
  async credentialFor(record: TenantRecord, password: string): Promise<UnsealedCredential> {
    return { password, ...(await tenantCredential(this.rt.config, record, password)) };
  }

  /** The end-user login role's credential, derived from the tenant role's password. */
  async openJwt(record: TenantRecord, tenant: UnsealedCredential): Promise<JwtCredential> {
    const loginRole = jwtLoginRoleName(record.roleName);
    const password = await jwtLoginPassword(tenant.password);
    const mint = await loginTokenMinter(loginRole, await loginGuardKey(tenant.password));
    return {
      password,
      target: { ...tenant.target, user: loginRole, password },
      loginToken: () => mint(),
      signClaims: await claimsSigner(await jwtClaimsKey(tenant.password)),
    };
  }

  /**
   * Brings the end-user login role back to what it must be (an end user changed it: its password,
   * its settings, its grants): the same statements that made it, with the password of the current
   * credential.
   */
  async repairJwt(record: TenantRecord, credential: JwtCredential): Promise<void> {
    const jwt = record.jwt;
    if (!jwt) throw new LessorError("jwt_not_configured");
    await this.withHostAdmin(record, "repair", (admin, report) =>
      ensureJwtRoles(admin, {
        database: record.databaseName,
        loginRole: credential.target.user,
        secret: { password: credential.password, mode: report.verdict.passwordMode },
        connectionLimit: record.poolSize,
        role: jwt.role,
      }),
    );
    this.rt.note("jwt_credential_repaired");
    logEvent("warn", "jwt_credential_repaired", { tenant: record.tenantId });
  }

  /** Ends every backend of one of the tenant's roles through the admin role. */
  async fenceRole(record: TenantRecord, role: string, why: string): Promise<number> {
    const ended = await this.withHostAdmin(record, "fence", (admin) => terminateRoleBackends(admin, role));
    if (ended > 0) logEvent("warn", "backends_fenced", { tenant: record.tenantId, ended, why });
    return ended;
  }

  /**
   * The one path by which the role's password changes after provisioning (a rotation, and the
   * repair after 28P01): on one admin connection to the tenant's database, the password's guard key
   * and claims key are added (old keys stay, so the connections, tokens and signed claims of a
   * generation still serving keep working), the end-user login role (JWT mode) gets the password
   * derived from the new one, and then the role's own password is set. Returns the keys' id.
   */
  async changePassword(
    record: TenantRecord,
    password: string,
    purpose: "rotate" | "repair",
    /** A rotation's overlap: the role's CONNECTION LIMIT must hold both generations meanwhile. */
    connectionLimit?: number,
  ): Promise<string> {
    // A customer's database (Lessor-managed credential): the role sets its own password, as any
    // role may; there is no guard key, claims key or end-user role of Lessor's there.
    if (record.adopted) {
      await this.asCustomer(record, "rotate", (client) => setOwnPassword(client, password));
      return "";
    }
    const guardKey = await loginGuardKey(password);
    const keyId = await guardKeyId(guardKey);
    const pads = hmacPads(await jwtClaimsKey(password));
    const loginRole = jwtLoginRoleName(record.roleName);
    const jwtPassword = await jwtLoginPassword(password);
    await this.withHostAdmin(
      record,
      purpose,
      async (admin, report) => {
        const mode = report.verdict.passwordMode;
        // All or nothing: keys, limits and passwords move together.
        await admin.query("BEGIN");
        await installLoginGuard(admin, keyId, guardKey, guardPath(report));
        await installAuthFunctions(admin, keyId, pads);
        if (connectionLimit !== undefined) {
          await admin.query(
            `ALTER ROLE ${quoteIdent(record.roleName)} CONNECTION LIMIT ${Math.floor(connectionLimit)}`,
          );
        }
        if (await roleExists(admin, loginRole)) {
          // Both generations' end-user pools may be open during the overlap, each up to the pool size.
          if (connectionLimit !== undefined) {
            await admin.query(`ALTER ROLE ${quoteIdent(loginRole)} CONNECTION LIMIT ${2 * record.poolSize}`);
          }
          await setRolePassword(admin, loginRole, { password: jwtPassword, mode });
        }
        await setRolePassword(admin, record.roleName, { password, mode });
        // What the tenant role needs in its database, granted again (a repair heals a lost CONNECT).
        await openTenantDatabase(admin, record.databaseName, record.roleName);
        await admin.query("COMMIT");
      },
      undefined,
      record.databaseName,
    );
    return keyId;
  }

  /**
   * Removes every guard key and claims key but `keepKeyId` (the current password's): called once no
   * generation under an older password runs, so a rotated-out password can mint no login and sign
   * no claims, even for Lessor.
   */
  async retireGuardKeys(record: TenantRecord, keepKeyId: string): Promise<number> {
    // A customer's database holds no guard keys of Lessor's.
    if (record.adopted) return 0;
    return this.withHostAdmin(
      record,
      "rotate",
      async (admin) => {
        // The overlap is over: the role's limit is one pool and its migration connection again,
        // and the end-user login role's one pool.
        await admin.query(
          `ALTER ROLE ${quoteIdent(record.roleName)} CONNECTION LIMIT ${record.poolSize + 1}`,
        );
        const loginRole = jwtLoginRoleName(record.roleName);
        if (await roleExists(admin, loginRole)) {
          await admin.query(`ALTER ROLE ${quoteIdent(loginRole)} CONNECTION LIMIT ${record.poolSize}`);
        }
        const { rows } = await admin.query(
          "DELETE FROM lessor_guard.keys WHERE key_id OPERATOR(pg_catalog.<>) $1::pg_catalog.text RETURNING key_id",
          [keepKeyId],
        );
        await retireClaimKeys(admin, keepKeyId);
        return rows.length;
      },
      undefined,
      record.databaseName,
    );
  }

  /**
   * Runs `work` on the host's admin connection, named for `purpose`, within a slot of the host's
   * maintenance reserve (waiting at most `waitMs` for one).
   */
  private withHostAdmin<T>(
    record: TenantRecord,
    purpose: string,
    work: (admin: Client, report: HostReport) => Promise<T>,
    waitMs?: number,
    database?: string,
  ): Promise<T> {
    const host = this.rt.config.hosts.get(record.host);
    if (!host) {
      throw new LessorError("misconfigured", { internal: `tenant host ${record.host} is not configured` });
    }
    return withHostAdmin(
      this.rt.env,
      this.rt.config,
      host,
      {
        purpose,
        tenantId: record.tenantId,
        ...(waitMs === undefined ? {} : { waitMs }),
        ...(database === undefined ? {} : { database }),
      },
      work,
    );
  }

  /**
   * Proves a credential a customer supplied, before anything changes: one connection through the
   * tunnel as that role. A refusal of the server's is `credential_rejected`; a tunnel that is slow or
   * down is `tunnel_unavailable` (and its health learns it).
   */
  async proveSupplied(record: TenantRecord, password: string): Promise<void> {
    const adopted = record.adopted;
    if (!adopted) throw new LessorError("internal", { internal: "not a customer's database" });
    const credential = await this.credentialFor(record, password);
    const budget = this.rt.budget(record.host);
    try {
      await this.asCustomer(record, "prove", (client) => client.query("SELECT 1"), credential.target);
    } catch (error) {
      if (error instanceof LessorError) throw error;
      const reason = classifyStartFailure(error);
      const fault = tunnelFaultOf(reason);
      await budget.recordTunnelOutcome(record.host, fault ?? "ok").catch(() => undefined);
      if (fault) throw tunnelUnavailable(fault, 5);
      const code = (error as { code?: unknown }).code;
      if (reason === "auth_failed" || reason === "database_missing" || code === "42501") {
        throw new LessorError("credential_rejected", {
          internal: `supplied credential refused (${String(code)})`,
        });
      }
      throw error;
    }
  }

  /**
   * Runs `work` on one pinned connection to a customer's database as its role, through its tunnel,
   * within a slot of the tunnel's maintenance reserve: with `target`'s credential if given (a live
   * connection's), else with the sealed one the control plane holds.
   */
  private async asCustomer<T>(
    record: TenantRecord,
    purpose: CustomerPurpose,
    work: (client: Client) => Promise<T>,
    target?: ConnectionTarget,
    waitMs?: number,
  ): Promise<T> {
    const adopted = record.adopted;
    if (!adopted) throw new LessorError("internal", { internal: "not a customer's database" });
    let to = target;
    if (!to) {
      const sealed = await withControlPlane(this.rt.config, this.rt.env, this.rt.region, (db) =>
        loadSealedPassword(db, record.tenantId),
      );
      if (!sealed) throw new LessorError("internal", { internal: "tenant has no sealed credential" });
      to = (await this.open(record, sealed)).target;
    }
    return withCustomerSession(
      this.rt.env,
      this.rt.config,
      tunnelOf(this.rt.config, adopted),
      to,
      { purpose, tenantId: record.tenantId, ...(waitMs === undefined ? {} : { waitMs }) },
      work,
    );
  }

  /**
   * Sets the role's password back to the sealed one (as a SCRAM verifier). Lessor's password is the
   * truth: a password the tenant set for itself is simply overwritten, and the repair is recorded.
   */
  async repair(record: TenantRecord, credential: UnsealedCredential, generation: number): Promise<void> {
    // The rotation's path: the sealed password's guard key is (re)installed with it, so a repair
    // also heals a guard that lost its key (a rotation killed between its two steps).
    await this.changePassword(record, credential.password, "repair");
    this.rt.note("credential_repaired");
    logEvent("warn", "credential_repaired", { tenant: record.tenantId, generation });
  }

  /**
   * Ends one backend of the tenant's roles (its own, or its end-user login role) through the admin
   * role: a statement that would not stop. "Gone" (no such backend of those roles any more) and
   * "ended" both settle it; a backend still there after the wait, or a check that could not run,
   * does not.
   */
  async terminate(
    record: TenantRecord,
    pid: number,
    /** The connection's own target (its credential): on a customer's database the role ends its own backend. */
    target?: ConnectionTarget,
  ): Promise<"ended" | "gone" | "still_running"> {
    if (record.adopted) {
      return this.asCustomer(record, "terminate", (client) => terminateOwnBackend(client, pid), target, 500);
    }
    // The watchdog has already cut the connection: a short wait, so a busy reserve delays nothing.
    const { rows } = await this.withHostAdmin(
      record,
      "terminate",
      (admin) =>
        admin.query(
          `SELECT pg_catalog.pg_terminate_backend(a.pid, 5000) AS ended FROM pg_catalog.pg_stat_activity a
            WHERE a.pid OPERATOR(pg_catalog.=) $1::pg_catalog.int4
              AND a.usename OPERATOR(pg_catalog.=) ANY($2::pg_catalog.text[])`,
          [pid, [record.roleName, jwtLoginRoleName(record.roleName)]],
        ),
      500,
    );
    if (rows.length === 0) return "gone";
    return rows[0]?.ended === true ? "ended" : "still_running";
  }

  /**
   * Ends every backend of the role but a running migration's: called before a restarted object's
   * first generation serves, and when the role is at its connection limit with no live pool of ours.
   */
  async fence(record: TenantRecord, why: string): Promise<number> {
    const keep = [tenantMaintenanceApplicationName(record.roleName, "migrate")];
    const ended = record.adopted
      ? await this.asCustomer(record, "terminate", (client) => terminateOwnBackends(client, keep))
      : await this.withHostAdmin(record, "fence", (admin) =>
          terminateRoleBackends(admin, record.roleName, { keepApplicationNames: keep }),
        );
    if (ended > 0) {
      this.rt.note(`fenced: ${ended} backend(s) ended (${why})`);
      logEvent("warn", "backends_fenced", { tenant: record.tenantId, ended, why });
    }
    return ended;
  }
}

/**
 * How the guard's trigger is made on this host. A host configured for reduced containment that
 * cannot create event triggers gets no trigger (its report says so); any other host without a way
 * was refused by its verdict before this point.
 */
export function guardPath(report: HostReport): HostReport["facts"]["eventTriggers"] {
  return report.facts.eventTriggers;
}
