/**
 * Starts the real local stack once for the whole test run: a throwaway Postgres on a free port,
 * the WebSocket proxy and the control-plane schema. Tests inside workerd reach it through the
 * bindings that vitest.config.ts builds from what this provides.
 */
import type { TestProject } from "vitest/node";
import { freePort, type LocalStack, startLocalStack } from "../local/stack.ts";
import { type JwksServer, startJwksServer } from "./jwks-server.ts";
import { serverLogFile, serverLogFlags } from "./server-log.ts";

declare module "vitest" {
  export interface ProvidedContext {
    controlPlaneUrl: string;
    hostsJson: string;
    wsProxy: string;
    pgSuperuserUrl: string;
    proxyControlUrl: string;
    jwksServerUrl: string;
    pgServerLog: string;
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

async function startTestStack(
  project: TestProject,
  name: string,
  controlPlaneAddress?: string,
): Promise<LocalStack> {
  const dataDir = `.lessor/test-${name}-pg-${process.pid}`;
  // The server's own connection log, for tests that count backends exactly (test/server-log.ts).
  const serverLog = serverLogFile(dataDir);
  const stack = await startLocalStack({
    dataDir,
    pgPort: await freePort(),
    pgPassword: "lessor-test-superuser",
    persistent: false,
    proxyControl: true,
    pgFlags: serverLogFlags,
    log: serverLog.append,
  });
  project.provide("pgServerLog", serverLog.path);
  const stop = stack.stop;
  stack.stop = async () => {
    await stop();
    serverLog.remove();
  };
  // A control plane under an address of its own can be cut off alone (the outage project).
  project.provide(
    "controlPlaneUrl",
    controlPlaneAddress
      ? stack.controlPlaneUrl.replace("@127.0.0.1:", `@${controlPlaneAddress}:`)
      : stack.controlPlaneUrl,
  );
  const superuser = stack.pg.url("postgres");
  project.provide(
    "hostsJson",
    JSON.stringify({
      local: superuser,
      // Same cluster under other names: a host with a small budget, and one the tests can cut off.
      small: superuser,
      // Another small host, for the maintenance tests (each file's budgets are its own, but Postgres is shared).
      tiny: superuser,
      // Hosts for the rotation tests: one with a rotation reserve that fits an overlap, one without room.
      rot: superuser,
      rotfull: superuser,
      faulty: superuser.replace("@127.0.0.1:", "@127.0.0.2:"),
      // A host the blackhole tests stall; where 127.0.0.3 is the control plane, there is none.
      ...(controlPlaneAddress ? {} : { silent: superuser.replace("@127.0.0.1:", "@127.0.0.3:") }),
    }),
  );
  project.provide("wsProxy", stack.wsProxy);
  project.provide("pgSuperuserUrl", stack.pg.url("postgres"));
  project.provide("proxyControlUrl", `http://${stack.wsProxy}/__control`);
  return stack;
}

export const { setup, teardown } = localStackSetup("main");
