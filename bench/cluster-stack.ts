/**
 * The peer and fleet benchmarks' local stack, in its own process: a control-plane Postgres, one
 * Postgres cluster per database host, the WebSocket-to-TCP proxy (allowed to reach exactly those
 * clusters) and the control-plane migrations. bench/peers.ts and bench/fleet.ts fork this file.
 *
 * Why the control plane has a cluster of its own: in production it is a separate database, and a
 * host's `max_connections` is the budget's whole point; Lessor's control-plane connections (which
 * live outside tenant budgets) must not compete with the tenants for it in a benchmark either.
 *
 * Why its own process: the WebSocket proxy carries every query a Worker sends, so it must not
 * share an event loop with the load generator (see bench/stack.ts, which does the same for one host).
 *
 * IPC: the parent passes a JSON `StackSpec` as the first argument; this process answers
 * `{type: "ready", …}` or `{type: "failed", message}`. It restarts a host with another
 * `max_connections` on `{type: "restart", host, maxConnections, downMs?}` (answering `restarted`),
 * freezes the proxy's tunnels to a host on `{type: "stall", host}` and ends that on
 * `{type: "unstall", host}` (fault injection, as local/wsproxy.ts's stall mode; answering
 * `stalled` / `unstalled`), and stops everything on `"stop"`, on SIGTERM, and when the parent
 * disconnects.
 */
import { type ChildProcess, fork } from "node:child_process";
import { resolve } from "node:path";
import { controlPlaneDatabase, hostAdminUrl, migrateControlPlane, prepareHost } from "../local/stack.ts";
import { startWsProxy, type WsProxyStats } from "../local/wsproxy.ts";
import { type Cluster, startCluster } from "./clusters.ts";
import { within } from "./processes.ts";

export interface ClusterSpec {
  name: string;
  dataDir: string;
  port: number;
  maxConnections: number;
}

export interface StackSpec {
  password: string;
  persistent: boolean;
  controlPlane: ClusterSpec;
  hosts: ClusterSpec[];
}

export interface StackHost {
  name: string;
  port: number;
  /** The host admin's URL (`lessor_admin`, never a superuser: Lessor's LESSOR_HOSTS value). */
  adminUrl: string;
  /** The superuser's URL of the host's `postgres` database: the bench's own inspection only. */
  superuserUrl: string;
  postmasterPid: number | null;
  dataDir: string;
}

export interface StackReady {
  type: "ready";
  controlPlaneUrl: string;
  controlPlanePid: number | null;
  hosts: StackHost[];
  wsProxy: string;
  /** This process: the WebSocket proxy's CPU is its CPU. */
  wsProxyPid: number;
}

type Message =
  | { type: "restart"; host: string; maxConnections: number; downMs?: number }
  | { type: "stall" | "unstall"; host: string }
  | { type: "fatal-counts" }
  | { type: "proxy-stats" }
  | "stop";

/**
 * The WebSocket proxy's bounds for the benches: the defaults of local/wsproxy.ts are sized for one
 * Postgres with `max_connections` 400, and a bench fleet holds thousands of tunnels (300 live pools
 * on each of three hosts, 500 idle tenants of two systems) and opens hundreds at once in a storm.
 * A tunnel the proxy refused would measure the proxy, not Lessor.
 */
const benchProxyLimits = { maxTunnels: 8_000, maxHandshakes: 2_048 };

