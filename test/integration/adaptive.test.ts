/**
 * Adaptive admission (docs/adr/022-adaptive-admission.md) in workerd against the real Postgres, on
 * the `adaptive` host: connections 12, reserve 2, so pools share 10; a floor of 1, growth one
 * connection at a time, a window of 2 s. Tier `elastic` starts at 2 and may grow to 6.
 *
 * Every test runs a sampler: the ledger (allocated + reserved + draining, every ~50 ms) and the
 * backends Postgres itself saw (its connection log, server-log.ts, exact at every moment). Neither
 * may ever pass the budget: pools within 10, maintenance within the reserve of 2, all within 12.
 *
 * The host's budget is shared by every test here: each starts from an empty ledger and leaves one.
 */
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { budgetHooksForTests } from "../../src/budget-object/test-hooks.ts";
import type { CapacityStatus } from "../../src/rpc/budget.ts";
import type { PoolSizeStatus } from "../../src/rpc/tenant.ts";
import { type GrowStep, tenantHooksForTests } from "../../src/tenant-object/test-hooks.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  mapConcurrent,
  pollUntil,
  sqlRequest,
  tenantBackends,
  uniqueTenantId,
} from "./harness.ts";
import { type BackendClass, type ConnectionPeaks, connectionPeaks, markServerLog } from "./server-log.ts";

const host = "adaptive";
const poolCapacity = 10;
const connections = 12;
const reserve = 2;
const filePrefix = uniqueTenantId("adp");
const fileTenants = new Map<string, CreatedTenant>();
const created: CreatedTenant[] = [];
const heldLeases = new Map<string, string>();

type Tier = "elastic" | "standard" | "free";

