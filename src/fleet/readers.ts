/**
 * Fleet-wide reads of the control plane for the operator's surface (status page, `/metrics`,
 * `lessorctl`): failing tenants, recent lifecycle events, tenant search, and counts by closed
 * sets (catalog status and tier, campaign and campaign-tenant state). Every list is bounded; every
 * count is a `GROUP BY` over a closed set, so nothing here grows with the number of tenants except
 * the work the database does.
 *
 * Failing tenants are found from the append-only lifecycle events, because a failed pool holds no
 * capacity and so is unknown to the BudgetObjects: a tenant is failing when its latest event within
 * the window moved it to `failed`. Events reach the control plane through the tenant's outbox, so a
 * failure shows up here at most one heartbeat (30 s) after it happened.
 */
import { sql } from "drizzle-orm";
import type { ControlPlane } from "../control-plane/index.ts";
import { type CampaignState, campaignStates, type TenantState, tenantStates } from "../core/campaign.ts";

/** How far back a `failed` event still makes its tenant count as failing, by default. */
export const defaultFailingWindowMs = 24 * 60 * 60 * 1000;

/** A tenant whose latest lifecycle event (within the window) moved its pool to `failed`. */
export interface FailingTenantEvent {
  tenantId: string;
  host: string | null;
  tier: string | null;
  generation: number;
  /** The classified failure (`unreachable`, `auth_failed`, `database_missing`, …). */
  reason: string;
  failedAt: string;
}

/** A lifecycle event of any tenant, for the fleet's recent history. */
export interface FleetEvent {
  tenantId: string;
  seq: number;
  generation: number;
  from: string;
  to: string;
  reason: string;
  at: string;
}

function num(value: unknown): number {
  return typeof value === "number" ? value : Number(value ?? 0);
}

function text(value: unknown): string {
  return typeof value === "string" ? value : String(value ?? "");
}

function isoFromMs(value: unknown): string {
  return new Date(num(value)).toISOString();
}

/**
 * Tenants failing now (latest event in the window is `→ failed`), most recent failure first, at
 * most `limit` of them, and how many there are in all.
 */
export async function readFailingTenants(
  db: ControlPlane,
  options: { windowMs: number; limit: number },
): Promise<{ count: number; tenants: FailingTenantEvent[] }> {
  const { rows } = await db.execute<Record<string, unknown>>(sql`
    WITH latest AS (
      SELECT DISTINCT ON (e.tenant_id) e.tenant_id, e.generation, e.to_state, e.reason, e.at
        FROM lifecycle_events e
       WHERE e.at > now() - make_interval(secs => ${options.windowMs / 1000})
       ORDER BY e.tenant_id, e.seq DESC
    ), failing AS (
      SELECT l.*, t.host, t.tier FROM latest l LEFT JOIN tenants t ON t.id = l.tenant_id
       WHERE l.to_state = 'failed'
    )
    SELECT tenant_id, host, tier, generation, reason,
           (extract(epoch FROM at) * 1000)::float8 AS at_ms,
           count(*) OVER ()::float8 AS total
      FROM failing
     ORDER BY at DESC, tenant_id
     LIMIT ${options.limit}`);
  return {
    count: num(rows[0]?.total),
    tenants: rows.map((row) => ({
      tenantId: text(row.tenant_id),
      host: row.host === null || row.host === undefined ? null : text(row.host),
      tier: row.tier === null || row.tier === undefined ? null : text(row.tier),
      generation: num(row.generation),
      reason: text(row.reason),
      failedAt: isoFromMs(row.at_ms),
    })),
  };
}

/** Failing tenants per host (closed set: the configured hosts), for `/metrics`. */
export async function countFailingByHost(db: ControlPlane, windowMs: number): Promise<Map<string, number>> {
  const { rows } = await db.execute<Record<string, unknown>>(sql`
    WITH latest AS (
      SELECT DISTINCT ON (e.tenant_id) e.tenant_id, e.to_state
        FROM lifecycle_events e
       WHERE e.at > now() - make_interval(secs => ${windowMs / 1000})
       ORDER BY e.tenant_id, e.seq DESC
    )
    SELECT coalesce(t.host, '') AS host, count(*)::float8 AS n
      FROM latest l LEFT JOIN tenants t ON t.id = l.tenant_id
     WHERE l.to_state = 'failed'
     GROUP BY 1`);
  return new Map(rows.map((row) => [text(row.host), num(row.n)]));
}

/**
 * The fleet's lifecycle events, newest first, paged. The cursor is the previous page's last
 * `(at, tenant, seq)`, so a page never repeats or skips an event that arrived meanwhile.
 */