async function serve(spec: StackSpec, send: (message: unknown) => void): Promise<void> {
  const recent: string[] = [];
  /** FATAL lines of the clusters, by message: refused connections show up here and nowhere else. */
  const fatalCounts: Record<string, number> = {};
  const log = (chunk: string) => {
    for (const line of chunk.split("\n")) {
      const fatal = /(FATAL|PANIC):\s+(.*)$/.exec(line);
      if (fatal?.[2]) {
        const kind = fatal[2]
          .replace(/"[^"]*"/g, '"…"')
          .replace(/\d+/g, "N")
          .slice(0, 100);
        fatalCounts[kind] = (fatalCounts[kind] ?? 0) + 1;
      }
      if (/FATAL|PANIC/.test(line) && !/too many clients|remaining connection slots/.test(line)) {
        recent.push(line);
        recent.splice(0, Math.max(0, recent.length - 20));
      }
    }
  };
  const clusters: Cluster[] = [];
  const stopAll = async () => {
    await Promise.all(clusters.map((c) => c.stop().catch(() => undefined)));
  };
  try {
    // One at a time: initdb and start are CPU-bound, and two cores gain nothing from overlapping them.
    for (const cluster of [spec.controlPlane, ...spec.hosts]) {
      clusters.push(
        await startCluster({ ...cluster, password: spec.password, persistent: spec.persistent, log }),
      );
    }
  } catch (error) {
    await stopAll();
    throw new Error(
      `${error instanceof Error ? error.message : "Postgres exited during start"}\n${recent.join("\n")}`,
    );
  }
  const [control, ...hosts] = clusters as [Cluster, ...Cluster[]];
  // Each cluster gives Lessor what a managed provider gives (local/host-setup.ts), never a superuser.
  await prepareHost(control, spec.password, { controlPlane: true });
  for (const host of hosts) await prepareHost(host, spec.password, { controlPlane: false });
  await migrateControlPlane(hostAdminUrl(control, spec.password, controlPlaneDatabase));
  const proxy = await startWsProxy({
    allowed: clusters.map((c) => `${c.host}:${c.port}`),
    limits: benchProxyLimits,
  });
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await proxy.close().catch(() => undefined);
    await stopAll();
    process.exit(0);
  };
  process.on("message", (message: Message) => {
    if (message === "stop") {
      void stop();
      return;
    }
    if (message.type === "fatal-counts") {
      send({ type: "fatal-counts", counts: { ...fatalCounts } });
      return;
    }
    if (message.type === "proxy-stats") {
      send({ type: "proxy-stats", stats: proxy.stats() });
      return;
    }
    if (message.type === "stall" || message.type === "unstall") {
      const host = hosts.find((h) => h.name === message.host);
      if (host) proxy[message.type](`${host.host}:${host.port}`);
      send({ type: `${message.type}ed`, ok: host !== undefined });
      return;
    }
    if (message.type === "restart") {
      const host = hosts.find((h) => h.name === message.host);
      if (!host) {
        send({ type: "restart-failed", message: `no host ${message.host}` });
        return;
      }
      host.restart(message.maxConnections, message.downMs).then(
        () => send({ type: "restarted", host: host.name, postmasterPid: host.postmasterPid() }),
        (error: unknown) =>
          send({ type: "restart-failed", message: error instanceof Error ? error.message : String(error) }),
      );
    }
  });
  process.on("disconnect", () => void stop());
  process.on("SIGTERM", () => void stop());
  process.on("SIGINT", () => void stop());
  const ready: StackReady = {
    type: "ready",
    controlPlaneUrl: hostAdminUrl(control, spec.password, controlPlaneDatabase),
    controlPlanePid: control.postmasterPid(),
    hosts: hosts.map((h) => ({
      name: h.name,
      port: h.port,
      adminUrl: hostAdminUrl(h, spec.password),
      superuserUrl: h.url("postgres"),
      postmasterPid: h.postmasterPid(),
      dataDir: h.dataDir,
    })),
    wsProxy: `127.0.0.1:${proxy.port}`,
    wsProxyPid: process.pid,
  };
  send(ready);
}

// ── Parent side ──────────────────────────────────────────────────────────────────────────────────

export interface RunningClusterStack {
  info: StackReady;
  /** FATAL log lines of every cluster so far, by message (cumulative). */
  fatalCounts(): Promise<Record<string, number>>;
  /**
   * The WebSocket proxy's counters: every connection Lessor opens to any Postgres of the stack
   * (control plane or host) is a tunnel, counted per target `host:port` (`tunnels`).
   */
  proxyStats(): Promise<WsProxyStats>;
  /**
   * Restarts one host with another max_connections, `downMs` after it stopped; resolves with its
   * new postmaster pid.
   */
  restartHost(host: string, maxConnections: number, downMs?: number): Promise<number | null>;
  /**
   * Fault injection: the proxy freezes every tunnel to `host` (accepted, nothing forwarded either
   * way) until `unstallHost`, which cuts the frozen tunnels.
   */
  stallHost(host: string): Promise<void>;
  unstallHost(host: string): Promise<void>;
  stop(): Promise<void>;
  pid: number;
}

