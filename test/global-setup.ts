/**
 * Starts the real local stack once for the whole test run: a throwaway Postgres on a free port,
 * the WebSocket proxy and the control-plane schema. Tests inside workerd reach it through the
 * bindings that vitest.config.ts builds from what this provides.
 */

import pg from "pg";
import type { TestProject } from "vitest/node";
import { type FaultProxy, startFaultProxy } from "../local/fault-proxy.ts";
import { localAdminRole, providerGroup } from "../local/host-setup.ts";
import { freePort, type LocalStack, prepareRegionControlPlane, startLocalStack } from "../local/stack.ts";
import { localTlsHostname } from "../local/tls.ts";
import { type CustomerServer, startCustomerServer } from "./customer-server.ts";
import { type FakePostgres, startFakePostgres } from "./fake-postgres.ts";
import { type JwksServer, startJwksServer } from "./jwks-server.ts";
import { testPgPassword } from "./secrets.ts";
import { serverLogFile, serverLogFlags } from "./server-log.ts";

declare module "vitest" {
  export interface ProvidedContext {
    controlPlaneUrl: string;
    hostsJson: string;
    /** `LESSOR_PLACEMENT_HOSTS`: where a create that names no host may go. */
    placementHosts: string;
    wsProxy: string;
    pgSuperuserUrl: string;
    proxyControlUrl: string;
    jwksServerUrl: string;
    pgServerLog: string;
    /** The customer's server behind a tunnel (test/customer-server.ts), where a half asks for it. */
    tunnelsJson?: string;
    customerPgSuperuserUrl?: string;
    tunnelProxy?: string;
    tunnelProxyControlUrl?: string;
    customerPgServerLog?: string;
    /** `LESSOR_REGIONS` of the regions project (unset elsewhere: one region). */
    regionsJson?: string;
    /** The TCP fault proxy's control URL (local/fault-proxy.ts), in front of host `tcpfault`. */
    tcpFaultControlUrl: string;
    /** The refusing servers of the TCP path's tests (test/fake-postgres.ts): ports by mode, as JSON. */
    fakePostgresPorts: string;
    fakePostgresControlUrl: string;
  }
}

/**
 * A setup/teardown pair with a stack of its own: each vitest project that calls this gets its own
 * Postgres (the Postgres-restart project stops and starts its cluster without touching the others).
 */
export function localStackSetup(
  name: string,
  options: { controlPlaneAddress?: string; customerServer?: boolean; regions?: boolean } = {},
) {
  let stack: (LocalStack & { serverLogPath: string }) | undefined;
  let jwks: JwksServer | undefined;
  let customer: CustomerServer | undefined;
  let faultProxy: FaultProxy | undefined;
  let fake: FakePostgres | undefined;
  return {
    setup: async (project: TestProject) => {
      stack = await startLocalTestStack(name);
      // The TCP path's own faults: a proxy that passes TLS through untouched and cuts or stalls it.
      faultProxy = await startFaultProxy({
        host: "127.0.0.1",
        target: { host: stack.pg.host, port: stack.pg.port },
      });
      project.provide("tcpFaultControlUrl", faultProxy.controlUrl);
      fake = await startFakePostgres(stack.tls);
      project.provide("fakePostgresPorts", JSON.stringify(fake.ports));
      project.provide("fakePostgresControlUrl", fake.controlUrl);
      await provideTestStack(
        project,
        stack,
        options.controlPlaneAddress,
        options.regions ?? false,
        faultProxy.port,
      );
      jwks = await startJwksServer();
      project.provide("jwksServerUrl", jwks.url);
      if (options.customerServer) {
        customer = await startCustomerServer(name);
        project.provide("tunnelsJson", customer.tunnelsJson);
        project.provide("customerPgSuperuserUrl", customer.superuserUrl);
        project.provide("tunnelProxy", customer.tunnelProxy);
        project.provide("tunnelProxyControlUrl", customer.tunnelProxyControlUrl);
        project.provide("customerPgServerLog", customer.serverLog);
      }
    },
    teardown: async () => {
      await fake?.close();
      await faultProxy?.close();
      await customer?.stop();
      await jwks?.close();
      await stack?.stop();
    },
  };
}

