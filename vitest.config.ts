import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";
import { ensureLocalTls } from "./local/tls.ts";
import { testAdminKey, testKeyMacKey, testSealKey } from "./test/secrets.ts";

// workerd trusts the local certificate authority (local/tls.ts) through miniflare, which reads
// NODE_EXTRA_CA_CERTS once, when it is loaded: so it is set first, and the plugin (which loads
// miniflare) is imported after it.
process.env.NODE_EXTRA_CA_CERTS = ensureLocalTls().caFile;
const { cloudflareTest } = await import("@cloudflare/vitest-plugin");

/** The integration files of the second half (the longest files alternate between the halves). */
const secondHalf = [
  "campaign-fleet",
  "maintenance",
  "operator",
  "seal-ring",
  "edge",
  "faults",
  "campaign-traffic",
  "leases",
  "isolation",
  "killed-mid-write",
  "tenants-paging",
  "usage-readers",
  "examples",
  "messages",
  "prompt-close",
  "client",
  "drain",
  "smoke",
  "bad-input",
  "rotation",
  "jwt",
  "mass-restart",
  "tunnels",
].map((file) => `test/integration/${file}.test.ts`);

/**
 * The tests run on a tenant schema of their own (test/fixtures/tenant-schema/): wherever the Worker
 * imports the product's bundled tenant migrations, it gets the fixture's. A user who adds
 * migrations or replaces the example schema (docs/migrations.md) changes what ships, not what the
 * tests assume; test/unit/user-schema.test.ts runs the product's own bundle in a scratch copy.
 */
const fixtureTenantMigrations = {
  find: /^(?:\.\.?\/)+(?:src\/)?migrations\/tenant\.gen\.ts$/,
  replacement: fileURLToPath(new URL("./test/fixtures/tenant-schema/migrations.gen.ts", import.meta.url)),
};

/** The bindings whose value a global setup provided. */
function definedOnly(bindings: Record<string, string | undefined>): Record<string, string> {
  return Object.fromEntries(
    Object.entries(bindings).filter((entry): entry is [string, string] => entry[1] !== undefined),
  );
}

/** A project whose tests run inside workerd against the real Postgres its global setup starts. */
function workersProject(name: string, include: string[], globalSetup: string, exclude: string[] = []) {
  return {
    plugins: [
      cloudflareTest(({ inject }) => ({
        wrangler: { configPath: "./wrangler.toml" },
        miniflare: {
          bindings: {
            LESSOR_ADMIN_KEY: testAdminKey,
            // elastic: a pool of 2 on a fixed host; on an adaptive one it starts at 2 and moves from the
            // host's floor up to 6 (adaptive.test.ts).
            LESSOR_POOL_SIZES: JSON.stringify({
              free: 2,
              standard: 5,
              pro: 6,
              solo: 1,
              elastic: { size: 2, max: 6 },
            }),
            LESSOR_BUDGETS: JSON.stringify({
              local: { connections: 300, reserve: 10 },
              small: { connections: 12, reserve: 2 },
              tiny: { connections: 12, reserve: 2 },
              // Pools 10: the wire endpoint's budget storm (wire-budget.test.ts).
              wire: { connections: 12, reserve: 2 },
              // Pools 10 + rotation reserve 5: exactly one standard pool may overlap.
              rot: { connections: 12, reserve: 2, rotationReserve: 5 },
              // Pools 7 + rotation reserve 1: a standard pool's rotation never fits, a free one's only after a release.
              rotfull: { connections: 9, reserve: 2, rotationReserve: 1 },
              faulty: { connections: 100, reserve: 4 },
              tcpfault: { connections: 20, reserve: 2 },
              silent: { connections: 20, reserve: 2 },
              // Adaptive admission (adaptive.test.ts): pools share 10 and move between a floor of 1 and
              // their tier's maximum; a window of 2 s so a test sees a pool shrink.
              adaptive: {
                connections: 12,
                reserve: 2,
                adaptive: { floor: 1, growthStep: 1, windowMs: 2_000 },
              },
              // A fleet of 100 one-connection pools, restarted at once (mass-restart.test.ts).
              mass: { connections: 120, reserve: 10 },
              // The hosts of host-kinds.test.ts.
              "*": { connections: 20, reserve: 2 },
            }),
            LESSOR_SEAL_KEY: testSealKey,
            LESSOR_KEY_MAC_KEYS: testKeyMacKey,
            // The tests' waits were written against a minute (the product's default is ADR 021's 20 s).
            LESSOR_IDLE_TIMEOUT_MS: "60000",
            // Short enough for the containment tests to watch the bounds act.
            LESSOR_STATEMENT_TIMEOUT_MS: "5000",
            LESSOR_LEASE_MAX_LIFETIME_MS: "120000",
            // Short enough for the erase tests to see a lease outlast the wait and be ended.
            LESSOR_ERASE_LEASE_WAIT_MS: "2000",
            LESSOR_CONTROL_PLANE_URL: inject("controlPlaneUrl"),
            LESSOR_HOSTS: inject("hostsJson"),
            // New tenants that name no host go where they always went in the tests (the first host
            // of their region); placement by room is tested on hosts named for it (host-room.test.ts).
            LESSOR_PLACEMENT_HOSTS: inject("placementHosts"),
            LESSOR_WS_PROXY: inject("wsProxy"),
            TEST_PG_SUPERUSER_URL: inject("pgSuperuserUrl"),
            TEST_PROXY_CONTROL_URL: inject("proxyControlUrl"),
            TEST_JWKS_SERVER_URL: inject("jwksServerUrl"),
            TEST_PG_SERVER_LOG: inject("pgServerLog"),
            TEST_TCP_FAULT_CONTROL_URL: inject("tcpFaultControlUrl"),
            TEST_FAKE_PG_PORTS: inject("fakePostgresPorts"),
            TEST_FAKE_PG_CONTROL_URL: inject("fakePostgresControlUrl"),
            // The customer's server behind a tunnel (test/customer-server.ts), in the half that has one.
            ...definedOnly({
              // Unset (one region) but in the regions project.
              LESSOR_REGIONS: inject("regionsJson"),
              LESSOR_TUNNELS: inject("tunnelsJson"),
              TEST_CUSTOMER_PG_SUPERUSER_URL: inject("customerPgSuperuserUrl"),
              TEST_TUNNEL_PROXY: inject("tunnelProxy"),
              TEST_TUNNEL_PROXY_CONTROL_URL: inject("tunnelProxyControlUrl"),
              TEST_CUSTOMER_PG_SERVER_LOG: inject("customerPgServerLog"),
            }),
          },
        },
      })),
    ],
    resolve: { alias: [fixtureTenantMigrations] },
    test: {
      name,
      include,
      exclude,
      globalSetup: [globalSetup],
      // The hosts' sweep alarms start off in every file (test/integration/setup.ts).
      setupFiles: ["./test/integration/setup.ts"],
      testTimeout: 60_000,
      hookTimeout: 60_000,
      // The files of a project share its Postgres and assume its hosts, budgets and cron are theirs
      // alone: one file at a time, whatever the machine (the default worker count is cores − 1,
      // which is 1 only on a 2-core machine).
      fileParallelism: false,
      maxWorkers: 1,
    },
  };
}

