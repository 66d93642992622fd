/**
 * The WebSocket Lessor gives the Neon driver (src/postgres/prompt-close.ts), against a peer that
 * hangs up: the local proxy to a Postgres that refuses what it was sent. workerd's own WebSocket
 * throws on a write after the peer closed; the driver's coalesced writes land there from a timer,
 * where the throw became an uncaught exception (seen during Postgres restarts). Lessor's socket
 * drops the write, as the WHATWG spec and browsers do.
 */
import { env } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import { PromptCloseWebSocket } from "../../src/postgres/prompt-close.ts";

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
});