export async function readRecentEvents(
  db: ControlPlane,
  options: { limit: number; before: { atMs: number; tenantId: string; seq: number } | null },
): Promise<{ events: FleetEvent[]; nextCursor: string | null }> {
  const before = options.before;
  const { rows } = await db.execute<Record<string, unknown>>(sql`
    SELECT tenant_id, seq, generation, from_state, to_state, reason,
           (extract(epoch FROM at) * 1000)::float8 AS at_ms, at::text AS at_exact
      FROM lifecycle_events
     WHERE ${before === null}
        OR (at, tenant_id, seq) < (to_timestamp(${before?.atMs ?? 0} / 1000.0), ${before?.tenantId ?? ""}, ${before?.seq ?? 0})
     ORDER BY at DESC, tenant_id DESC, seq DESC
     LIMIT ${options.limit + 1}`);
  const page = rows.slice(0, options.limit);
  const last = page.at(-1);
  return {
    events: page.map((row) => ({
      tenantId: text(row.tenant_id),
      seq: num(row.seq),
      generation: num(row.generation),
      from: text(row.from_state),
      to: text(row.to_state),
      reason: text(row.reason),
      at: isoFromMs(row.at_ms),
    })),
    nextCursor:
      rows.length > options.limit && last
        ? `${num(last.at_ms)}.${text(last.tenant_id)}.${num(last.seq)}`
        : null,
  };
}

/** Parses a cursor `readRecentEvents` handed out; null for anything else. */
export function parseEventCursor(raw: string): { atMs: number; tenantId: string; seq: number } | null {
  const match = /^([0-9]{1,16}(?:\.[0-9]{1,6})?)\.([a-z0-9][a-z0-9-]{0,39})\.([0-9]{1,18})$/.exec(raw);
  if (!match) return null;
  const atMs = Number(match[1]);
  const seq = Number(match[3]);
  const tenantId = match[2] ?? "";
  return Number.isFinite(atMs) && Number.isSafeInteger(seq) ? { atMs, tenantId, seq } : null;
}

/** Tenant ids starting with `prefix`, in order, at most `limit`: a search, never the whole catalog. */
export async function searchTenants(
  db: ControlPlane,
  prefix: string,
  limit: number,
): Promise<{ id: string; status: string; tier: string; host: string }[]> {
  // Tenant ids are slugs ([a-z0-9-]), so the prefix carries no LIKE wildcard.
  const { rows } = await db.execute<Record<string, unknown>>(sql`
    SELECT id, status, tier, host FROM tenants
     WHERE id >= ${prefix} AND id LIKE ${`${prefix}%`}
     ORDER BY id LIMIT ${limit}`);
  return rows.map((row) => ({
    id: text(row.id),
    status: text(row.status),
    tier: text(row.tier),
    host: text(row.host),
  }));
}

/** Catalog tenants by (host, tier, status). */
export async function countTenants(
  db: ControlPlane,
): Promise<{ host: string; tier: string; status: string; count: number }[]> {
  const { rows } = await db.execute<Record<string, unknown>>(sql`
    SELECT host, tier, status, count(*)::float8 AS n FROM tenants GROUP BY 1, 2, 3`);
  return rows.map((row) => ({
    host: text(row.host),
    tier: text(row.tier),
    status: text(row.status),
    count: num(row.n),
  }));
}

/** Campaigns by state, and the tenants of unfinished campaigns by their state. */
export async function countCampaigns(db: ControlPlane): Promise<{
  campaigns: Record<CampaignState, number>;
  tenants: Record<TenantState, number>;
}> {
  const { rows: campaignRows } = await db.execute<Record<string, unknown>>(sql`
    SELECT state, count(*)::float8 AS n FROM campaigns GROUP BY 1`);
  const { rows: tenantRows } = await db.execute<Record<string, unknown>>(sql`
    SELECT ct.state, count(*)::float8 AS n
      FROM campaign_tenants ct JOIN campaigns c ON c.id = ct.campaign_id
     WHERE c.state IN ('pending', 'canary', 'rollout', 'paused')
     GROUP BY 1`);
  const campaigns = Object.fromEntries(campaignStates.map((s) => [s, 0])) as Record<CampaignState, number>;
  for (const row of campaignRows) {
    const state = campaignStates.find((s) => s === row.state);
    if (state) campaigns[state] = num(row.n);
  }
  const tenants = Object.fromEntries(tenantStates.map((s) => [s, 0])) as Record<TenantState, number>;
  for (const row of tenantRows) {
    const state = tenantStates.find((s) => s === row.state);
    if (state) tenants[state] = num(row.n);
  }
  return { campaigns, tenants };
}