async function newTenant(tag: string, tier: Tier): Promise<CreatedTenant> {
  const tenant = await createTenant(`${filePrefix}-${tag}`, { host, tier });
  fileTenants.set(tenant.id, tenant);
  created.push(tenant);
  return tenant;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function fileRoles(): string[] {
  return [...fileTenants.values()].map((t) => t.role);
}

// ── Looking at the host ─────────────────────────────────────────────────────────────────────────

async function capacity(): Promise<CapacityStatus> {
  const response = await admin("/v1/capacity");
  if (response.status !== 200) throw new Error(`capacity: ${response.status} ${await response.text()}`);
  const { hosts } = await response.json<{ hosts: CapacityStatus[] }>();
  const status = hosts.find((h) => h.host === host);
  if (!status) throw new Error("capacity lists no adaptive host");
  return status;
}

function ledgerUsed(status: CapacityStatus): number {
  return status.allocated + status.reserved + status.draining;
}

function isEmptyLedger(status: CapacityStatus): boolean {
  return ledgerUsed(status) === 0 && status.waiters === 0;
}

/** The ledger's rows of one tenant: generation and size (what the budget holds for it). */
async function ledgerRows(tenant: CreatedTenant): Promise<{ generation: number; size: number }[]> {
  const report = await env.BUDGETS.getByName(host).evictionReport(host, 1);
  return report.pools
    .filter((p) => p.tenantId === tenant.id)
    .map((p) => ({ generation: p.generation, size: p.size }))
    .sort((a, b) => a.generation - b.generation);
}

interface Runtime {
  state: string;
  generation: number;
  leases: number;
  pool: PoolSizeStatus | null;
}

async function runtime(tenant: CreatedTenant): Promise<Runtime> {
  const response = await admin(`/v1/tenants/${tenant.id}`);
  if (response.status !== 200) throw new Error(`status ${tenant.id}: ${response.status}`);
  return (await response.json<{ runtime: Runtime }>()).runtime;
}

async function poolSize(tenant: CreatedTenant): Promise<number | null> {
  return (await runtime(tenant)).pool?.size ?? null;
}

interface Samples {
  /** Connections allowed past the budget: a credential rotation's overlap (the rotation reserve, ADR 013). */
  overlap: number;
  count: number;
  maxLedger: number;
  violations: string[];
  peaks: ConnectionPeaks;
}

function classifyBackend({ user, app }: { user: string; app: string }): BackendClass | null {
  if (app.startsWith(`lessor:host:${host}:`)) return "maintenance";
  if (!fileRoles().includes(user) || !app.startsWith(`lessor:${user}:`)) return null;
  return /^[0-9]+$/.test(app.slice(`lessor:${user}:`.length)) ? "pool" : "maintenance";
}

/** Samples the ledger every ~50 ms until stopped, and counts Postgres's backends exactly (server log). */
async function startSampler(overlap = 0): Promise<{ stop: () => Promise<Samples> }> {
  const samples: Samples = {
    overlap,
    count: 0,
    maxLedger: 0,
    violations: [],
    peaks: { pool: 0, maintenance: 0, total: 0, atPeak: [], opened: 0 },
  };
  const from = await markServerLog();
  let running = true;
  const done = (async () => {
    for (let i = 0; (running || samples.count === 0) && i < 4_000; i++) {
      const status = await capacity();
      const used = ledgerUsed(status);
      samples.count++;
      samples.maxLedger = Math.max(samples.maxLedger, used);
      if (used > poolCapacity + overlap) {
        samples.violations.push(
          `ledger ${used} > ${poolCapacity} + ${overlap}: allocated ${status.allocated} reserved ${status.reserved} draining ${status.draining}`,
        );
      }
      await sleep(50);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await done;
      const to = await markServerLog();
      samples.peaks = await connectionPeaks(
        from,
        to,
        { users: fileRoles(), appPatterns: [`lessor:host:${host}:%`] },
        classifyBackend,
      );
      return samples;
    },
  };
}

function expectWithinBudget(samples: Samples): void {
  expect(samples.violations).toEqual([]);
  expect(samples.count).toBeGreaterThan(0);
  expect(samples.maxLedger).toBeLessThanOrEqual(poolCapacity + samples.overlap);
  const { peaks } = samples;
  expect(peaks.pool, `pooled backends at once: ${JSON.stringify(peaks)}`).toBeLessThanOrEqual(
    poolCapacity + samples.overlap,
  );
  expect(peaks.maintenance, `maintenance backends: ${JSON.stringify(peaks)}`).toBeLessThanOrEqual(reserve);
  expect(peaks.total, `backends at once: ${JSON.stringify(peaks)}`).toBeLessThanOrEqual(
    connections + samples.overlap,
  );
}

/** Backends of one tenant's pools Postgres has now. */
async function backendCount(tenant: CreatedTenant): Promise<number> {
  return (await tenantBackends(tenant)).length;
}

// ── Talking to Lessor ───────────────────────────────────────────────────────────────────────────

interface Outcome {
  tenant: string;
  status: number;
  code: string | null;
  retryAfter: string | null;
  app: string | null;
  db: string | null;
}

async function probe(tenant: CreatedTenant, sleepSeconds = 0): Promise<Outcome> {
  const response = await sqlRequest(tenant.connectionString, {
    query: `SELECT current_setting('application_name'), current_database(), pg_sleep(${sleepSeconds})`,
    params: [],
  });
  const text = await response.text();
  const outcome: Outcome = {
    tenant: tenant.id,
    status: response.status,
    code: null,
    retryAfter: response.headers.get("Retry-After"),
    app: null,
    db: null,
  };
  if (response.status === 200) {
    const body = JSON.parse(text) as { rows: (string | null)[][] };
    outcome.app = body.rows[0]?.[0] ?? null;
    outcome.db = body.rows[0]?.[1] ?? null;
  } else {
    outcome.code = (JSON.parse(text) as { code?: string }).code ?? text.slice(0, 200);
  }
  return outcome;
}

/** Anything but a correct answer from the tenant's own database, or a 503 capacity_saturated with Retry-After. */
function problemsOf(outcome: Outcome): string[] {
  if (outcome.status === 200) {
    const tenant = fileTenants.get(outcome.tenant);
    const ok =
      tenant !== undefined &&
      outcome.db === tenant.database &&
      (outcome.app ?? "").startsWith(`lessor:${tenant.role}:`);
    return ok ? [] : [`${outcome.tenant} was served by ${outcome.app} on ${outcome.db}`];
  }
  if (outcome.status === 503 && outcome.code === "capacity_saturated" && Number(outcome.retryAfter) >= 1) {
    return [];
  }
  return [`${outcome.tenant}: ${outcome.status} ${outcome.code} Retry-After=${outcome.retryAfter}`];
}

/** `n` requests of `sleepSeconds` each, `concurrency` at a time. */
function burst(
  tenant: CreatedTenant,
  n: number,
  concurrency: number,
  sleepSeconds: number,
): Promise<Outcome[]> {
  return mapConcurrent(
    Array.from({ length: n }, (_, i) => i),
    concurrency,
    () => probe(tenant, sleepSeconds),
  );
}

/**
 * Keeps `concurrency` requests of `sleepSeconds` in flight on `tenant` until `done()` says so (at
 * most about `limit` requests): a load that lasts until the test has seen what it makes happen, not
 * as long as a burst of a fixed number of requests takes on this machine.
 */
async function loadUntil(
  tenant: CreatedTenant,
  concurrency: number,
  sleepSeconds: number,
  done: () => boolean,
  limit = 1_000,
): Promise<Outcome[]> {
  const outcomes: Outcome[] = [];
  async function worker(): Promise<void> {
    while (!done() && outcomes.length < limit) outcomes.push(await probe(tenant, sleepSeconds));
  }
  await Promise.all(Array.from({ length: concurrency }, worker));
  return outcomes;
}

/**
 * Requests of 0.2 s, `concurrency` at a time, until the pool's size satisfies `grown` (bounded):
 * checkouts wait while the pool is smaller than the load, and it grows step by step. Every answer
 * must be correct or a saturation; returns the size last read.
 */
async function grownUnderLoad(
  tenant: CreatedTenant,
  concurrency: number,
  grown: (size: number) => boolean,
): Promise<number | null> {
  let loading = true;
  const load = loadUntil(tenant, concurrency, 0.2, () => !loading);
  const size = await pollUntil(
    () => poolSize(tenant),
    (s) => grown(s ?? 0),
    { attempts: 200, intervalMs: 100 },
  ).finally(() => {
    loading = false;
  });
  const outcomes = await load;
  expect(outcomes.length).toBeGreaterThan(0);
  expect(outcomes.flatMap(problemsOf)).toEqual([]);
  return size;
}

async function openLease(tenant: CreatedTenant): Promise<string> {
  const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs: 60_000 }),
  });
  if (response.status !== 201)
    throw new Error(`lease ${tenant.id}: ${response.status} ${await response.text()}`);
  const body = await response.json<{ lease: string }>();
  heldLeases.set(body.lease, tenant.key);
  return body.lease;
}

