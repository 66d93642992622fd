/**
 * Starts the real local stack once for the whole test run: a throwaway Postgres on a free port,
 * the WebSocket proxy and the control-plane schema. Tests inside workerd reach it through the
 * bindings that vitest.config.ts builds from what this provides.
 */
import type { TestProject } from "vitest/node";
import { freePort, type LocalStack, startLocalStack } from "../local/stack.ts";
import { type JwksServer, startJwksServer } from "./jwks-server.ts";

declare module "vitest" {
  export interface ProvidedContext {
    controlPlaneUrl: string;
    hostsJson: string;
    wsProxy: string;
    pgSuperuserUrl: string;
    proxyControlUrl: string;
    jwksServerUrl: string;
  }
}

/**
 * A setup/teardown pair with a stack of its own: each vitest project that calls this gets its own
 * Postgres (the Postgres-restart project stops and starts its cluster without touching the others).
 */
export function localStackSetup(name: string, options: { controlPlaneAddress?: string } = {}) {
  let stack: LocalStack | undefined;
  let jwks: JwksServer | undefined;
  return {
    setup: async (project: TestProject) => {
      stack = await startTestStack(project, name, options.controlPlaneAddress);
      jwks = await startJwksServer();
      project.provide("jwksServerUrl", jwks.url);
    },
    teardown: async () => {
      await jwks?.close();
      await stack?.stop();
    },
  };
}

/** The server's own log lines a test may read (`/__control/hook/pg-log`), newest last, bounded. */
const pgLogLimit = 20_000;

async function startTestStack(
  project: TestProject,
  name: string,
  controlPlaneAddress?: string,
): Promise<LocalStack> {
  const pgLog: string[] = [];
  const stack = await startLocalStack({
    dataDir: `.lessor/test-${name}-pg-${process.pid}`,
    pgPort: await freePort(),
    pgPassword: "lessor-test-password",
    persistent: false,
    proxyControl: true,
    // Hosts that cannot set it to 0 (Lessor's advice) need the clean-up path tested.
    maxPreparedTransactions: 10,
    log: (line) => {
      pgLog.push(line);
      if (pgLog.length > pgLogLimit) pgLog.splice(0, pgLog.length - pgLogLimit);
    },
    // `?grep=<text>`: the lines that contain it (e.g. the trap test's `lessor_trap`).
    proxyHooks: {
      "pg-log": async (url) => {
        const grep = url.searchParams.get("grep") ?? "";
        return { lines: pgLog.filter((line) => line.includes(grep)) };
      },
    },
  });
  // A control plane under an address of its own can be cut off alone (the outage project).
  project.provide(
    "controlPlaneUrl",
    controlPlaneAddress
      ? stack.controlPlaneUrl.replace("@127.0.0.1:", `@${controlPlaneAddress}:`)
      : stack.controlPlaneUrl,
  );
  // Lessor's host admin: what a managed provider gives (local/host-setup.ts), never the superuser.
  const admin = stack.adminUrl("postgres");
  project.provide(
    "hostsJson",
    JSON.stringify({
      local: admin,
      // Same cluster under other names: a host with a small budget, and one the tests can cut off.
      small: admin,
      // Another small host, for the maintenance tests (each file's budgets are its own, but Postgres is shared).
      tiny: admin,
      // Hosts for the rotation tests: one with a rotation reserve that fits an overlap, one without room.
      rot: admin,
      rotfull: admin,
      faulty: admin.replace("@127.0.0.1:", "@127.0.0.2:"),
      // A host the blackhole tests stall; where 127.0.0.3 is the control plane, there is none.
      ...(controlPlaneAddress ? {} : { silent: admin.replace("@127.0.0.1:", "@127.0.0.3:") }),
    }),
  );
  project.provide("wsProxy", stack.wsProxy);
  project.provide("pgSuperuserUrl", stack.pg.url("postgres"));
  project.provide("proxyControlUrl", `http://${stack.wsProxy}/__control`);
  return stack;
}

export const { setup, teardown } = localStackSetup("main");
