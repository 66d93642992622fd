/**
 * Opening a generation's connections, apart from the pool's bookkeeping (pool.ts): the start's one
 * control-plane session (claim the generation, hand over events, load the sealed credential), the
 * driver pool under the generation's name, the first connection that proves it (repairing a drifted
 * password or fencing a dead generation's backends, once), and the dedicated maintenance connection
 * a migration runs on.
 */
import type { Client, Pool } from "@neondatabase/serverless";
import {
  appendGeneration,
  appendLifecycleEvents,
  highestGeneration,
  loadSealedPassword,
  withControlPlane,
} from "../../control-plane/index.ts";
import { skipGeneration } from "../../core/lifecycle.ts";
import {
  lessorApplicationPrefix,
  poolApplicationName,
  tenantMaintenanceApplicationName,
} from "../../core/names.ts";
import { LessorError } from "../../errors/index.ts";
import { logEvent } from "../../log/index.ts";
import { endPool, openPool, underDeadline, withTenantConnection } from "../../postgres/index.ts";
import type { OpeningGate } from "../../postgres/opening-gate.ts";
import type { TenantRecord } from "../../rpc/tenant.ts";
import { migrationLimits, migrationSettings, sessionLimits } from "../../tenant-db/connect.ts";
import { withMaintenanceSlot } from "../../tenant-db/maintenance.ts";
import type { TenantRuntime } from "../runtime.ts";
import { wasEndedOnPurpose } from "./connection-state.ts";
import type { TenantCredentials, UnsealedCredential } from "./credentials.ts";

/**
 * Ends every other backend of the connection's own role but those named in `$1` (a role may end its
 * own backends), waiting for each to go: the fence of a restarted object's first connection, and of
 * an end-user pool's. Every name is schema-qualified: it runs as the tenant's role, in a database
 * whose `public` the tenant fills, under whatever `search_path` the tenant gave its role.
 */
export const ownBackendsFenceSql = `
SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(a.pid, 5000))::pg_catalog.int4 AS ended
  FROM pg_catalog.pg_stat_activity a
 WHERE a.usename OPERATOR(pg_catalog.=) CURRENT_USER
   AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
   AND NOT (COALESCE(a.application_name, '') OPERATOR(pg_catalog.=) ANY($1::pg_catalog.text[]))`;

/**
 * The fence on a customer's database (adopted): as `ownBackendsFenceSql`, but only Lessor's own
 * backends of the role (`lessor:<role>:…`, `$2`): the role is the customer's, and their own sessions
 * under it are none of Lessor's business. (Through a tunnel, a dead generation's backends also end
 * on their own within a second of its sockets: `client_connection_check_interval`.)
 */
export const ownLessorBackendsFenceSql = `
SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(a.pid, 5000))::pg_catalog.int4 AS ended
  FROM pg_catalog.pg_stat_activity a
 WHERE a.usename OPERATOR(pg_catalog.=) CURRENT_USER
   AND a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
   AND pg_catalog.starts_with(COALESCE(a.application_name, ''), $2::pg_catalog.text)
   AND NOT (COALESCE(a.application_name, '') OPERATOR(pg_catalog.=) ANY($1::pg_catalog.text[]))`;

export class GenerationOpener {
  constructor(
    private readonly rt: TenantRuntime,
    private readonly credentials: TenantCredentials,
    /** A pooled connection of `generation` failed outside any checkout. */
    private readonly onPoolError: (generation: number, error: Error) => void,
    /** The object's bound on connections opening at once, shared by every pool it opens. */
    readonly openingGate: OpeningGate,
  ) {}

  /**
   * One control-plane session for a start: claims the lifecycle's generation in the insert-only
   * ledger (moving past a number another start took), hands over the pending lifecycle events, and
   * loads the sealed credential.
   */
  async claimGeneration(record: TenantRecord): Promise<string> {
    const rt = this.rt;
    const sealed = await withControlPlane(rt.config, rt.env, rt.region, async (db) => {
      for (
        let tries = 0;
        !(await appendGeneration(db, record.tenantId, rt.lifecycle.generation, record.poolSize));
        tries++
      ) {
        if (tries >= 3) {
          throw new LessorError("internal", { internal: "generation ledger kept conflicting" });
        }
        rt.apply(
          skipGeneration(rt.lifecycle, await highestGeneration(db, record.tenantId)),
          "generation_taken",
        );
      }
      const events = rt.storage.pendingEvents();
      await appendLifecycleEvents(db, record.tenantId, events);
      const last = events.at(-1);
      if (last) rt.storage.forgetEvents(last.seq);
      return loadSealedPassword(db, record.tenantId);
    });
    if (!sealed) throw new LessorError("internal", { internal: "tenant has no sealed credential" });
    return sealed;
  }