/** The backend pid a session lease's connection runs on (a lease in use keeps its connection). */
async function leasePid(token: string): Promise<string> {
  const key = heldLeases.get(token) ?? "";
  const response = await lessor(`/v1/leases/${token}/sql`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ query: "SELECT pg_backend_pid()::text", params: [] }),
  });
  if (response.status !== 200) throw new Error(`lease sql: ${response.status} ${await response.text()}`);
  const body = await response.json<{ rows: (string | null)[][] }>();
  return body.rows[0]?.[0] ?? "";
}

async function releaseLease(token: string): Promise<void> {
  const key = heldLeases.get(token);
  heldLeases.delete(token);
  if (key === undefined) return;
  const response = await lessor(`/v1/leases/${token}`, {
    method: "DELETE",
    headers: { Authorization: `Bearer ${key}` },
  });
  await response.body?.cancel();
}

// ── Each test starts from an empty ledger and leaves one behind ─────────────────────────────────

beforeEach(async () => {
  const status = await capacity();
  expect(isEmptyLedger(status), `ledger at start: ${JSON.stringify(status)}`).toBe(true);
  expect(status.adaptive.enabled).toBe(true);
});

afterEach(async () => {
  tenantHooksForTests.config = undefined;
  tenantHooksForTests.onGrowStep = undefined;
  tenantHooksForTests.holdReview = undefined;
  budgetHooksForTests.admissionWaitMs = undefined;
  await mapConcurrent([...heldLeases.keys()], 8, (token) => releaseLease(token));
  const tenants = created.splice(0);
  const drainAll = () =>
    mapConcurrent(tenants, 8, async (tenant) => {
      const response = await admin(`/v1/tenants/${tenant.id}/drain`, {
        method: "POST",
        json: { force: true },
      });
      await response.body?.cancel();
    });
  await drainAll();
  let drained = await pollUntil(capacity, isEmptyLedger, { attempts: 40, intervalMs: 100 });
  for (let round = 0; round < 5 && !isEmptyLedger(drained); round++) {
    await sleep(1_000);
    await drainAll();
    await env.BUDGETS.getByName(host).reconcile(host, 0);
    drained = await capacity();
  }
  expect(isEmptyLedger(drained), `ledger after drain: ${JSON.stringify(drained)}`).toBe(true);
});

