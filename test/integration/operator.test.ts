/**
 * The operator's surface against the real stack: `/metrics` (auth, both formats, parsed with a real
 * Prometheus text parser, and a series count that does not grow with tenants), the eviction dry
 * run, the admissions counter, failing tenants found from lifecycle events, the fleet's events,
 * tenant search and the overview the status page draws.
 */
import { env, runDurableObjectAlarm } from "cloudflare:test";
import parsePrometheusTextFormat from "parse-prometheus-text-format";
import { describe, expect, it } from "vitest";
import { app } from "../../src/app.ts";
import type { FleetOverview } from "../../src/fleet/overview.ts";
import type { CapacityStatus, EvictionReport } from "../../src/rpc/budget.ts";
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

const filePrefix = uniqueTenantId("ops");

async function scrape(accept?: string): Promise<string> {
  const response = await admin("/metrics", accept ? { headers: { Accept: accept } } : {});
  expect(response.status).toBe(200);
  return response.text();
}

/** Every series of a Prometheus text exposition, as `name{label="value",…}`, via the parser. */
function seriesOf(text: string): string[] {
  const families = parsePrometheusTextFormat(text);
  const series: string[] = [];
  for (const family of families) {
    for (const metric of family.metrics) {
      const labels = Object.entries(metric.labels ?? {})
        .map(([k, v]) => `${k}="${v}"`)
        .sort()
        .join(",");
      series.push(`${family.name}{${labels}}`);
    }
  }
  return series.sort();
}

/** The value of one series (labels matched exactly) in a parsed exposition. */
function sampleValue(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  const family = parsePrometheusTextFormat(text).find((f) => f.name === name);
  const metric = family?.metrics.find(
    (m) =>
      JSON.stringify(Object.entries(m.labels ?? {}).sort()) === JSON.stringify(Object.entries(labels).sort()),
  );
  return metric && "value" in metric ? Number(metric.value) : undefined;
}

async function run(tenant: CreatedTenant, query = "SELECT 1"): Promise<Response> {
  return sqlRequest(tenant.connectionString, { query, params: [] });
}

async function capacityOf(host: string): Promise<CapacityStatus> {
  const response = await admin("/v1/capacity");
  const { hosts } = await response.json<{ hosts: CapacityStatus[] }>();
  const found = hosts.find((h) => h.host === host);
  if (!found) throw new Error(`no host ${host}`);
  return found;
}

