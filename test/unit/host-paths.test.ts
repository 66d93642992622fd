/** Per-host connection paths (src/config/host-paths.ts, docs/adr/027-direct-tcp-path.md). */
import { describe, expect, it } from "vitest";
import { hostPathOf, hostPathProblem, impliedPath, isLoopbackHost } from "../../src/config/host-paths.ts";
import { classifyStartFailure } from "../../src/core/lifecycle.ts";

describe("host paths", () => {
  it("a host's path follows its kind unless its configuration names one", () => {
    expect(hostPathOf("postgres", {})).toEqual({ path: "tcp", sslmode: "verify-full" });
    expect(hostPathOf("neon", {})).toEqual({ path: "websocket", sslmode: "verify-full" });
    expect(hostPathOf("postgres", { sslmode: "disable" })).toEqual({ path: "tcp", sslmode: "disable" });
  });

  it("refuses what would weaken TLS or exist only on this machine", () => {
    const problem = (kind: "postgres" | "neon", host: string, declared: object, proxy: string | null) =>
      hostPathProblem("h", kind, host, declared, proxy);
    expect(problem("postgres", "db.example.com", {}, null)).toBeNull();
    expect(problem("postgres", "db.example.com", { sslmode: "disable" }, null)).toMatch(/loopback/);
    expect(problem("postgres", "127.0.0.1", { sslmode: "disable" }, null)).toBeNull();
    expect(problem("postgres", "db.example.com", { path: "websocket" }, null)).toMatch(/LESSOR_WS_PROXY/);
    expect(problem("postgres", "127.0.0.1", { path: "websocket" }, "127.0.0.1:9000")).toBeNull();
    expect(problem("neon", "ep-x.neon.tech", { path: "tcp" }, null)).toMatch(/"websocket"/);
    expect(problem("neon", "ep-x.neon.tech", { sslmode: "disable" }, null)).toMatch(/loopback/);
  });

  it("an address no host declares takes the path its name implies (the proxy locally)", () => {
    expect(impliedPath("ep-x.eu-central-1.aws.neon.tech", null).path).toBe("websocket");
    expect(impliedPath("cp.example.com", null).path).toBe("tcp");
    expect(impliedPath("127.0.0.1", "127.0.0.1:9000").path).toBe("websocket");
    expect(isLoopbackHost("localhost") && isLoopbackHost("127.0.0.3") && !isLoopbackHost("10.0.0.1")).toBe(
      true,
    );
  });

  it("a refused transport is classified apart from an unreachable host", () => {
    expect(classifyStartFailure({ code: "host_tls_refused" })).toBe("tls_refused");
    expect(classifyStartFailure({ code: "host_auth_refused" })).toBe("auth_method_refused");
  });
});