// ── The tests ───────────────────────────────────────────────────────────────────────────────────

describe("adaptive admission", () => {
  it("a pool grows under waiting load, one admitted step at a time up to its tier's maximum, and shrinks when idle", async () => {
    const hot = await newTenant("grow", "elastic");
    // The pool's own review gives nothing back until the test lets it: a loaded machine's pause of a
    // window (2 s) between two steps would otherwise shrink it before the burst or before it is read.
    let held = true;
    tenantHooksForTests.holdReview = (id) => held && id === hot.id;
    const before = await capacity();
    const sampler = await startSampler();
    let samples: Samples;
    try {
      expect(problemsOf(await probe(hot))).toEqual([]);
      const started = await runtime(hot);
      expect(started.pool).toMatchObject({ adaptive: true, size: 2, start: 2, floor: 1, max: 6 });
      expect(await ledgerRows(hot)).toEqual([{ generation: started.generation, size: 2 }]);

      // Twelve requests at once on a pool of 2: checkouts wait, and the pool grows to its maximum. The
      // waits count over the last window only, so the load goes on until the status has shown the pool
      // at its maximum with its waits (bounded), however long each request takes on this machine.
      let loading = true;
      const load = loadUntil(hot, 12, 0.2, () => !loading);
      const grown = await pollUntil(
        () => runtime(hot),
        (r) => r.pool?.size === 6 && (r.pool.observed?.waits ?? 0) > 0,
        { attempts: 200, intervalMs: 100 },
      ).finally(() => {
        loading = false;
      });
      const outcomes = await load;
      expect(outcomes.length).toBeGreaterThan(0);
      expect(outcomes.flatMap(problemsOf)).toEqual([]);
      expect(grown.pool?.size).toBe(6);
      expect(grown.pool?.observed?.peak).toBeGreaterThanOrEqual(6);
      expect(grown.pool?.observed?.waits).toBeGreaterThan(0);
      expect(await ledgerRows(hot)).toEqual([{ generation: started.generation, size: 6 }]);
      const afterGrowth = await capacity();
      // Four growths of one connection each, all admitted (nothing else on the host).
      expect(afterGrowth.adaptive.growths - before.adaptive.growths).toBe(4);
      expect(afterGrowth.pooled.grown).toBe(4);
      // /metrics shows it by host, and names no tenant.
      const metrics = await (await admin("/metrics")).text();
      const granted =
        /^lessor_pool_growths_total\{region="default",host="adaptive",outcome="granted"\} (\d+)$/m.exec(
          metrics,
        );
      expect(Number(granted?.[1])).toBe(afterGrowth.adaptive.growths);
      expect(metrics).toMatch(
        /^lessor_pool_resized_connections\{region="default",host="adaptive",direction="grown"\} 4$/m,
      );
      expect(metrics).toMatch(
        /^lessor_pooled_connections\{region="default",host="adaptive",use="idle"\} \d+$/m,
      );
      expect(metrics).toMatch(/^lessor_config_adaptive\{region="default",host="adaptive"\} 1$/m);
      expect(metrics).toMatch(/^lessor_config_pool_max\{tier="elastic"\} 6$/m);
      expect(metrics).not.toContain(hot.id);
      expect(metrics).not.toContain(hot.role);

      // Idle for a window: the pool gives back everything down to its floor, its backends close.
      held = false;
      const shrunk = await pollUntil(
        () => runtime(hot),
        (r) => r.pool?.size === 1,
        { attempts: 60, intervalMs: 250 },
      );
      expect(shrunk.pool?.size).toBe(1);
      expect(shrunk.generation).toBe(started.generation);
      // The object closes the connections first and tells its BudgetObject after (src/tenant-object/
      // sizing.ts `review`): until the ledger hears, it counts more than the pool holds (the safe
      // side), never less. It hears within the review.
      const ledgerNow = await ledgerRows(hot);
      expect(ledgerNow).toHaveLength(1);
      expect(ledgerNow[0]?.size ?? 0).toBeGreaterThanOrEqual(1);
      expect(
        await pollUntil(
          () => ledgerRows(hot),
          (rows) => rows[0]?.size === 1,
          { attempts: 40, intervalMs: 100 },
        ),
      ).toEqual([{ generation: started.generation, size: 1 }]);
      expect(await backendCount(hot)).toBeLessThanOrEqual(1);
      const afterShrink = await capacity();
      expect(afterShrink.adaptive.shrinks - before.adaptive.shrinks).toBe(5);
      expect(afterShrink.pooled).toMatchObject({ shrunk: 1, grown: 0 });

      // It serves at its floor, and grows again when it must (held again, so it is read grown).
      held = true;
      expect((await grownUnderLoad(hot, 4, (s) => s > 1)) ?? 0).toBeGreaterThan(1);
    } finally {
      samples = await sampler.stop();
    }
    expectWithinBudget(samples);
    // Postgres saw the grown pool: more than its start size at once, never more than its maximum.
    expect(samples.peaks.pool).toBeGreaterThan(2);
    expect(samples.peaks.pool).toBeLessThanOrEqual(6);
  });

  it("a full host takes idle connections back from under-used pools before it evicts, and never a lease in use", async () => {
    const busy = await newTenant("busy", "elastic");
    // No pool's own review gives anything back here, however long a step takes on this machine
    // (a window is 2 s): what shrinks them is the host. Each start waits longer than the test
    // (test-only setting), so a slow reclaim is not turned into a refusal.
    tenantHooksForTests.holdReview = (id) => fileTenants.has(id);
    budgetHooksForTests.admissionWaitMs = (name) => (name === host ? 50_000 : undefined);
    const sampler = await startSampler();
    let samples: Samples;
    try {
      const second = await newTenant("second", "standard");
      const third = await newTenant("third", "standard");
      const fourth = await newTenant("fourth", "standard");
      // Four session leases, each holding a connection: the pool grows from 2 to 4 to hold them,
      // and a load takes it to its maximum of 6 (kept on until it has).
      const leases = await mapConcurrent([0, 1, 2, 3], 4, () => openLease(busy));
      const pids = await Promise.all(leases.map(leasePid));
      expect(new Set(pids).size).toBe(4);
      expect(await grownUnderLoad(busy, 8, (s) => s === 6)).toBe(6);
      // The load leaves the last bucket of observation: only the four leases remain in use, which is
      // what the pool gives back under pressure by.
      const quiet = await pollUntil(
        () => runtime(busy),
        (r) => r.pool?.observed?.recentPeak === 4,
        { attempts: 200, intervalMs: 100 },
      );
      expect(quiet.pool?.observed?.recentPeak).toBe(4);
      expect(quiet.pool?.size).toBe(6);
      const before = await capacity();
      expect(before.allocated).toBe(6);

      // A standard pool starts at 5: 6 + 5 > 10. The busy pool gives back one idle connection.
      const secondServed = await probe(second);
      expect(problemsOf(secondServed)).toEqual([]);
      expect(secondServed.status).toBe(200);
      expect(await poolSize(busy)).toBe(5);
      // A third needs 5 more: the busy pool has nothing idle left to give (its four leases), the second
      // gives back its four idle connections down to its floor, and the busy one its last idle one.
      const thirdServed = await probe(third);
      expect(problemsOf(thirdServed)).toEqual([]);
      expect(thirdServed.status).toBe(200);
      const afterShrinks = await capacity();
      expect(afterShrinks.evictions).toBe(before.evictions);
      expect(afterShrinks.adaptive.reclaimShrinks - before.adaptive.reclaimShrinks).toBe(6);
      expect(await poolSize(busy)).toBe(4);
      expect(await poolSize(second)).toBe(1);
      // Every lease in use kept its connection: the same backend answers on each.
      expect(await Promise.all(leases.map(leasePid))).toEqual(pids);

      // A fourth: nothing idle is left but the third's four and the second's whole pool. Shrinking
      // the third is not enough, so the second, idle, is evicted: shrink first, then evict, never refuse.
      const fourthServed = await probe(fourth);
      expect(problemsOf(fourthServed)).toEqual([]);
      expect(fourthServed.status).toBe(200);
      const afterEviction = await capacity();
      expect(afterEviction.evictions - before.evictions).toBe(1);
      expect((await runtime(second)).state).toBe("stopped");
      expect(await Promise.all(leases.map(leasePid))).toEqual(pids);
      expect(ledgerUsed(afterEviction)).toBeLessThanOrEqual(poolCapacity);
    } finally {
      budgetHooksForTests.admissionWaitMs = undefined;
      samples = await sampler.stop();
    }
    expectWithinBudget(samples);
  });

  it("a storm of new tenants while a pool grows never takes the host past its budget", async () => {
    const hot = await newTenant("storm-hot", "elastic");
    const newcomers = await mapConcurrent(
      Array.from({ length: 8 }, (_, i) => i),
      4,
      (i) => newTenant(`storm-${i}`, i % 2 === 0 ? "free" : "elastic"),
    );
    const before = await capacity();
    const sampler = await startSampler();
    let samples: Samples;
    let outcomes: Outcome[];
    try {
      expect(problemsOf(await probe(hot))).toEqual([]);
      // The hot tenant keeps twelve requests in flight while every newcomer sends its first three.
      const hotLoad = burst(hot, 60, 12, 0.1);
      await sleep(100);
      const storm = mapConcurrent(
        newcomers.flatMap((t) => [t, t, t]),
        24,
        (t) => probe(t, 0.05),
      );
      const [hotOutcomes, stormOutcomes] = await Promise.all([hotLoad, storm]);
      outcomes = [...hotOutcomes, ...stormOutcomes];
    } finally {
      samples = await sampler.stop();
    }
    expectWithinBudget(samples);
    expect(outcomes.flatMap(problemsOf)).toEqual([]);
    const after = await capacity();
    // Growth was asked for during the storm (admitted or refused: the line decided).
    expect(
      after.adaptive.growths +
        after.adaptive.growthsRefused -
        before.adaptive.growths -
        before.adaptive.growthsRefused,
    ).toBeGreaterThan(0);
    // Most of the storm was served.
    expect(outcomes.filter((o) => o.status === 200).length).toBeGreaterThan(outcomes.length / 2);
  });

  it("an object killed mid-growth gives its allowance back (reconcile), and the next start is at its start size", async () => {
    const tenant = await newTenant("killed", "elastic");
    expect(problemsOf(await probe(tenant))).toEqual([]);
    const from = (await runtime(tenant)).generation;
    const seen: GrowStep[] = [];
    tenantHooksForTests.onGrowStep = (event) => {
      if (event.tenantId !== tenant.id) return;
      seen.push(event.step);
      event.abortObject("test: killed mid-growth");
      // Nothing of the dead instance runs past the grant, as after a real crash.
      return new Promise<void>(() => undefined);
    };
    // Waiting checkouts ask to grow; the budget grants, and the object dies before it applies it.
    const outcomes = await burst(tenant, 6, 6, 0.3);
    tenantHooksForTests.onGrowStep = undefined;
    expect(seen).toEqual(["granted"]);
    // The requests in flight on the dead instance were told to retry, never answered wrongly.
    for (const o of outcomes) {
      if (o.status !== 200) expect(o.status, JSON.stringify(o)).toBe(503);
      else expect(problemsOf(o)).toEqual([]);
    }
    // The grown allocation is released: by the restarted object itself, or by the reconcile.
    await env.BUDGETS.getByName(host).reconcile(host, 0);
    const ledger = await pollUntil(
      () => ledgerRows(tenant),
      (rows) => rows.every((r) => r.generation !== from),
      { attempts: 40, intervalMs: 100 },
    );
    expect(ledger.filter((r) => r.generation === from)).toEqual([]);
    // No backend of the dead generation outlives the reconcile's orphan pass either.
    const next = await probe(tenant);
    expect(problemsOf(next)).toEqual([]);
    const serving = (await runtime(tenant)).generation;
    expect(serving).toBeGreaterThan(from);
    expect(await ledgerRows(tenant)).toEqual([{ generation: serving, size: 2 }]);
    const backends = await pollUntil(
      () => tenantBackends(tenant),
      (apps) => apps.every((a) => a.endsWith(`:${serving}`)),
    );
    expect(backends.every((a) => a.endsWith(`:${serving}`))).toBe(true);
  });

  it("rotation and erase hold with pools of changing size", async () => {
    const tenant = await newTenant("rotate", "elastic");
    // Its pools' own reviews give nothing back until the test has read the sizes it compares (a
    // window is 2 s, shorter than a loaded machine may take between two steps).
    let held = true;
    tenantHooksForTests.holdReview = (id) => held && id === tenant.id;
    // A rotation's new generation overlaps the old one within the host's rotation reserve (ADR 013:
    // 6 here, the largest tier's maximum): the one excess the budget documents.
    const sampler = await startSampler(6);
    let samples: Samples;
    try {
      // To its maximum, so no growth is still on its way when its size is read.
      const grown = await grownUnderLoad(tenant, 8, (s) => s === 6);
      expect(grown ?? 0).toBeGreaterThanOrEqual(4);
      const from = (await runtime(tenant)).generation;
      const size = (await poolSize(tenant)) ?? 0;

      // A rotation admits the new generation at the size the pool holds now, and it serves at it.
      const rotated = await admin(`/v1/tenants/${tenant.id}/rotate-credentials`, { method: "POST" });
      expect(rotated.status).toBe(202);
      const after = await runtime(tenant);
      expect(after.generation).toBeGreaterThan(from);
      expect(after.pool?.size).toBe(size);
      const rows = await pollUntil(
        () => ledgerRows(tenant),
        (r) => r.length === 1,
      );
      expect(rows).toEqual([{ generation: after.generation, size }]);
      expect(problemsOf(await probe(tenant))).toEqual([]);
      expect((await probe(tenant)).app).toBe(`lessor:${tenant.role}:${after.generation}`);

      // The new generation shrinks when idle, as any.
      held = false;
      const shrunk = await pollUntil(
        () => runtime(tenant),
        (r) => r.pool?.size === 1,
        { attempts: 80, intervalMs: 250 },
      );
      expect(shrunk.pool?.size).toBe(1);
      expect(await ledgerRows(tenant)).toEqual([{ generation: after.generation, size: 1 }]);

      // The role's CONNECTION LIMIT stays the tier's maximum plus the migration connection.
      const limit = await asSuperuser(async (client) => {
        const { rows: found } = await client.query("SELECT rolconnlimit FROM pg_roles WHERE rolname = $1", [
          tenant.role,
        ]);
        return Number(found[0]?.rolconnlimit);
      });
      expect(limit).toBe(7);

      // Grow it again, then erase it while grown: nothing of it stays in the ledger or on the host.
      held = true;
      expect((await grownUnderLoad(tenant, 6, (s) => s > 1)) ?? 0).toBeGreaterThan(1);
      const erased = await admin(`/v1/tenants/${tenant.id}?confirm=${tenant.id}&force=true`, {
        method: "DELETE",
      });
      expect([200, 202]).toContain(erased.status);
      const gone = await pollUntil(
        () => ledgerRows(tenant),
        (r) => r.length === 0,
        { attempts: 80, intervalMs: 250 },
      );
      expect(gone).toEqual([]);
      expect(
        await pollUntil(
          () => backendCount(tenant),
          (n) => n === 0,
        ),
      ).toBe(0);
    } finally {
      samples = await sampler.stop();
    }
    expectWithinBudget(samples);
    fileTenants.delete(tenant.id);
    created.splice(created.indexOf(tenant), 1);
  });
});

