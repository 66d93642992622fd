/**
 * The customer's side of the tunnel tests (test/integration/tunnels.test.ts, issue 28): a second
 * embedded Postgres that plays a customer's own server, reachable only through a second WebSocket
 * proxy that plays their tunnel. Lessor's own proxy does not list it, so nothing reaches it but
 * through the tunnel. The tunnel proxy has a capacity of its own (its tunnel bound) and the same
 * fault controls as Lessor's (`stall`, `block`: a frozen tunnel, a cut one), served on its own
 * control URL.
 *
 * The customer's server listens on three loopback addresses; each stands for one tunnel's traffic,
 * so a test stalls or cuts one tunnel (its address) and no other.
 */
import { startLocalPostgres } from "../local/postgres.ts";
import { freePort } from "../local/stack.ts";
import { startWsProxy } from "../local/wsproxy.ts";
import { testCustomerPgPassword } from "./secrets.ts";
import { serverLogFile, serverLogFlags } from "./server-log.ts";

/** What the tests read from the customer's side (vitest.config.ts turns them into bindings). */
export interface CustomerServer {
  /** `LESSOR_TUNNELS` for the tests. */
  tunnelsJson: string;
  /** The customer's superuser (the test's stand-in for the customer's DBA), reached through the tunnel. */
  superuserUrl: string;
  /** The tunnel proxy's address (`host:port`), for the test's own connections to the customer's server. */
  tunnelProxy: string;
  tunnelProxyControlUrl: string;
  /** The customer server's log file (connections and disconnections), read through `pg_read_file`. */
  serverLog: string;
  stop(): Promise<void>;
}

/** Connections the tunnel proxy carries at once: its own capacity, above every tunnel Lessor declares. */
export const tunnelProxyCapacity = 40;

export async function startCustomerServer(name: string): Promise<CustomerServer> {
  const dataDir = `.lessor/test-${name}-customer-pg-${process.pid}`;
  const serverLog = serverLogFile(dataDir);
  const port = await freePort();
  const pg = await startLocalPostgres({
    dataDir,
    port,
    password: testCustomerPgPassword,
    persistent: false,
    extraFlags: serverLogFlags,
    log: serverLog.append,
  });
  try {
    const proxy = await startWsProxy({
      allowed: ["127.0.0.1", "127.0.0.2", "127.0.0.3"].map((host) => `${host}:${port}`),
      control: true,
      limits: { maxTunnels: tunnelProxyCapacity },
    });
    const address = `127.0.0.1:${proxy.port}`;
    return {
      // One tunnel per fault domain: `cust` (attach, rotate, revoke, erase, sampled), `cust-full`
      // (small), `cust-stall` (127.0.0.2) and `cust-cut` (127.0.0.3), with a short connect bound.
      tunnelsJson: JSON.stringify({
        cust: { proxy: address, capacity: 8 },
        "cust-full": { proxy: address, capacity: 3 },
        "cust-stall": { proxy: address, capacity: 6, connectTimeoutMs: 1_500 },
        "cust-cut": { proxy: address, capacity: 6, connectTimeoutMs: 1_500 },
      }),
      superuserUrl: pg.url("postgres"),
      tunnelProxy: address,
      tunnelProxyControlUrl: `http://${address}/__control`,
      serverLog: serverLog.path,
      stop: async () => {
        await proxy.close();
        await pg.stop();
        serverLog.remove();
      },
    };
  } catch (error) {
    await pg.stop();
    throw error;
  }
}