/** Forks this file and waits (bounded) for the stack. */
export async function startClusterStack(spec: StackSpec): Promise<RunningClusterStack> {
  const child = fork(resolve(import.meta.dirname, "cluster-stack.ts"), [JSON.stringify(spec)], {
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const ready = new Promise<StackReady>((done, reject) => {
    child.once("message", (message) => {
      const typed = message as StackReady | { type: "failed"; message: string };
      if (typed.type === "ready") done(typed);
      else reject(new Error(`the bench stack failed to start: ${typed.message}`));
    });
    child.once("exit", (code) => reject(new Error(`the bench stack exited early (code ${code})`)));
  });
  let info: StackReady;
  try {
    info = await within(ready, 300_000, "bench stack start");
  } catch (error) {
    child.kill("SIGTERM");
    throw error;
  }
  return {
    info,
    pid: child.pid ?? -1,
    fatalCounts: async () => {
      const answer = new Promise<Record<string, number>>((done) => {
        const listen = (message: unknown) => {
          const typed = message as { type: string; counts?: Record<string, number> };
          if (typed.type !== "fatal-counts") return;
          child.off("message", listen);
          done(typed.counts ?? {});
        };
        child.on("message", listen);
      });
      child.send({ type: "fatal-counts" });
      return within(answer, 10_000, "FATAL counts");
    },
    proxyStats: async () => {
      const answer = new Promise<WsProxyStats>((done) => {
        const listen = (message: unknown) => {
          const typed = message as { type: string; stats?: WsProxyStats };
          if (typed.type !== "proxy-stats" || !typed.stats) return;
          child.off("message", listen);
          done(typed.stats);
        };
        child.on("message", listen);
      });
      child.send({ type: "proxy-stats" });
      return within(answer, 10_000, "proxy stats");
    },
    stallHost: (host) => toggleStall(child, "stall", host),
    unstallHost: (host) => toggleStall(child, "unstall", host),
    restartHost: async (host, maxConnections, downMs) => {
      const answer = new Promise<number | null>((done, reject) => {
        const listen = (message: unknown) => {
          const typed = message as { type: string; message?: string; postmasterPid?: number | null };
          if (typed.type === "restarted") {
            child.off("message", listen);
            done(typed.postmasterPid ?? null);
          } else if (typed.type === "restart-failed") {
            child.off("message", listen);
            reject(new Error(`restarting ${host}: ${typed.message}`));
          }
        };
        child.on("message", listen);
      });
      child.send({ type: "restart", host, maxConnections, downMs });
      return within(answer, 120_000 + (downMs ?? 0), `restarting ${host}`);
    },
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = new Promise<void>((done) => child.once("exit", () => done()));
      if (child.connected) child.send("stop");
      else child.kill("SIGTERM");
      await within(exited, 60_000, "bench stack stop").catch(() => child.kill("SIGKILL"));
    },
  };
}

async function toggleStall(child: ChildProcess, type: "stall" | "unstall", host: string): Promise<void> {
  const answer = new Promise<boolean>((done) => {
    const listen = (message: unknown) => {
      const typed = message as { type: string; ok?: boolean };
      if (typed.type !== `${type}ed`) return;
      child.off("message", listen);
      done(typed.ok === true);
    };
    child.on("message", listen);
  });
  child.send({ type, host });
  if (!(await within(answer, 10_000, `${type} ${host}`))) throw new Error(`${type}: no host ${host}`);
}

// Run as the forked child: the spec is the first argument and the parent listens on IPC.
if (process.send && process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  const send = process.send.bind(process);
  const raw = process.argv[2];
  if (!raw) {
    send({ type: "failed", message: "no stack spec" }, () => process.exit(2));
  } else {
    serve(JSON.parse(raw) as StackSpec, (message) => send(message)).catch((error: unknown) => {
      send({ type: "failed", message: error instanceof Error ? error.message : String(error) }, () =>
        process.exit(1),
      );
    });
  }
}