describe("the line: starts and growths in arrival order (the fairness rule)", () => {
  // The host's BudgetObject alone, with ledger rows no object stands behind: every pool reports all
  // its connections leased, so nothing can be shrunk or evicted and only the line decides.
  const budget = () => env.BUDGETS.getByName(host);
  const full = { leases: 5, idleSince: null, pinned: false, migrating: false, recentPeak: 5, size: 5 };
  let ids: string[] = [];

  async function fillHost(): Promise<{ a: string; b: string; c: string }> {
    const tag = crypto.randomUUID().slice(0, 6);
    const [a, b, c] = [
      `${filePrefix}-line-a-${tag}`,
      `${filePrefix}-line-b-${tag}`,
      `${filePrefix}-line-c-${tag}`,
    ];
    ids = [a, b, c];
    for (const id of [a, b]) {
      expect(await budget().admit(host, id, 1, 5, 1)).toEqual({ granted: true });
      await budget().confirm(host, id, 1, full);
    }
    expect(ledgerUsed(await capacity())).toBe(poolCapacity);
    return { a, b, c };
  }

  afterEach(async () => {
    for (const id of ids) await budget().releaseTenant(host, id);
    ids = [];
  });

  it("a growth never jumps ahead of a start that waited first", async () => {
    const { a, b, c } = await fillHost();
    const start = budget().admit(host, c, 1, 5, 1);
    await pollUntil(capacity, (s) => s.waiters === 1, { attempts: 40, intervalMs: 25 });
    const growth = budget().grow(host, a, 1, 1, 6);
    await pollUntil(capacity, (s) => s.waiters === 2, { attempts: 40, intervalMs: 25 });
    // Room for five: the start, first in line, takes it; the growth finds nothing to take back.
    await budget().release(host, b, 1);
    expect(await start).toEqual({ granted: true });
    expect(await growth).toMatchObject({ granted: false, reason: "saturated" });
    expect(ledgerUsed(await capacity())).toBe(poolCapacity);
  });

  it("a growth that nothing can serve leaves the line at once and holds no start behind it", async () => {
    const { a, b, c } = await fillHost();
    const before = await capacity();
    // Full, nothing idle to take back: the growth is refused at once, and leaves no one waiting.
    expect(await budget().grow(host, a, 1, 1, 6)).toMatchObject({ granted: false, reason: "saturated" });
    expect((await capacity()).waiters).toBe(0);
    // A start that comes next waits only for room, and gets the first that frees.
    const start = budget().admit(host, c, 1, 5, 1);
    await pollUntil(capacity, (s) => s.waiters === 1, { attempts: 40, intervalMs: 25 });
    await budget().release(host, b, 1);
    expect(await start).toEqual({ granted: true });
    const after = await capacity();
    expect(after.adaptive.growthsRefused - before.adaptive.growthsRefused).toBe(1);
    expect(after.adaptive.growths).toBe(before.adaptive.growths);
    expect(ledgerUsed(after)).toBe(poolCapacity);
  });

  it("a growth never evicts a pool, and never passes the tier's maximum", async () => {
    const { a, b } = await fillHost();
    // Nothing waits and nothing fits: refused at once after the line finds nothing to take back.
    expect(await budget().grow(host, a, 1, 1, 6)).toMatchObject({ granted: false, reason: "saturated" });
    await budget().release(host, b, 1);
    // Room now, but the tier's maximum bounds the step: 5 → 6, then nothing more.
    expect(await budget().grow(host, a, 1, 3, 6)).toEqual({ granted: true, by: 1 });
    expect(await budget().grow(host, a, 1, 1, 6)).toMatchObject({ granted: false, reason: "not_allocated" });
    expect(ledgerUsed(await capacity())).toBe(6);
  });
});

describe("a fixed host is unchanged", () => {
  it("an elastic tenant on a fixed host holds its size and never grows", async () => {
    const tenant = await createTenant(uniqueTenantId("adp-fixed"), { host: "local", tier: "elastic" });
    expect((await burst(tenant, 12, 6, 0.1)).map((o) => o.status)).toEqual(Array(12).fill(200));
    const status = await runtime(tenant);
    expect(status.pool).toMatchObject({ adaptive: false, size: 2, start: 2, floor: 2, max: 2 });
    const rows = (await env.BUDGETS.getByName("local").evictionReport("local", 1)).pools.filter(
      (p) => p.tenantId === tenant.id,
    );
    expect(rows.map((r) => r.size)).toEqual([2]);
    expect(await backendCount(tenant)).toBeLessThanOrEqual(2);
    const drained = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: { force: true } });
    await drained.body?.cancel();
  });
});
