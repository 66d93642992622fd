/**
 * The tenant role's credential and what the object does with the host's admin role: unseal the
 * password for a start, repair the role's password when it drifted (the tenant set its own: the
 * start sees 28P01), and fence a dead generation (end its backends before a new one serves, so
 * none of its writes can commit after).
 */
import type { Client } from "@neondatabase/serverless";
import { jwtLoginRoleName } from "../core/jwt-config.ts";
import { tenantMaintenanceApplicationName } from "../core/names.ts";
import { claimsSigner, jwtClaimsKey, jwtLoginPassword } from "../crypto/jwt-claims.ts";
import { loginGuardKey, loginTokenMinter } from "../crypto/login-guard.ts";
import { scramVerifier } from "../crypto/scram.ts";
import { unseal } from "../crypto/seal.ts";
import { LessorError } from "../errors/index.ts";
import { logEvent } from "../log/index.ts";
import type { TenantRecord } from "../rpc/tenant.ts";
import { type TenantCredential, tenantCredential } from "../tenant-db/connect.ts";
import { setRolePassword, terminateRoleBackends } from "../tenant-db/host-admin.ts";
import { withHostAdmin } from "../tenant-db/maintenance.ts";
import type { TenantRuntime } from "./runtime.ts";

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

  /** Sets the end-user login role's password back (an end user changed it). */
  async repairJwt(record: TenantRecord, credential: JwtCredential): Promise<void> {
    const verifier = await scramVerifier(credential.password);
    await this.withHostAdmin(record, "repair", (admin) =>
      setRolePassword(admin, credential.target.user, verifier),
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
   * Runs `work` on the host's admin connection, named for `purpose`, within a slot of the host's
   * maintenance reserve (waiting at most `waitMs` for one).
   */
  private withHostAdmin<T>(
    record: TenantRecord,
    purpose: string,
    work: (admin: Client) => Promise<T>,
    waitMs?: number,
  ): Promise<T> {
    const host = this.rt.config.hosts.get(record.host);
    if (!host) {
      throw new LessorError("misconfigured", { internal: `tenant host ${record.host} is not configured` });
    }
    return withHostAdmin(
      this.rt.env,
      this.rt.config,
      host,
      { purpose, tenantId: record.tenantId, ...(waitMs === undefined ? {} : { waitMs }) },
      work,
    );
  }

  /**
   * Sets the role's password back to the sealed one (as a SCRAM verifier). Lessor's password is the
   * truth: a password the tenant set for itself is simply overwritten, and the repair is recorded.
   */
  async repair(record: TenantRecord, credential: UnsealedCredential, generation: number): Promise<void> {
    const verifier = await scramVerifier(credential.password);
    await this.withHostAdmin(record, "repair", (admin) => setRolePassword(admin, record.roleName, verifier));
    this.rt.note("credential_repaired");
    logEvent("warn", "credential_repaired", { tenant: record.tenantId, generation });
  }

  /**
   * Ends one backend of the tenant's roles (its own, or its end-user login role) through the admin
   * role: a statement that would not stop.
   */
  async terminate(record: TenantRecord, pid: number): Promise<boolean> {
    // The watchdog has already cut the connection: a short wait, so a busy reserve delays nothing.
    const { rows } = await this.withHostAdmin(
      record,
      "terminate",
      (admin) =>
        admin.query(
          "SELECT pg_terminate_backend(pid, 5000) AS ended FROM pg_stat_activity WHERE pid = $1 AND usename = ANY($2::text[])",
          [pid, [record.roleName, jwtLoginRoleName(record.roleName)]],
        ),
      500,
    );
    return rows[0]?.ended === true;
  }

  /**
   * Ends every backend of the role but a running migration's: called before a restarted object's
   * first generation serves, and when the role is at its connection limit with no live pool of ours.
   */
  async fence(record: TenantRecord, why: string): Promise<number> {
    const ended = await this.withHostAdmin(record, "fence", (admin) =>
      terminateRoleBackends(admin, record.roleName, {
        keepApplicationNames: [tenantMaintenanceApplicationName(record.roleName, "migrate")],
      }),
    );
    if (ended > 0) {
      this.rt.note(`fenced: ${ended} backend(s) ended (${why})`);
      logEvent("warn", "backends_fenced", { tenant: record.tenantId, ended, why });
    }
    return ended;
  }
}