describe("GET /metrics", () => {
  it("refuses without a key, with a wrong key and with a tenant key; takes LESSOR_METRICS_KEY when set", async () => {
    expect((await lessor("/metrics")).status).toBe(401);
    expect((await lessor("/metrics", { headers: { Authorization: "Bearer nope" } })).status).toBe(401);
    const tenant = await createTenant(`${filePrefix}-auth`);
    expect((await lessor("/metrics", { headers: { Authorization: `Bearer ${tenant.key}` } })).status).toBe(
      401,
    );

    const withMetricsKey = { ...env, LESSOR_METRICS_KEY: "scraper-key" };
    const scraped = await app.request(
      "/metrics",
      { headers: { Authorization: "Bearer scraper-key" } },
      withMetricsKey,
    );
    expect(scraped.status).toBe(200);
    const refused = await app.request("/metrics", { headers: { Authorization: "Bearer scraper-key" } }, env);
    expect(refused.status).toBe(401);
  });

  it("speaks Prometheus text by default and OpenMetrics when asked", async () => {
    const prometheus = await admin("/metrics");
    expect(prometheus.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
    const text = await prometheus.text();
    expect(text).toContain("# TYPE lessor_evictions_total counter");

    const open = await admin("/metrics", {
      headers: { Accept: "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5" },
    });
    expect(open.headers.get("content-type")).toMatch(/^application\/openmetrics-text; version=1\.0\.0/);
    const om = await open.text();
    expect(om.endsWith("# EOF\n")).toBe(true);
    // OpenMetrics names the counter family without `_total` and its sample with it.
    expect(om).toContain("# TYPE lessor_evictions counter");
    expect(om).toMatch(/^lessor_evictions_total\{region="default",host="local"\} \d+$/m);
    // Same series either way: drop the EOF, name counter families as 0.0.4 does (with `_total`), parse.
    const counters = [...om.matchAll(/^# TYPE (\w+) counter$/gm)].map((m) => m[1]);
    let asPrometheus = om.replace(/# EOF\n$/, "");
    for (const name of counters) {
      asPrometheus = asPrometheus
        .replace(`# HELP ${name} `, `# HELP ${name}_total `)
        .replace(`# TYPE ${name} counter`, `# TYPE ${name}_total counter`);
    }
    expect(seriesOf(asPrometheus)).toEqual(seriesOf(text));
  });

  it("has the same series with 50 tenants as with 5, and no label value is a tenant id", async () => {
    const tenants: CreatedTenant[] = [];
    // Tier solo (pool of 1) keeps 50 warm pools well inside the shared local budget.
    const make = (n: number) =>
      mapConcurrent(
        Array.from({ length: n }, (_, i) => `${filePrefix}-c${tenants.length + i}`),
        4,
        async (id) => {
          const tenant = await createTenant(id, { tier: "solo" });
          expect((await run(tenant)).status).toBe(200);
          return tenant;
        },
      );
    tenants.push(...(await make(5)));
    const five = await scrape();
    tenants.push(...(await make(45)));
    // Fifty warm pools, some leased and some flushed, so every source has seen them.
    await mapConcurrent(tenants.slice(0, 10), 5, (t) => runDurableObjectAlarm(env.TENANTS.getByName(t.id)));
    const fifty = await scrape();

    expect(seriesOf(fifty)).toEqual(seriesOf(five));
    const labelValues = new Set(
      parsePrometheusTextFormat(fifty).flatMap((f) =>
        f.metrics.flatMap((m) => Object.values(m.labels ?? {})),
      ),
    );
    for (const tenant of tenants) expect(labelValues.has(tenant.id)).toBe(false);
    expect(fifty).not.toContain(filePrefix);
    // The tenants really are counted (pools of the first ones may have idled out meanwhile).
    const solo = { region: "default", host: "local", tier: "solo", status: "active" };
    expect(sampleValue(fifty, "lessor_tenants", solo)).toBeGreaterThanOrEqual(
      (sampleValue(five, "lessor_tenants", solo) ?? 0) + 45,
    );
    expect(seriesOf(fifty).length).toBeGreaterThan(40);
  }, 240_000);

  it("reads budgets, admissions and usage that match the JSON API", async () => {
    const before = await capacityOf("local");
    const tenant = await createTenant(`${filePrefix}-adm`, { tier: "solo" });
    expect((await run(tenant)).status).toBe(200);
    const after = await capacityOf("local");
    expect(after.admissions).toBeGreaterThan(before.admissions);

    const text = await scrape();
    const granted =
      sampleValue(text, "lessor_admissions_total", {
        region: "default",
        host: "local",
        outcome: "granted",
      }) ?? -1;
    expect(granted).toBeGreaterThanOrEqual(after.admissions);
    expect(sampleValue(text, "lessor_config_max_connections", { region: "default", host: "small" })).toBe(12);
    expect(sampleValue(text, "lessor_config_reserve_connections", { region: "default", host: "small" })).toBe(
      2,
    );
    expect(sampleValue(text, "lessor_config_pool_size", { tier: "solo" })).toBe(1);
    expect(sampleValue(text, "lessor_control_plane_up", { region: "default" })).toBe(1);
    const usage = await (await admin("/v1/usage")).json<{ usage: { queries: number } }>();
    expect(sampleValue(text, "lessor_stats_queries_total", { region: "default" })).toBeGreaterThanOrEqual(
      usage.usage.queries,
    );
  });
});

describe("GET /status", () => {
  it("serves the page shell without a key, under a strict Content-Security-Policy", async () => {
    const page = await lessor("/status");
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toMatch(/^text\/html/);
    expect(page.headers.get("content-security-policy")).toContain("script-src 'self'");
    expect(page.headers.get("content-security-policy")).toContain("connect-src 'self'");
    expect(await page.text()).toContain('<form id="login-form" method="post"');
    const script = await lessor("/status/app.js");
    expect(script.headers.get("content-type")).toMatch(/^text\/javascript/);
    expect((await lessor("/status/app.css")).status).toBe(200);
    // The data behind it is not public.
    expect((await lessor("/v1/fleet/overview")).status).toBe(401);
  });
});

describe("GET /v1/capacity/evictions", () => {
  it("says which pool an admission would evict and why every other one is spared", async () => {
    const idle = await createTenant(`${filePrefix}-idle`, { tier: "solo" });
    const leased = await createTenant(`${filePrefix}-leased`, { tier: "solo" });
    const pinned = await createTenant(`${filePrefix}-pinned`, { tier: "solo" });
    for (const t of [idle, leased, pinned]) expect((await run(t)).status).toBe(200);
    const opened = await lessor(`/v1/tenants/${leased.id}/leases`, {
      method: "POST",
      headers: { Authorization: `Bearer ${leased.key}` },
      body: JSON.stringify({ ttlMs: 60_000 }),
    });
    expect(opened.status).toBe(201);
    const { lease } = await opened.json<{ lease: string }>();
    expect((await admin(`/v1/tenants/${pinned.id}/pin`, { method: "POST" })).status).toBe(200);
    // Each pool tells its budget how it is used on its heartbeat.
    for (const t of [idle, leased, pinned]) await runDurableObjectAlarm(env.TENANTS.getByName(t.id));

    const response = await admin("/v1/capacity/evictions?host=local&tier=solo");
    expect(response.status).toBe(200);
    const { hosts } = await response.json<{ hosts: EvictionReport[] }>();
    const report = hosts[0];
    expect(report?.host).toBe("local");
    expect(report?.size).toBe(1);
    const verdict = (id: string) => report?.pools.find((p) => p.tenantId === id);
    expect(verdict(leased.id)).toMatchObject({ verdict: "not_eligible", reason: "leased" });
    expect(verdict(pinned.id)).toMatchObject({ verdict: "not_eligible", reason: "pinned" });
    expect(["evict", "eligible_not_needed"]).toContain(verdict(idle.id)?.verdict);

    // A start far larger than the host can hold is reported as saturated, evicting nothing.
    const huge = await (await admin("/v1/capacity/evictions?host=local&size=9999")).json<{
      hosts: EvictionReport[];
    }>();
    expect(huge.hosts[0]?.outcome).toBe("saturated");
    expect(huge.hosts[0]?.pools.some((p) => p.verdict === "evict")).toBe(false);

    expect((await admin("/v1/capacity/evictions?host=nope")).status).toBe(400);
    expect((await admin("/v1/capacity/evictions?tier=nope")).status).toBe(400);
    expect((await lessor("/v1/capacity/evictions")).status).toBe(401);
    await lessor(`/v1/leases/${lease}`, {
      method: "DELETE",
      headers: { Authorization: `Bearer ${leased.key}` },
    });
    await admin(`/v1/tenants/${pinned.id}/unpin`, { method: "POST" });
  });
});

describe("fleet view", () => {
  it("lists a tenant whose start failed, with its reason and retry time, and counts it in /metrics", async () => {
    const tenant = await createTenant(`${filePrefix}-fail`);
    await asSuperuser((client) => client.query(`ALTER ROLE "${tenant.role}" NOLOGIN`));
    try {
      expect((await run(tenant)).status).toBe(503);
      // The failure event reaches the control plane on the object's next heartbeat.
      await runDurableObjectAlarm(env.TENANTS.getByName(tenant.id));
      const failing = await pollUntil(
        async () =>
          (await admin("/v1/fleet/failing?limit=200")).json<{
            count: number;
            tenants: { tenantId: string; reason: string }[];
          }>(),
        (body) => body.tenants.some((t) => t.tenantId === tenant.id),
      );
      expect(failing.tenants.find((t) => t.tenantId === tenant.id)?.reason).toBe("auth_failed");

      const overview = await (await admin("/v1/fleet/overview")).json<FleetOverview>();
      expect(overview.controlPlane).toBe("up");
      expect(overview.pools.failed).toBeGreaterThanOrEqual(1);
      const listed = overview.failing?.tenants.find((t) => t.tenantId === tenant.id);
      if (listed) {
        expect(listed.state).toBe("failed");
        expect(Date.parse(listed.retryAt ?? "")).toBeGreaterThan(0);
      } else {
        // Other files' failures may be more recent; the page lists the newest 20.
        expect(overview.failing?.count).toBeGreaterThan(20);
      }
      expect(
        sampleValue(await scrape(), "lessor_pools", { region: "default", host: "local", state: "failed" }),
      ).toBeGreaterThanOrEqual(1);

      const events = await (await admin("/v1/fleet/events?limit=200")).json<{
        events: { tenantId: string; to: string }[];
      }>();
      expect(events.events.some((e) => e.tenantId === tenant.id && e.to === "failed")).toBe(true);
    } finally {
      await asSuperuser((client) => client.query(`ALTER ROLE "${tenant.role}" LOGIN`));
    }
  });

  it("pages the fleet's events without repeats and refuses a cursor it did not hand out", async () => {
    const first = await (await admin("/v1/fleet/events?limit=3")).json<{
      events: { tenantId: string; seq: number; at: string }[];
      nextCursor: string | null;
    }>();
    expect(first.events).toHaveLength(3);
    expect(first.nextCursor).not.toBeNull();
    const second = await (await admin(`/v1/fleet/events?limit=3&cursor=${first.nextCursor}`)).json<{
      events: { tenantId: string; seq: number; at: string }[];
    }>();
    const key = (e: { tenantId: string; seq: number }) => `${e.tenantId}:${e.seq}`;
    for (const e of second.events) expect(first.events.map(key)).not.toContain(key(e));
    expect(Date.parse(second.events[0]?.at ?? "")).toBeLessThanOrEqual(Date.parse(first.events[2]?.at ?? ""));
    expect((await admin("/v1/fleet/events?cursor=drop-table")).status).toBe(400);
  });

  it("searches tenants by id prefix, bounded, and never lists the catalog without a query", async () => {
    const found = await (await admin(`/v1/fleet/tenants?q=${filePrefix}-c1&limit=5`)).json<{
      tenants: { id: string }[];
    }>();
    expect(found.tenants.length).toBeGreaterThan(0);
    expect(found.tenants.length).toBeLessThanOrEqual(5);
    for (const t of found.tenants) expect(t.id.startsWith(`${filePrefix}-c1`)).toBe(true);
    expect((await admin("/v1/fleet/tenants")).status).toBe(400);
    expect((await admin("/v1/fleet/tenants?q=%25")).status).toBe(400);
    expect((await admin("/v1/fleet/tenants?q=a&limit=51")).status).toBe(400);
  });
});