export default defineConfig({
  test: {
    // A passing run prints the summary; a failing test prints its own logs (src/log).
    silent: "passed-only",
    projects: [
      {
        test: {
          name: "unit",
          include: ["test/unit/**/*.test.ts"],
          environment: "node",
          // Modules under test import workerd's sockets (src/postgres/socket.ts); Node has none.
          alias: [
            {
              find: /^cloudflare:sockets$/,
              replacement: fileURLToPath(new URL("./test/stubs/cloudflare-sockets.ts", import.meta.url)),
            },
          ],
          // A few unit tests drive real sockets (the WebSocket proxy's backpressure) and take seconds
          // on a loaded machine; their own loops are bounded.
          testTimeout: 60_000,
        },
      },
      {
        test: {
          name: "user-schema",
          include: ["test/user-schema/**/*.test.ts"],
          environment: "node",
          // Each case copies the checkout and runs a workerd test file in the copy.
          testTimeout: 360_000,
          hookTimeout: 120_000,
        },
      },
      {
        test: {
          name: "canary",
          include: ["test/canary/**/*.test.ts"],
          environment: "node",
          // `npm start` in a scratch copy, driven through faults.
          testTimeout: 300_000,
          hookTimeout: 240_000,
        },
      },
      // The integration files in two halves, each on a Postgres of its own, so `npm test` runs the
      // halves side by side in two vitest processes (test/run.ts) without one half's cron, hosts or
      // budgets meeting the other's. Balanced by measured duration.
      workersProject("workers", ["test/integration/**/*.test.ts"], "./test/global-setup.ts", secondHalf),
      workersProject("workers-2", secondHalf, "./test/global-setup-2.ts"),
      // Stops and restarts its own Postgres under load: kept apart so no other test sees the outage.
      workersProject("pg-restart", ["test/pg-restart/**/*.test.ts"], "./test/pg-restart/global-setup.ts"),
      // Cuts the control plane off (and only it): kept apart so no other test sees the outage.
      // Two regions; stops one region's control plane at a time: kept apart so no other test sees it.
      workersProject("regions", ["test/regions/**/*.test.ts"], "./test/regions/global-setup.ts"),
      workersProject(
        "control-plane-outage",
        ["test/control-plane-outage/**/*.test.ts"],
        "./test/control-plane-outage/global-setup.ts",
      ),
    ],
  },
});
