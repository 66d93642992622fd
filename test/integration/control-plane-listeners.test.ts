/**
 * A control-plane shard's connections keep one error listener of Lessor's each, however many
 * sessions they serve (issue 39). The listener was added per session and never removed: past ten,
 * the Neon driver's EventEmitter printed a MaxListenersExceededWarning whose `emitter` was the
 * client, and the runtime's console printed that client whole, the control plane's connection
 * string and password included (docs/invariants.md, invariant 19).
 */
import { env, runInDurableObject } from "cloudflare:test";
import { describe, expect, it } from "vitest";
import type { ControlPlaneObject } from "../../src/control-plane-object/index.ts";

interface EmitterLike {
  listenerCount(event: string): number;
}

describe("control-plane connections", () => {
  it("carry a bounded number of error listeners after many sessions on one connection", async () => {
    // A shard of its own, so that this test's sessions are the only ones on its pool.
    const shard = env.CONTROL_PLANE.getByName(`listeners-${crypto.randomUUID()}`);
    const sessions = 30;
    for (let i = 0; i < sessions; i++) {
      const opened = await shard.open("lessor-control-plane", "default");
      if (!opened.ok) throw new Error(`session ${i} did not open: ${JSON.stringify(opened)}`);
      const answer = await shard.query(opened.value, "SELECT 1", []);
      expect(answer.ok).toBe(true);
      await shard.close(opened.value);
    }
    const counts = await runInDurableObject(shard, (instance: ControlPlaneObject) => {
      const pool = (instance as unknown as { pool: { _clients: EmitterLike[] } | null }).pool;
      return (pool?._clients ?? []).map((client) => client.listenerCount("error"));
    });
    // One session at a time: the pool reused a connection (the condition that leaked).
    expect(counts.length).toBeGreaterThan(0);
    expect(counts.length).toBeLessThan(sessions);
    // The pool's own idle listener and Lessor's: never one per session.
    for (const count of counts) expect(count).toBeLessThanOrEqual(2);
  });
});