async function startLocalTestStack(name: string): Promise<LocalStack & { serverLogPath: string }> {
  const dataDir = `.lessor/test-${name}-pg-${process.pid}`;
  // The server's own log (connections, and what tests make it log), read back by the tests
  // (test/server-log.ts, test/integration/server-log.ts).
  const serverLog = serverLogFile(dataDir);
  const stack = await startLocalStack({
    dataDir,
    pgPort: await freePort(),
    pgPassword: testPgPassword,
    persistent: false,
    proxyControl: true,
    // Hosts that cannot set it to 0 (Lessor's advice) need the clean-up path tested.
    maxPreparedTransactions: 10,
    pgFlags: serverLogFlags,
    log: serverLog.append,
  });
  const stop = stack.stop;
  stack.stop = async () => {
    await stop();
    serverLog.remove();
  };
  return Object.assign(stack, { serverLogPath: serverLog.path });
}

async function provideTestStack(
  project: TestProject,
  stack: LocalStack & { serverLogPath: string },
  controlPlaneAddress: string | undefined,
  regions: boolean,
  faultProxyPort: number,
): Promise<void> {
  project.provide("pgServerLog", stack.serverLogPath);
  // A control plane under an address of its own can be cut off alone (the outage project).
  project.provide(
    "controlPlaneUrl",
    controlPlaneAddress
      ? stack.controlPlaneUrl.replace("@127.0.0.1:", `@${controlPlaneAddress}:`)
      : stack.controlPlaneUrl,
  );
  // Lessor's host admin: what a managed provider gives (local/host-setup.ts), never the superuser.
  // Reached over TCP with TLS verified, as a deployed `postgres` host is (docs/adr/027): by the name
  // its certificate names.
  const admin = stack.tcpAdminUrl("postgres");
  // The same admin by the address the WebSocket proxy forwards to (hosts that play Neon, and the
  // hosts whose faults the proxy injects).
  const proxied = stack.adminUrl("postgres");
  await createTestAdmins(stack);
  const as = (role: string) => admin.replace(`//${localAdminRole}:`, `//${role}:`);
  project.provide(
    "hostsJson",
    JSON.stringify({
      local: admin,
      // Same cluster under other names: a host with a small budget, and one the tests can cut off.
      small: admin,
      // Another small host, for the maintenance tests (each file's budgets are its own, but Postgres is shared).
      tiny: admin,
      // The wire endpoint's budget storm (wire-budget.test.ts).
      wire: admin,
      // Hosts for the rotation tests: one with a rotation reserve that fits an overlap, one without room.
      rot: admin,
      rotfull: admin,
      // Hosts whose faults the WebSocket proxy injects (by address): on the proxy's path, which
      // exists only on this machine (configuration allows it only while LESSOR_WS_PROXY is set).
      faulty: { url: proxied.replace("@127.0.0.1:", "@127.0.0.2:"), path: "websocket" },
      // A host the blackhole tests stall; where 127.0.0.3 is the control plane, there is none.
      ...(controlPlaneAddress
        ? {}
        : { silent: { url: proxied.replace("@127.0.0.1:", "@127.0.0.3:"), path: "websocket" } }),
      // The TCP path's faults: the same cluster behind the TCP fault proxy (local/fault-proxy.ts).
      tcpfault: admin.replace(/@[^@/]+\//, `@${localTlsHostname}:${faultProxyPort}/`),
      // Hosts whose admin lacks what Lessor needs (host-kinds.test.ts), one configured for reduced
      // containment, and two whose admins' DDL the server logs: one of Neon's kind, one not.
      nocreatedb: as("lessor_nocreatedb"),
      notrigger: as("lessor_notrigger"),
      reduced: { url: as("lessor_notrigger"), containment: "reduced" },
      neonlike: {
        url: proxied.replace(`//${localAdminRole}:`, "//lessor_admin_neon:"),
        kind: "neon",
      },
      logged: { url: as("lessor_admin_logged"), locationHint: "weur" },
      // The mass restart's fleet (mass-restart.test.ts).
      mass: admin,
      // Adaptive admission's host (adaptive.test.ts).
      adaptive: admin,
      // Hosts with a room in tenants (host-room.test.ts): two databases; one database and three
      // roles; one database (the race for the last place).
      "room-a": { url: admin, maxDatabases: 2 },
      "room-j": { url: admin, maxRoles: 3 },
      "room-1": { url: admin, maxDatabases: 1 },
      // The regions project's second region's hosts (test/regions).
      ...(regions ? { "eu-1": admin, "eu-2": admin } : {}),
    }),
  );
  // Two regions (test/regions): the default one on the control plane above, and `eu` on a control
  // plane of its own, reached as 127.0.0.2 so the proxy can cut either region's off alone.
  project.provide(
    "regionsJson",
    regions
      ? JSON.stringify({
          us: { locationHint: "enam" },
          eu: {
            controlPlaneUrl: (await prepareRegionControlPlane(stack.pg, testPgPassword, "eu")).replace(
              "@127.0.0.1:",
              "@127.0.0.2:",
            ),
            hosts: ["eu-1", "eu-2"],
            // No jurisdiction: workerd refuses `jurisdiction()` ("not implemented"); the code path
            // that applies one is unit-tested (test/unit/regions.test.ts).
            locationHint: "weur",
          },
        })
      : "",
  );
  project.provide("placementHosts", regions ? "local,eu-1" : "local");
  project.provide("wsProxy", stack.wsProxy);
  project.provide("pgSuperuserUrl", stack.pg.url("postgres"));
  project.provide("proxyControlUrl", `http://${stack.wsProxy}/__control`);
}

/** The test admins of the hosts above; every one has the same password as the stack's admin. */
async function createTestAdmins(stack: LocalStack): Promise<void> {
  const client = new pg.Client(stack.pg.url("postgres"));
  await client.connect();
  try {
    const password = testPgPassword;
    for (const statement of [
      // The provider's group, but no CREATEDB (an attribute: not inherited from the group).
      `CREATE ROLE lessor_nocreatedb LOGIN CREATEROLE PASSWORD '${password}'`,
      `GRANT ${providerGroup} TO lessor_nocreatedb WITH INHERIT TRUE`,
      // Everything but a way to create event triggers (not in the provider group).
      `CREATE ROLE lessor_notrigger LOGIN CREATEROLE CREATEDB PASSWORD '${password}'`,
      "GRANT pg_signal_backend, pg_monitor TO lessor_notrigger",
      "GRANT CONNECT ON DATABASE postgres TO lessor_nocreatedb, lessor_notrigger",
      // Admins like the stack's, whose DDL the server logs (the password modes are read from it).
      `CREATE ROLE lessor_admin_neon LOGIN CREATEROLE CREATEDB REPLICATION BYPASSRLS PASSWORD '${password}'`,
      `CREATE ROLE lessor_admin_logged LOGIN CREATEROLE CREATEDB REPLICATION BYPASSRLS PASSWORD '${password}'`,
      `GRANT ${providerGroup} TO lessor_admin_neon, lessor_admin_logged WITH INHERIT TRUE`,
      "ALTER ROLE lessor_admin_neon SET log_statement = 'ddl'",
      "ALTER ROLE lessor_admin_logged SET log_statement = 'ddl'",
    ]) {
      await client.query(statement);
    }
  } finally {
    await client.end();
  }
}

export const { setup, teardown } = localStackSetup("main");