  /** The generation's driver pool, holding at most `max` connections (its allowance; adaptive pools move it). */
  open(record: TenantRecord, generation: number, credential: UnsealedCredential, max: number): Pool {
    return openPool(this.rt.config, credential.target, {
      max,
      applicationName: poolApplicationName(record.roleName, generation),
      limits: sessionLimits(this.rt.config),
      loginToken: credential.loginToken,
      openingGate: this.openingGate,
      onError: (error, client) => {
        if (!wasEndedOnPurpose(client)) this.onPoolError(generation, error);
      },
    });
  }

  /**
   * Opens the pool's first connection. Two refusals have a cure Lessor applies itself, once: a
   * password that drifted (28P01: the tenant set its own) or a CONNECT that did (42501) is repaired
   * through the admin role, and a
   * role at its connection limit with no live pool of ours (53300: backends a dead generation left)
   * is fenced.
   */
  async prove(
    pool: Pool,
    record: TenantRecord,
    generation: number,
    credential: UnsealedCredential,
    max: number,
  ): Promise<Pool> {
    try {
      await this.firstQuery(pool, record);
      return pool;
    } catch (error) {
      const code = (error as { code?: unknown }).code;
      if (code !== "28P01" && code !== "42501" && code !== "53300") throw error;
      // A customer's database: its role is the customer's, so Lessor repairs and fences nothing
      // there; the start fails and says why (a refused credential is `credential_revoked`).
      if (record.adopted) throw error;
      await endPool(pool);
      // A password or a CONNECT that drifted: the repair sets both back.
      if (code === "28P01" || code === "42501") await this.credentials.repair(record, credential, generation);
      else await this.credentials.fence(record, "role connection limit reached");
      const retried = this.open(record, generation, credential, max);
      try {
        await this.firstQuery(retried, record);
      } catch (again) {
        await endPool(retried);
        throw again;
      }
      return retried;
    }
  }

  /**
   * The pool's first query. After a restart with a live generation, that generation's backends may
   * still be writing: the role ends them itself (a role may terminate its own backends) and waits
   * for them to go, so none of their writes can commit once this generation serves.
   */
  private async firstQuery(pool: Pool, record: TenantRecord): Promise<void> {
    if (!this.rt.fencePending) {
      await pool.query("SELECT 1");
      return;
    }
    const keep = [tenantMaintenanceApplicationName(record.roleName, "migrate")];
    const { rows } = record.adopted
      ? await pool.query(ownLessorBackendsFenceSql, [keep, `${lessorApplicationPrefix}${record.roleName}:`])
      : await pool.query(ownBackendsFenceSql, [keep]);
    const ended = Number(rows[0]?.ended ?? 0);
    if (ended > 0) {
      this.rt.note(`fenced: ${ended} backend(s) of the dead generation ended`);
      logEvent("warn", "backends_fenced", { tenant: record.tenantId, ended });
    }
    this.rt.clearFence();
  }

  /**
   * A connection outside the pool, for maintenance (migrations): it holds a slot of the host's
   * maintenance reserve while open (`maintenance_busy` if none comes within the admission wait),
   * and its work is cancelled at the migration deadline rather than left running.
   */
  async withDedicatedConnection<T>(
    record: TenantRecord,
    purpose: "migrate",
    work: (client: Client) => Promise<T>,
  ): Promise<T> {
    const config = this.rt.config;
    const sealed = await withControlPlane(config, this.rt.env, this.rt.region, (db) =>
      loadSealedPassword(db, record.tenantId),
    );
    if (!sealed) throw new LessorError("internal", { internal: "tenant has no sealed credential" });
    const credential = await this.credentials.open(record, sealed);
    return withMaintenanceSlot(
      this.rt.env,
      config,
      record.host,
      {
        purpose,
        tenantId: record.tenantId,
        deadlineMs: config.migrationTimeoutMs,
        held: this.rt.maintenanceHeld,
      },
      () =>
        withTenantConnection(
          config,
          credential.target,
          {
            applicationName: tenantMaintenanceApplicationName(record.roleName, purpose),
            limits: migrationLimits(config),
            loginToken: credential.loginToken,
            extraSettings: migrationSettings,
          },
          (client) =>
            underDeadline(config, credential.target, client, config.migrationTimeoutMs, () => work(client)),
        ),
    );
  }
}
