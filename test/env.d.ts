// Test-only bindings, merged into the generated Env (set in vitest.config.ts).
interface LessorTestBindings {
  /** Superuser connection string of the test Postgres, for assertions that look behind Lessor. */
  TEST_PG_SUPERUSER_URL: string;
  /** Fault injection on the test WebSocket proxy: /stats, /block?address=, /unblock?address=. */
  TEST_PROXY_CONTROL_URL: string;
  /** The TCP fault proxy in front of host `tcpfault` (local/fault-proxy.ts): /cut, /stall, /unstall, /stats. */
  TEST_TCP_FAULT_CONTROL_URL: string;
  /** The refusing servers of the TCP path's tests (test/fake-postgres.ts): ports by mode (JSON), and their counts. */
  TEST_FAKE_PG_PORTS: string;
  TEST_FAKE_PG_CONTROL_URL: string;
  /** Loopback JWKS host (test/jwks-server.ts): PUT/GET /jwks/<name>, GET /hits/<name>. */
  TEST_JWKS_SERVER_URL: string;
  /** The test cluster's log file on the host (test/server-log.ts), read through `pg_read_file`. */
  TEST_PG_SERVER_LOG: string;
  /**
   * The customer's server behind a tunnel (test/customer-server.ts), in the half that starts one:
   * its superuser, the tunnel proxy's address and fault controls, and the server's log file.
   */
  TEST_CUSTOMER_PG_SUPERUSER_URL?: string;
  TEST_TUNNEL_PROXY?: string;
  TEST_TUNNEL_PROXY_CONTROL_URL?: string;
  TEST_CUSTOMER_PG_SERVER_LOG?: string;
  /** Customers' tunnels (src/config `LESSOR_TUNNELS`). */
  LESSOR_TUNNELS?: string;
}
interface Env extends LessorTestBindings {}
declare namespace Cloudflare {
  interface Env extends LessorTestBindings {}
}
