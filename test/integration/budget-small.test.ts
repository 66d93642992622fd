/**
 * Invariants 2 and 4 under attack, on the `small` host (connections 12, reserve 2: pools share 10,
 * so two standard pools of 5 fill it). Every test here tries to push the host past its budget or
 * to get a pool evicted that must not be: cold storms, an eviction racing a lease, saturation,
 * restarts of the BudgetObject and of a TenantObject, pinned and migrating pools.
 *
 * Two counts are watched during each run. The ledger's allocated + reserved + draining, sampled every
 * ~50 ms, must stay within 10. The backends Postgres itself saw, counted exactly from its own
 * connection log (server-log.ts) at every moment of the run: this file's pooled backends within 10,
 * the host's maintenance connections (its admin role's, migrations) within the reserve of 2, and
 * all of them together within 12.
 *
 * The `small` budget is shared by every test that uses it, so they all live in this one file and
 * run one after another; each test starts from an empty ledger and leaves one behind.
 */
import { evictDurableObject, runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { budgetHooksForTests } from "../../src/budget-object/test-hooks.ts";
import type { CapacityStatus } from "../../src/rpc/budget.ts";
import { migrationLockKey } from "../../src/tenant-db/migrator.ts";
import {
  admin,
  asSuperuser,
  type CreatedTenant,
  createTenant,
  lessor,
  mapConcurrent,
  pollUntil,
  sqlRequest,
  uniqueTenantId,
} from "./harness.ts";
import { type BackendClass, type ConnectionPeaks, connectionPeaks, markServerLog } from "./server-log.ts";

const host = "small";
/** connections − reserve on the `small` host (vitest.config.ts). */
const poolCapacity = 10;
const connections = 12;
/** The host's maintenance reserve: admin connections and migrations, never pools. */
const reserve = 2;
/** Every tenant of this file starts with it, so one LIKE counts all of this file's backends. */
const filePrefix = uniqueTenantId("bsm");
/** Every tenant this file created, by id: their backends are the ones counted against the small host. */
const fileTenants = new Map<string, CreatedTenant>();

/** `pg_stat_activity` rows of this file's tenants (their roles' `lessor:` backends). */
const fileBackendsSql =
  "FROM pg_stat_activity WHERE application_name LIKE 'lessor:%' AND usename = ANY($1::text[])";

function fileRoles(): string[] {
  return [...fileTenants.values()].map((t) => t.role);
}

type Tier = "standard" | "free" | "solo";
const tierSize: Record<Tier, number> = { standard: 5, free: 2, solo: 1 };

// ── Bookkeeping for cleanup ─────────────────────────────────────────────────────────────────────

const created: CreatedTenant[] = [];
const heldLeases = new Map<string, string>(); // lease token → tenant key

async function newTenant(tag: string, tier: Tier = "standard"): Promise<CreatedTenant> {
  const tenant = await createTenant(`${filePrefix}-${tag}`, { host, tier });
  fileTenants.set(tenant.id, tenant);
  created.push(tenant);
  return tenant;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// ── Looking at the budget ───────────────────────────────────────────────────────────────────────

async function capacity(): Promise<CapacityStatus> {
  const response = await admin("/v1/capacity");
  if (response.status !== 200) throw new Error(`capacity: ${response.status} ${await response.text()}`);
  const { hosts } = await response.json<{ hosts: CapacityStatus[] }>();
  const small = hosts.find((h) => h.host === host);
  if (!small) throw new Error("capacity lists no small host");
  return small;
}

function ledgerUsed(status: CapacityStatus): number {
  return status.allocated + status.reserved + status.draining;
}

function isEmptyLedger(status: CapacityStatus): boolean {
  return (
    ledgerUsed(status) === 0 &&
    status.pools.reserved + status.pools.allocated + status.pools.draining === 0 &&
    status.waiters === 0
  );
}

interface Samples {
  count: number;
  maxLedger: number;
  violations: string[];
  /** Samples that could not be taken (a budget crashed on purpose answers its in-flight calls with an error). */
  failures: string[];
  /** Lessor's backends on the host at every moment of the run, from the server's own log. */
  peaks: ConnectionPeaks;
}

/** Which of the host's backends a count includes: this file's pools and migrations, and the host's admin. */
function classifyBackend({ user, app }: { user: string; app: string }): BackendClass | null {
  if (app.startsWith(`lessor:host:${host}:`)) return "maintenance";
  if (!fileRoles().includes(user) || !app.startsWith(`lessor:${user}:`)) return null;
  return /^[0-9]+$/.test(app.slice(`lessor:${user}:`.length)) ? "pool" : "maintenance";
}

/**
 * Samples the ledger every ~50 ms until stopped (bounded), and counts Postgres's backends exactly:
 * between a mark in the server's log at the start and one at the stop, every connection the server
 * authorized and every one that ended (server-log.ts), so an overshoot of a millisecond shows.
 */
async function startSampler(): Promise<{ stop: () => Promise<Samples> }> {
  const samples: Samples = {
    count: 0,
    maxLedger: 0,
    violations: [],
    failures: [],
    peaks: { pool: 0, maintenance: 0, total: 0, atPeak: [], opened: 0 },
  };
  const from = await markServerLog();
  let running = true;
  const done = (async () => {
    // Runs until stopped, and in any case until one sample succeeded (a stop that comes before the
    // first sample would otherwise leave a run that measured nothing); bounded either way.
    for (let i = 0; (running || samples.count === 0) && i < 4_000; i++) {
      let status: CapacityStatus;
      try {
        status = await capacity();
      } catch (error) {
        samples.failures.push(String(error));
        await sleep(50);
        continue;
      }
      const used = ledgerUsed(status);
      samples.count++;
      samples.maxLedger = Math.max(samples.maxLedger, used);
      if (used > poolCapacity) {
        samples.violations.push(
          `ledger ${used} > ${poolCapacity}: allocated ${status.allocated} reserved ${status.reserved} draining ${status.draining}`,
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

/**
 * The ledger stayed within the budget at every sample, and Postgres at every moment: pools within
 * their share, maintenance within the reserve, all of Lessor's backends within the host's
 * connections. `allowedFailures` samples may be missing where a test crashes the BudgetObject on
 * purpose (its in-flight calls fail with the reset).
 */
function expectWithinBudget(samples: Samples, allowedFailures = 0): void {
  expect(samples.violations).toEqual([]);
  expect(samples.maxLedger).toBeLessThanOrEqual(poolCapacity);
  const { peaks } = samples;
  expect(peaks.pool, `pooled backends at once: ${JSON.stringify(peaks)}`).toBeLessThanOrEqual(poolCapacity);
  expect(peaks.maintenance, `maintenance backends at once: ${JSON.stringify(peaks)}`).toBeLessThanOrEqual(
    reserve,
  );
  expect(peaks.total, `backends at once: ${JSON.stringify(peaks)}`).toBeLessThanOrEqual(connections);
  if (allowedFailures === 0) expect(samples.failures).toEqual([]);
  else expect(samples.failures.length).toBeLessThanOrEqual(allowedFailures);
  expect(samples.count).toBeGreaterThan(0);
}

async function backendApps(): Promise<string[]> {
  return asSuperuser(async (client) => {
    const { rows } = await client.query(`SELECT application_name ${fileBackendsSql} ORDER BY 1`, [
      fileRoles(),
    ]);
    return rows.map((row: { application_name: string }) => row.application_name);
  });
}

// ── Talking to Lessor ───────────────────────────────────────────────────────────────────────────

interface Outcome {
  tenant: string;
  status: number;
  code: string | null;
  retryAfter: string | null;
  /** application_name of the backend that served it: `lessor:<tenant>:<generation>`. */
  app: string | null;
  db: string | null;
}

/** One `/sql` request reading who served it. Never throws for an HTTP refusal. */
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

/**
 * Opens a session lease (held until the test releases it) as one outcome of a storm: a granted
 * lease's outcome is that of a statement run on it (who served it).
 */
async function leaseProbe(tenant: CreatedTenant): Promise<Outcome> {
  const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs: 60_000 }),
  });
  const retryAfter = response.headers.get("Retry-After");
  if (response.status === 201) {
    const { lease } = await response.json<{ lease: string }>();
    heldLeases.set(lease, tenant.key);
    const used = await lessor(`/v1/leases/${lease}/sql`, {
      method: "POST",
      headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
      body: JSON.stringify({
        query: "SELECT current_setting('application_name'), current_database()",
        params: [],
      }),
    });
    const row = used.status === 200 ? (await used.json<{ rows: (string | null)[][] }>()).rows[0] : undefined;
    if (used.status !== 200) await used.body?.cancel();
    return {
      tenant: tenant.id,
      status: used.status,
      code: null,
      retryAfter,
      app: row?.[0] ?? null,
      db: row?.[1] ?? null,
    };
  }
  const body = await response.json<{ code?: string }>();
  return {
    tenant: tenant.id,
    status: response.status,
    code: body.code ?? null,
    retryAfter,
    app: null,
    db: null,
  };
}

/** Problems with an outcome under a crash: anything but a correct answer or a 503 with Retry-After. */
function retryableProblemsOf(outcome: Outcome): string[] {
  if (outcome.status === 503 && Number(outcome.retryAfter) >= 1) return [];
  return problemsOf(outcome);
}

/** Problems with an outcome: anything but a correct answer or a 503 capacity_saturated with Retry-After. */
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

/**
 * Retries a tenant's request after 503s, honouring Retry-After, a bounded number of times.
 * Returns every outcome; the last is the final answer.
 */
async function untilServed(tenant: CreatedTenant, attempts: number): Promise<Outcome[]> {
  const outcomes: Outcome[] = [];
  for (let attempt = 0; attempt < attempts; attempt++) {
    const outcome = await probe(tenant);
    outcomes.push(outcome);
    if (outcome.status !== 503) break;
    await sleep(Math.min(5, Number(outcome.retryAfter) || 1) * 1000);
  }
  return outcomes;
}

async function openLease(
  tenant: CreatedTenant,
): Promise<{ status: number; lease: string; generation: number }> {
  const response = await lessor(`/v1/tenants/${tenant.id}/leases`, {
    method: "POST",
    headers: { Authorization: `Bearer ${tenant.key}`, "content-type": "application/json" },
    body: JSON.stringify({ ttlMs: 60_000 }),
  });
  if (response.status !== 201) {
    return { status: response.status, lease: "", generation: 0 };
  }
  const body = await response.json<{ lease: string; generation: number }>();
  heldLeases.set(body.lease, tenant.key);
  return { status: 201, lease: body.lease, generation: body.generation };
}

/** Runs a statement on a session lease: the application_name of its connection, or the refusal. */
async function onLease(
  token: string,
  key: string,
): Promise<{ status: number; app: string | null; code: string | null }> {
  const response = await lessor(`/v1/leases/${token}/sql`, {
    method: "POST",
    headers: { Authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ query: "SELECT current_setting('application_name')", params: [] }),
  });
  if (response.status !== 200) {
    const body = await response.json<{ code?: string }>();
    return { status: response.status, app: null, code: body.code ?? null };
  }
  const body = await response.json<{ rows: (string | null)[][] }>();
  return { status: 200, app: body.rows[0]?.[0] ?? null, code: null };
}

async function releaseLease(token: string): Promise<number> {
  const key = heldLeases.get(token);
  heldLeases.delete(token);
  if (key === undefined) return 0;
  const response = await lessor(`/v1/leases/${token}`, {
    method: "DELETE",
    headers: { Authorization: `Bearer ${key}` },
  });
  await response.body?.cancel();
  return response.status;
}

interface Runtime {
  state: string;
  generation: number;
  leases: number;
  pinned: boolean;
  migrating: boolean;
}

async function runtime(tenant: CreatedTenant): Promise<Runtime> {
  const response = await admin(`/v1/tenants/${tenant.id}`);
  if (response.status !== 200) throw new Error(`status ${tenant.id}: ${response.status}`);
  return (await response.json<{ runtime: Runtime }>()).runtime;
}

/**
 * Restarts the BudgetObject the graceful way (evictDurableObject waits for its in-flight calls, up
 * to a timeout). It wakes the object first: evictDurableObject refuses one that is not running.
 */
async function restartBudget(): Promise<void> {
  const budget = env.BUDGETS.getByName(host);
  await budget.status(host);
  await evictDurableObject(budget);
}

/**
 * Resets an object at once, as a crash or a deploy does, with whatever it has in flight. (A
 * TenantObject with a live pool cannot be evicted: its open connections keep it busy, see
 * restart.test.ts.)
 */
async function crash(stub: DurableObjectStub): Promise<void> {
  const outcome = await runInDurableObject(stub, (_instance, state) => {
    state.abort("test: object reset");
  }).then(
    () => "not reset",
    (error: unknown) => String(error),
  );
  expect(outcome).toMatch(/object reset/);
}

/** Warms a pool to its full size, so its backends are all there to be counted. */
async function warm(tenant: CreatedTenant, size: number): Promise<Outcome[]> {
  return Promise.all(Array.from({ length: size }, () => probe(tenant, 0.1)));
}

// ── Each test starts from an empty ledger and leaves one behind ─────────────────────────────────

beforeEach(async () => {
  const status = await capacity();
  expect(isEmptyLedger(status), `ledger at start: ${JSON.stringify(status)}`).toBe(true);
});

async function drainAll(tenants: readonly CreatedTenant[]): Promise<void> {
  await mapConcurrent(tenants, 8, async (tenant) => {
    const response = await admin(`/v1/tenants/${tenant.id}/drain`, { method: "POST", json: { force: true } });
    await response.body?.cancel();
  });
}

afterEach(async () => {
  budgetHooksForTests.admissionWaitMs = undefined;
  budgetHooksForTests.onConfirm = undefined;
  await mapConcurrent([...heldLeases.keys()], 8, (token) => releaseLease(token));
  const tenants = created.splice(0);
  await drainAll(tenants);
  const drained = await pollUntil(capacity, isEmptyLedger, { attempts: 40, intervalMs: 100 });
  if (!isEmptyLedger(drained)) {
    // Leave an empty ledger for the next test whatever happened (a test that failed half way may
    // have left starts in flight), then fail this one with the evidence.
    for (let round = 0; round < 5; round++) {
      await sleep(1_000);
      await drainAll(tenants);
      await env.BUDGETS.getByName(host).reconcile(host, 0);
      if (isEmptyLedger(await capacity())) break;
    }
  }
  expect(isEmptyLedger(drained), `ledger after drain: ${JSON.stringify(drained)}`).toBe(true);
});

// ── The tests ───────────────────────────────────────────────────────────────────────────────────

describe("connection budget on a small host", () => {
  it("storms: 50 cold tenants never push the ledger past 10 nor Postgres past 12 backends", async () => {
    const tiers: Tier[] = ["standard", "free", "solo", "free", "standard"];
    // Counted from the first create: ten at a time, provisioning is a storm on the reserve too.
    const sampler = await startSampler();
    let outcomes: Outcome[] = [];
    let retried: Outcome[][] = [];
    try {
      const tenants = await mapConcurrent(
        Array.from({ length: 50 }, (_, i) => i),
        10,
        (i) => newTenant(`st${i}`, tiers[i % tiers.length]),
      );
      // Wave 1: every tenant cold at once, each with a session lease and, where its pool has room
      // beside the lease, one to three requests (they all join one start). A pool that starts holds
      // its lease until the whole wave has answered, so nothing it admits can be evicted: every
      // start the budget cannot admit at once is refused when its wait ends, on any machine, and
      // every one it admits is served. (Served requests alone, on a fast machine, free their pools
      // so quickly that every start gets room within its wait: issue 39.)
      const wave = tenants.flatMap((tenant, i) => {
        const probes = tiers[i % tiers.length] === "solo" ? 0 : 1 + (i % 3);
        return [leaseProbe(tenant), ...Array.from({ length: probes }, () => probe(tenant, 0.02))];
      });
      outcomes = await Promise.all(wave);
      // The leases go: their pools become idle.
      expect(heldLeases.size).toBeGreaterThan(0);
      await mapConcurrent([...heldLeases.keys()], 8, (token) => releaseLease(token));
      // Wave 2: the refused tenants retry, honouring Retry-After; capacity must come round to them,
      // by evicting the idle pools of wave 1.
      const refused = [...new Set(outcomes.filter((o) => o.status !== 200).map((o) => o.tenant))];
      retried = await mapConcurrent(
        tenants.filter((t) => refused.includes(t.id)),
        12,
        (tenant) => untilServed(tenant, 8),
      );
    } finally {
      const samples = await sampler.stop();
      expectWithinBudget(samples);
      expect(samples.count).toBeGreaterThan(5);
      // The counts measured something: the pools' share and the reserve were both in use at once.
      expect(samples.peaks.pool).toBeGreaterThan(2);
      expect(samples.peaks.maintenance).toBeGreaterThan(0);
    }
    expect(outcomes.flatMap(problemsOf)).toEqual([]);
    expect(retried.flat().flatMap(problemsOf)).toEqual([]);
    // The storm was a storm: some were refused, some were served.
    expect(outcomes.some((o) => o.status === 200)).toBe(true);
    expect(outcomes.some((o) => o.status === 503)).toBe(true);
    // Every tenant was served in the end (liveness), and the host finished within its budget.
    const unserved = retried.filter((list) => list.at(-1)?.status !== 200).map((list) => list[0]?.tenant);
    expect(unserved).toEqual([]);
    const after = await capacity();
    expect(ledgerUsed(after)).toBeLessThanOrEqual(poolCapacity);
    expect(after.evictions).toBeGreaterThan(0);
    // The capacity view names a few candidates, never the whole fleet, and only to the operator.
    expect(after.candidates.length).toBeLessThanOrEqual(5);
    const anonymous = await lessor("/v1/capacity");
    expect(anonymous.status).toBe(401);
    await anonymous.body?.cancel();
  }, 120_000);

  it("a start waiting behind pools that are still starting gets their room once they are idle, within its wait", async () => {
    const tenants = await Promise.all(["wq-a", "wq-b", "wq-c", "wq-d"].map((tag) => newTenant(tag)));
    const before = await capacity();
    // Four standard pools at once on a host that holds two: two start, two wait. The first two are
    // idle a few milliseconds after they start; the two that wait must get their room then, by
    // eviction, not by a timeout. Their wait is longer than the test (test-only setting), so a slow
    // machine cannot turn a start that takes a while into a refusal.
    budgetHooksForTests.admissionWaitMs = (name) => (name === host ? 50_000 : undefined);
    const sampler = await startSampler();
    let outcomes: Outcome[];
    try {
      outcomes = await Promise.all(tenants.map((tenant) => probe(tenant)));
    } finally {
      budgetHooksForTests.admissionWaitMs = undefined;
      const samples = await sampler.stop();
      expectWithinBudget(samples);
    }
    expect(outcomes.flatMap(problemsOf)).toEqual([]);
    expect(
      outcomes.map((o) => `${o.status} ${o.code ?? ""}`),
      "the waiting starts should evict the idle pools, not time out",
    ).toEqual(["200 ", "200 ", "200 ", "200 "]);
    expect((await capacity()).evictions).toBe(before.evictions + 2);
  });

  // RACE (issue 39, review finding 23): shown here, not fixed (src/tenant-object/pool/index.ts is being
  // reshaped). A pool that has just started reports itself to its BudgetObject with no lease
  // (`confirm`) before the request that started it has taken one; a start waiting on the host kicks
  // a reclaim at that confirm, and the reclaim may ask the new pool to drain while the confirm's
  // answer is still on its way. The pool is then evicted before it served anyone: its request
  // starts it again behind the start that took its room. On a loaded machine this is what makes
  // "a start waiting behind pools that are still starting" count more evictions than two. The
  // hooks below hold the confirm at both ends, so the race lands on every run; the assertions say
  // what happens today. When pool.ts takes the first lease before it confirms, this test fails:
  // it then asserts the opposite (served by generation 1, no eviction).
  it("a pool just started is never evicted before the request that started it runs on it (finding 23, closed by the holder registry)", async () => {
    const x = await newTenant("rc-x");
    const a = await newTenant("rc-a");
    const c = await newTenant("rc-c");
    // x holds half the host with a lease; a's start takes the other half.
    const leaseX = await openLease(x);
    expect(leaseX.status).toBe(201);
    // Long waits (test-only setting): nothing here ends by a timeout.
    budgetHooksForTests.admissionWaitMs = (name) => (name === host ? 50_000 : undefined);
    const before = await capacity();
    // The hook waits inside the BudgetObject on flags the test sets, with timers of the object's
    // own (a promise of the test's, awaited there, would leave the object a reference the budget's
    // restart in a later test waits on).
    const gate = { reached: false, confirm: false, answer: false };
    const until = async (open: () => boolean) => {
      for (let i = 0; i < 4_000 && !open(); i++) await new Promise((resolve) => setTimeout(resolve, 10));
    };
    const letConfirm = () => {
      gate.confirm = true;
    };
    const letAnswer = () => {
      gate.answer = true;
    };
    const steps: string[] = [];
    budgetHooksForTests.onConfirm = async (tenantId, generation, step) => {
      if (tenantId !== a.id || generation !== 1) return;
      steps.push(step);
      if (step === "reached") {
        gate.reached = true;
        await until(() => gate.confirm);
      } else {
        await until(() => gate.answer);
      }
    };
    const sampler = await startSampler();
    let served: Outcome;
    let other: Outcome;
    let whileConfirming: CapacityStatus;
    try {
      const first = probe(a);
      await until(() => gate.reached);
      expect(gate.reached).toBe(true);
      // a's pool is open and about to be confirmed; c's start waits for room (x leased, a starting).
      const second = probe(c);
      const waiting = await pollUntil(capacity, (s) => s.waiters === 1, { attempts: 200, intervalMs: 25 });
      expect(waiting.waiters).toBe(1);
      letConfirm();
      // The confirm kicks a reclaim for c while a's object has not heard the confirm's answer: a's
      // request is a holder (a flight) from the moment it arrived, so the eviction is refused.
      await until(() => steps.includes("recorded"));
      whileConfirming = await capacity();
      letAnswer();
      served = await first;
      other = await second;
    } finally {
      letConfirm();
      letAnswer();
      budgetHooksForTests.onConfirm = undefined;
      budgetHooksForTests.admissionWaitMs = undefined;
      const samples = await sampler.stop();
      expectWithinBudget(samples);
    }
    expect(steps).toEqual(["reached", "recorded"]);
    expect(problemsOf(served)).toEqual([]);
    expect(problemsOf(other)).toEqual([]);
    // a's request ran on the pool it started (generation 1), which nobody evicted under it.
    expect(whileConfirming.evictions).toBe(before.evictions);
    expect(served.status).toBe(200);
    expect(served.app).toBe(`lessor:${a.role}:1`);
    // c waited for room and got it: a's pool, idle once its request was answered, is the victim.
    expect(other.status).toBe(200);
    expect((await capacity()).evictions).toBe(before.evictions + 1);
    expect((await onLease(leaseX.lease, x.key)).app).toBe(`lessor:${x.role}:${leaseX.generation}`);
  });

  it("eviction race: a pool leased after the ledger last saw it idle refuses; the other idle pool goes", async () => {
    const a = await newTenant("race-a");
    const b = await newTenant("race-b");
    const c = await newTenant("race-c");
    // a first, so the ledger holds a as the least recently used: it is the first victim asked.
    expect((await probe(a)).status).toBe(200);
    expect((await probe(b)).status).toBe(200);
    const before = await capacity();
    expect(before.allocated).toBe(10);
    expect(before.candidates.map((x) => x.tenantId)).toEqual([a.id, b.id]);

    const held = await openLease(a);
    expect(held.status).toBe(201);
    const aBefore = await runtime(a);
    expect(aBefore).toMatchObject({ state: "ready", leases: 1 });

    const sampler = await startSampler();
    let served: Outcome;
    try {
      served = await probe(c);
    } finally {
      const samples = await sampler.stop();
      expectWithinBudget(samples);
    }
    expect(problemsOf(served)).toEqual([]);
    expect(served.status).toBe(200);

    // a held its lease: never evicted, same generation, the lease still runs on it.
    expect(await onLease(held.lease, a.key)).toEqual({
      status: 200,
      app: `lessor:${a.role}:${held.generation}`,
      code: null,
    });
    expect(await runtime(a)).toMatchObject({ state: "ready", generation: held.generation, leases: 1 });
    // b was idle: it was the one drained.
    expect((await runtime(b)).state).toBe("stopped");
    const after = await capacity();
    expect(after.evictions).toBe(before.evictions + 1);
    expect(after.allocated).toBe(10);
    const apps = await pollUntil(
      backendApps,
      (list) => !list.some((app) => app.startsWith(`lessor:${b.role}:`)),
    );
    expect(apps.filter((app) => app.startsWith(`lessor:${b.role}:`))).toEqual([]);
  });

  it("eviction race: leases arriving while their pools are being chosen are never evicted under them", async () => {
    // c's start reaches the budget, which asks a (the least recently used) to drain, some tens of
    // milliseconds after c's request is sent; the lease on a is sent at offsets around that moment.
    const leaseOffsetsMs = [0, 15, 30, 60];
    for (const [round, offset] of leaseOffsetsMs.entries()) {
      const a = await newTenant(`rr${round}-a`);
      const b = await newTenant(`rr${round}-b`);
      const c = await newTenant(`rr${round}-c`);
      expect((await probe(a)).status).toBe(200);
      expect((await probe(b)).status).toBe(200);
      const sampler = await startSampler();
      // The lease on a and c's start race; a is the LRU victim the budget asks first.
      const [held, served] = await Promise.all([sleep(offset).then(() => openLease(a)), probe(c)]);
      const samples = await sampler.stop();
      expectWithinBudget(samples);
      expect(problemsOf(served)).toEqual([]);
      expect(held.status).toBe(201);
      // Whichever generation the lease got, it keeps it while held, and the lease keeps working.
      await sleep(200);
      expect(await onLease(held.lease, a.key)).toEqual({
        status: 200,
        app: `lessor:${a.role}:${held.generation}`,
        code: null,
      });
      expect(await runtime(a)).toMatchObject({ state: "ready", generation: held.generation, leases: 1 });
      expect(await releaseLease(held.lease)).toBe(204);
      // Clean this round before the next: drain the three and wait for an empty ledger.
      for (const tenant of [a, b, c]) {
        const response = await admin(`/v1/tenants/${tenant.id}/drain`, {
          method: "POST",
          json: { force: true },
        });
        await response.body?.cancel();
      }
      expect(isEmptyLedger(await pollUntil(capacity, isEmptyLedger, { attempts: 40, intervalMs: 100 }))).toBe(
        true,
      );
    }
  });

  it("saturation: with every pool leased a start gets 503 capacity_saturated, then succeeds once a lease is released", async () => {
    const a = await newTenant("sat-a");
    const b = await newTenant("sat-b");
    const c = await newTenant("sat-c");
    const leaseA = await openLease(a);
    const leaseB = await openLease(b);
    expect([leaseA.status, leaseB.status]).toEqual([201, 201]);
    const before = await capacity();
    expect(before).toMatchObject({ allocated: 10, reserved: 0, draining: 0, waiters: 0 });

    const sampler = await startSampler();
    let refused: Outcome;
    try {
      refused = await probe(c);
    } finally {
      const samples = await sampler.stop();
      expectWithinBudget(samples);
    }
    expect(refused).toMatchObject({ status: 503, code: "capacity_saturated" });
    expect(Number(refused.retryAfter)).toBeGreaterThanOrEqual(1);
    // Nothing was evicted; both leases still run on their generations.
    const during = await capacity();
    expect(during).toMatchObject({ allocated: 10, waiters: 0, evictions: before.evictions });
    expect(during.saturations).toBeGreaterThan(before.saturations);
    expect((await onLease(leaseA.lease, a.key)).app).toBe(`lessor:${a.role}:${leaseA.generation}`);
    expect((await onLease(leaseB.lease, b.key)).app).toBe(`lessor:${b.role}:${leaseB.generation}`);
    expect((await runtime(c)).state).toBe("stopped");

    // a's lease ends: a is idle now, so c's retry (after Retry-After) evicts it and is served.
    expect(await releaseLease(leaseA.lease)).toBe(204);
    const sampler2 = await startSampler();
    let retries: Outcome[];
    try {
      retries = await untilServed(c, 4);
    } finally {
      const samples = await sampler2.stop();
      expectWithinBudget(samples);
    }
    expect(
      retries.map((o) => `${o.status} ${o.code ?? ""}`),
      "c should be served within a few retries of a's lease ending",
    ).toContain("200 ");
    expect(retries.flatMap(problemsOf)).toEqual([]);
    expect((await runtime(a)).state).toBe("stopped");
    expect(await onLease(leaseB.lease, b.key)).toMatchObject({ status: 200 });
    expect((await runtime(b)).generation).toBe(leaseB.generation);
  });

  it("restarts: the BudgetObject restarts with pools allocated; its ledger survives and still caps admission", async () => {
    const a = await newTenant("brs-a");
    const b = await newTenant("brs-b");
    const c = await newTenant("brs-c");
    expect((await probe(a)).status).toBe(200);
    expect((await probe(b)).status).toBe(200);
    const leaseB = await openLease(b);
    expect(leaseB.status).toBe(201);
    const before = await capacity();
    expect(before).toMatchObject({ allocated: 10, pools: { allocated: 2 } });

    await restartBudget();

    const after = await capacity();
    expect(after).toMatchObject({ allocated: 10, reserved: 0, draining: 0, pools: { allocated: 2 } });
    expect(after.evictions).toBe(before.evictions);

    // The restarted budget still admits only by evicting: a is idle, b is leased.
    const sampler = await startSampler();
    let served: Outcome;
    try {
      served = await probe(c);
    } finally {
      const samples = await sampler.stop();
      expectWithinBudget(samples);
    }
    expect(problemsOf(served)).toEqual([]);
    expect(served.status).toBe(200);
    expect((await runtime(a)).state).toBe("stopped");
    expect((await onLease(leaseB.lease, b.key)).app).toBe(`lessor:${b.role}:${leaseB.generation}`);
    expect(ledgerUsed(await capacity())).toBe(10);
  });

  it("restarts: the BudgetObject restarts in the middle of a storm and admission never overshoots", async () => {
    const tiers: Tier[] = ["standard", "free", "solo"];
    const tenants = await mapConcurrent(
      Array.from({ length: 24 }, (_, i) => i),
      6,
      (i) => newTenant(`bst${i}`, tiers[i % tiers.length]),
    );
    const sampler = await startSampler();
    let outcomes: Outcome[] = [];
    let retried: Outcome[][] = [];
    try {
      // Crash the budget while starts wait on it (it drops its waiters and in-flight calls), then
      // restart it gracefully under a second wave.
      const waiting = (status: CapacityStatus) => status.waiters > 0;
      const firstWave = Promise.all(tenants.map((tenant) => probe(tenant, 0.05)));
      expect((await pollUntil(capacity, waiting, { attempts: 200, intervalMs: 10 })).waiters).toBeGreaterThan(
        0,
      );
      await crash(env.BUDGETS.getByName(host));
      const secondWave = Promise.all(tenants.map((tenant) => probe(tenant, 0.05)));
      await pollUntil(capacity, waiting, { attempts: 200, intervalMs: 10 });
      await restartBudget();
      outcomes = (await Promise.all([firstWave, secondWave])).flat();
      // A start the crash cut off half way may have left its reservation behind; the cron's
      // reconcile releases what no tenant holds. Run it now rather than wait for the cron.
      await env.BUDGETS.getByName(host).reconcile(host, 0);
      const refused = [...new Set(outcomes.filter((o) => o.status !== 200).map((o) => o.tenant))];
      retried = await mapConcurrent(
        tenants.filter((t) => refused.includes(t.id)),
        8,
        (tenant) => untilServed(tenant, 8),
      );
    } finally {
      const samples = await sampler.stop();
      expectWithinBudget(samples, 3);
    }
    // A restart of the budget is a refusal with a retry hint at worst (the crash may fail a start
    // half way: tenant_starting_failed), never a wrong answer or an error without a hint.
    expect(outcomes.flatMap(retryableProblemsOf)).toEqual([]);
    expect(retried.flat().flatMap(retryableProblemsOf)).toEqual([]);
    const unserved = retried.filter((list) => list.at(-1)?.status !== 200).map((list) => list[0]?.tenant);
    expect(unserved).toEqual([]);
    // After a reconcile (the cron's job) the ledger is the truth: exactly the pools that run.
    await env.BUDGETS.getByName(host).reconcile(host, 0);
    const runtimes = await mapConcurrent(tenants, 8, async (tenant, i) => ({
      state: (await runtime(tenant)).state,
      size: tierSize[tiers[i % tiers.length] ?? "standard"],
    }));
    const running = runtimes
      .filter((r) => r.state === "ready" || r.state === "starting" || r.state === "draining")
      .reduce((n, r) => n + r.size, 0);
    const status = await capacity();
    expect(ledgerUsed(status)).toBe(running);
    expect(ledgerUsed(status)).toBeLessThanOrEqual(poolCapacity);
  });

  it("restarts: the BudgetObject crashes while a start waits on it; the start gets a retryable answer and nothing leaks", async () => {
    const a = await newTenant("bcr-a");
    const b = await newTenant("bcr-b");
    const c = await newTenant("bcr-c");
    const leaseA = await openLease(a);
    const leaseB = await openLease(b);
    expect([leaseA.status, leaseB.status]).toEqual([201, 201]);

    // c's start waits longer than the test (test-only setting): what ends its wait is the crash,
    // never its own timeout on a machine slow to deliver the crash.
    budgetHooksForTests.admissionWaitMs = (name) => (name === host ? 50_000 : undefined);
    const sampler = await startSampler();
    let outcome: Outcome;
    try {
      // The host is full and nothing is evictable: c's start waits in the budget's queue...
      let answered = false;
      const pending = probe(c).finally(() => {
        answered = true;
      });
      const waiting = await pollUntil(capacity, (s) => s.waiters > 0, { attempts: 200, intervalMs: 25 });
      expect(waiting.waiters).toBe(1);
      // ...when the budget dies with it (the fault lands while c still waits).
      expect(answered).toBe(false);
      await crash(env.BUDGETS.getByName(host));
      outcome = await pending;
    } finally {
      budgetHooksForTests.admissionWaitMs = undefined;
      const samples = await sampler.stop();
      expectWithinBudget(samples, 3);
    }
    // A retryable refusal with a hint, not an internal error.
    expect(outcome.status, `c got ${outcome.status} ${outcome.code}`).toBe(503);
    expect(Number(outcome.retryAfter)).toBeGreaterThanOrEqual(1);
    // The ledger holds exactly the two leased pools; c holds nothing and is not left half-started.
    // (The crash may land while the budget asks a or b to drain for c: that pool's row is then left
    // `draining` until the cron's reconcile asks the pool. The next test makes that land for sure.)
    await env.BUDGETS.getByName(host).reconcile(host, 0);
    expect(await capacity()).toMatchObject({ allocated: 10, reserved: 0, draining: 0, waiters: 0 });
    expect((await runtime(c)).state).not.toBe("starting");
    expect((await onLease(leaseA.lease, a.key)).app).toBe(`lessor:${a.role}:${leaseA.generation}`);

    // Once a lease ends, c gets in on a retry.
    expect(await releaseLease(leaseA.lease)).toBe(204);
    const retries = await untilServed(c, 4);
    expect(retries.at(-1)?.status).toBe(200);
    expect(retries.flatMap(problemsOf)).toEqual([]);
    expect(ledgerUsed(await capacity())).toBe(10);
  });

  it("restarts: an eviction whose answer a crash lost leaves no ready pool marked draining after the reconcile", async () => {
    const a = await newTenant("bcd-a");
    const leaseA = await openLease(a);
    expect(leaseA.status).toBe(201);
    const budget = env.BUDGETS.getByName(host);
    // What the budget writes before it asks a pool to drain, then a crash before the answer: the
    // row says draining while the pool, leased, goes on serving.
    await runInDurableObject(budget, (instance) => {
      const ledger = (instance as unknown as { ledger: { setPhase: (...args: unknown[]) => void } }).ledger;
      ledger.setPhase(a.id, leaseA.generation, "draining", null);
    });
    await crash(budget);
    const before = await capacity();
    expect(before).toMatchObject({ allocated: 0, draining: 5 });
    // Such a row is never evicted nor shrunk, and never counted idle: the reconcile asks the pool.
    const repaired = await env.BUDGETS.getByName(host).reconcile(host, 0);
    expect(repaired.corrected).toBe(1);
    const after = await capacity();
    expect(after).toMatchObject({ allocated: 5, draining: 0, reserved: 0 });
    expect(after.reconciled.phase_corrected).toBe(before.reconciled.phase_corrected + 1);
    expect((await onLease(leaseA.lease, a.key)).app).toBe(`lessor:${a.role}:${leaseA.generation}`);
    expect(await releaseLease(leaseA.lease)).toBe(204);
  });

  it("restarts: a TenantObject restarted while holding an allocation releases it (reconcile), and the next request runs on a new generation", async () => {
    const a = await newTenant("trs-a");
    const b = await newTenant("trs-b");
    expect((await probe(a)).app).toBe(`lessor:${a.role}:1`);
    expect((await probe(b)).status).toBe(200);
    expect(await capacity()).toMatchObject({ allocated: 10 });

    await crash(env.TENANTS.getByName(a.id));
    const reconciled = await env.BUDGETS.getByName(host).reconcile(host, 0);
    expect(reconciled).toMatchObject({ released: 1 });
    const status = await pollUntil(capacity, (s) => s.allocated === 5, { attempts: 20, intervalMs: 100 });
    expect(status).toMatchObject({ allocated: 5, pools: { allocated: 1 } });

    const next = await probe(a);
    expect(next).toMatchObject({ status: 200, app: `lessor:${a.role}:2` });
    expect(await capacity()).toMatchObject({ allocated: 10, pools: { allocated: 2 } });
    expect((await runtime(a)).generation).toBe(2);
  });

  it("restarts: a TenantObject restarted with a full pool releases it itself, and its dead backends never push Postgres past 12", async () => {
    const a = await newTenant("trf-a");
    const b = await newTenant("trf-b");
    // Both pools at full size: 10 backends.
    expect((await warm(a, 5)).flatMap(problemsOf)).toEqual([]);
    expect((await warm(b, 5)).flatMap(problemsOf)).toEqual([]);
    const apps = await backendApps();
    expect(apps.length).toBe(10);

    const sampler = await startSampler();
    let next: Outcome[];
    try {
      await crash(env.TENANTS.getByName(a.id));
      // The first request wakes the restarted object: it releases generation 1 and starts 2 at once.
      next = await warm(a, 5);
    } finally {
      const samples = await sampler.stop();
      expectWithinBudget(samples);
    }
    expect(next.flatMap(problemsOf)).toEqual([]);
    expect(new Set(next.map((o) => o.app))).toEqual(new Set([`lessor:${a.role}:2`]));
    const status = await capacity();
    expect(status).toMatchObject({ allocated: 10, pools: { allocated: 2 } });
    const settled = await pollUntil(backendApps, (list) => !list.includes(`lessor:${a.role}:1`));
    expect(settled.filter((app) => app === `lessor:${a.role}:1`)).toEqual([]);
  });

  it("pinned pools are never evicted: an idle unpinned pool goes instead, and with all pinned a start is refused", async () => {
    const a = await newTenant("pin-a");
    const b = await newTenant("pin-b");
    const c = await newTenant("pin-c");
    expect((await probe(a)).status).toBe(200);
    expect((await probe(b)).status).toBe(200);
    const pinned = await admin(`/v1/tenants/${a.id}/pin`, { method: "POST" });
    expect(pinned.status).toBe(200);
    expect((await pinned.json<{ runtime: Runtime }>()).runtime.pinned).toBe(true);
    const generationA = (await runtime(a)).generation;
    // a is the least recently used, but pinned: the budget shows only b as a candidate.
    expect((await capacity()).candidates.map((x) => x.tenantId)).toEqual([b.id]);

    const served = await probe(c);
    expect(problemsOf(served)).toEqual([]);
    expect(served.status).toBe(200);
    expect(await runtime(a)).toMatchObject({ state: "ready", generation: generationA, pinned: true });
    expect((await runtime(b)).state).toBe("stopped");

    // Pin c too: nothing is evictable, so b's start is refused with a retry hint.
    expect((await admin(`/v1/tenants/${c.id}/pin`, { method: "POST" })).status).toBe(200);
    const refused = await probe(b);
    expect(refused).toMatchObject({ status: 503, code: "capacity_saturated" });
    expect(await runtime(a)).toMatchObject({ state: "ready", generation: generationA });
    expect((await runtime(c)).state).toBe("ready");

    // Unpinning makes a pool evictable again.
    expect((await admin(`/v1/tenants/${a.id}/unpin`, { method: "POST" })).status).toBe(200);
    const retried = await untilServed(b, 4);
    expect(retried.at(-1)?.status).toBe(200);
    expect((await runtime(a)).state).toBe("stopped");
    expect((await runtime(c)).state).toBe("ready");
  });

  it("migrating pools are never evicted, even when idle and least recently used", async () => {
    const a = await newTenant("mig-a");
    const b = await newTenant("mig-b");
    const c = await newTenant("mig-c");
    const d = await newTenant("mig-d");
    expect((await probe(a)).status).toBe(200);
    expect((await probe(b)).status).toBe(200);
    const generationA = (await runtime(a)).generation;

    // Hold the migrator's advisory lock in a's database: a's migration enters `migrating` and
    // stays there, idle, until the lock is let go.
    await asSuperuser(async (lock) => {
      await lock.query("SELECT pg_advisory_lock($1)", [migrationLockKey]);
      const migration = env.TENANTS.getByName(a.id).migrate(a.id, 1, 1_000);
      try {
        const migrating = await pollUntil(
          () => runtime(a),
          (r) => r.migrating,
          { attempts: 40, intervalMs: 50 },
        );
        expect(migrating).toMatchObject({ migrating: true, leases: 0, generation: generationA });
        expect((await capacity()).candidates.map((x) => x.tenantId)).toEqual([b.id]);

        const sampler = await startSampler();
        let served: Outcome;
        try {
          served = await probe(c);
        } finally {
          const samples = await sampler.stop();
          // The migration's own connection (lessor:<a>:migrate) draws on the reserve: still ≤ 12.
          expectWithinBudget(samples);
        }
        expect(served.status).toBe(200);
        expect(await runtime(a)).toMatchObject({ state: "ready", generation: generationA, migrating: true });
        expect((await runtime(b)).state).toBe("stopped");

        // Pin c: a (migrating) and c (pinned) hold the host, so d is refused; a stays.
        expect((await admin(`/v1/tenants/${c.id}/pin`, { method: "POST" })).status).toBe(200);
        const refused = await probe(d);
        expect(refused).toMatchObject({ status: 503, code: "capacity_saturated" });
        expect(await runtime(a)).toMatchObject({ state: "ready", generation: generationA, migrating: true });
      } finally {
        await lock.query("SELECT pg_advisory_unlock($1)", [migrationLockKey]);
        const result = await migration;
        expect(result.outcome).toBe("migrated");
      }
    }, a.database);

    // The migration is over: a is an ordinary idle pool again, and d's retry evicts it.
    expect((await runtime(a)).migrating).toBe(false);
    const retried = await untilServed(d, 4);
    expect(retried.at(-1)?.status).toBe(200);
    expect((await runtime(a)).state).toBe("stopped");
    expect((await runtime(c)).state).toBe("ready");
  });
});
