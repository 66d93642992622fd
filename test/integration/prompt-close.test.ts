/**
 * The WebSocket Lessor gives the Neon driver (src/postgres/prompt-close.ts), against a peer that
 * hangs up: the local proxy to a Postgres that refuses what it was sent. workerd's own WebSocket
 * throws on a write after the peer closed; the driver's coalesced writes land there from a timer,
 * where the throw became an uncaught exception (seen during Postgres restarts). Lessor's socket
 * drops the write, as the WHATWG spec and browsers do.
 *
 * The same hang-up is a clean close (the proxy sends a close frame), which workerd follows with an
 * `error` ("Network connection lost."): a pool ending an idle connection took that for the
 * connection's failure and logged it. Lessor's socket reports the close and nothing more.
 */
import { env } from "cloudflare:test";
import { Pool } from "@neondatabase/serverless";
import { describe, expect, it } from "vitest";
import { SettlingClient } from "../../src/postgres/clients.ts";
import { PromptCloseWebSocket } from "../../src/postgres/prompt-close.ts";
import { pollUntil } from "./harness.ts";

/** A tunnel through the test proxy to the test Postgres. */
function tunnelUrl(): string {
  const hosts = JSON.parse(env.LESSOR_HOSTS) as Record<string, string>;
  const postgres = new URL((hosts.local ?? "").replace(/^postgres:/, "http:"));
  return `ws://${env.LESSOR_WS_PROXY}/v2?address=${postgres.hostname}:${postgres.port}`;
}

/** Opens `socket`, sends a startup packet of protocol 0.0 (refused by Postgres), waits for the hang-up. */
async function hungUpOn(socket: WebSocket): Promise<void> {
  await new Promise((resolve, reject) => {
    socket.addEventListener("open", resolve, { once: true });
    socket.addEventListener("error", reject, { once: true });
  });
  const closed = new Promise((resolve) => socket.addEventListener("close", resolve, { once: true }));
  socket.send(new Uint8Array([0, 0, 0, 8, 0, 0, 0, 0]));
  await closed;
}

describe("PromptCloseWebSocket", () => {
  it("drops a write after the peer closed, where workerd's WebSocket throws", async () => {
    const plain = new WebSocket(tunnelUrl());
    await hungUpOn(plain);
    // The failure this guards against (if workerd ever stops throwing, this line says so).
    expect(() => plain.send(new Uint8Array([1]))).toThrow("Can't call WebSocket send() after close()");

    const lessors = new PromptCloseWebSocket(tunnelUrl());
    await hungUpOn(lessors);
    expect(lessors.readyState).toBe(WebSocket.CLOSED);
    expect(() => lessors.send(new Uint8Array([1]))).not.toThrow();
  });

  it("reports a clean close as a close: the error workerd fires after it reaches no listener", async () => {
    const plain = new WebSocket(tunnelUrl());
    const plainErrors: string[] = [];
    plain.addEventListener("error", (event) => plainErrors.push(event.message));
    await hungUpOn(plain);
    // The runtime's behaviour this guards against (if workerd ever stops, this says so).
    expect(
      await pollUntil(
        async () => plainErrors.length,
        (n) => n > 0,
      ),
    ).toBe(1);
    expect(plainErrors[0]).toMatch(/Network connection lost/);

    const lessors = new PromptCloseWebSocket(tunnelUrl());
    const heard: string[] = [];
    const fired: string[] = [];
    lessors.addEventListener("error", (event) => heard.push(event.message));
    // Beside the wrapper: what the runtime itself fired on this socket.
    EventTarget.prototype.addEventListener.call(lessors, "error", (event: Event) =>
      fired.push((event as ErrorEvent).message),
    );
    const closes: boolean[] = [];
    lessors.addEventListener("close", (event) => closes.push(event.wasClean));
    await hungUpOn(lessors);
    // The error did fire (the fault landed), after a close that was clean...
    expect(
      await pollUntil(
        async () => fired.length,
        (n) => n > 0,
      ),
    ).toBe(1);
    expect(closes).toEqual([true]);
    // ...and no listener of Lessor's socket heard it.
    expect(heard).toEqual([]);
  });

  it("lets a pool end an idle connection on its idle timeout without an error (control_plane_connection_error)", async () => {
    let runtimeErrors = 0;
    /** Lessor's socket, counting what the runtime fires underneath it. */
    class Watched extends PromptCloseWebSocket {
      constructor(url: string, protocols?: string | string[]) {
        super(url, protocols);
        EventTarget.prototype.addEventListener.call(this, "error", () => runtimeErrors++);
      }
    }
    const proxy = env.LESSOR_WS_PROXY;
    class WatchedClient extends SettlingClient {
      constructor(config?: ConstructorParameters<typeof SettlingClient>[0]) {
        super(config);
        Object.assign((this as unknown as { neonConfig: object }).neonConfig, {
          webSocketConstructor: Watched,
          wsProxy: (host: string, port: number) => `${proxy}/v2?address=${host}:${port}`,
          useSecureWebSocket: false,
          pipelineConnect: false,
          forceDisablePgSSL: true,
        });
      }
    }
    const pool = new Pool({ connectionString: env.LESSOR_CONTROL_PLANE_URL, max: 1, idleTimeoutMillis: 200 });
    pool.Client = WatchedClient;
    const poolErrors: unknown[] = [];
    pool.on("error", (error: Error) => poolErrors.push(error));
    const removed = new Promise((resolve) => pool.once("remove", resolve));
    const client = await pool.connect();
    await client.query("SELECT 1");
    client.release();
    await removed;
    // The pool ended it, and the runtime fired its error for the hang-up...
    expect(
      await pollUntil(
        async () => runtimeErrors,
        (n) => n > 0,
      ),
    ).toBe(1);
    // ...which never reached the pool.
    expect(poolErrors).toEqual([]);
    await pool.end();
  });
});
