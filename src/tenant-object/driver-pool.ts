/**
 * Resizing a driver pool in place (adaptive admission, docs/adr/022-adaptive-admission.md).
 *
 * The Neon driver's `Pool` is pg-pool: it reads `options.max` each time it decides whether it may
 * open a connection (`_isFull`), so a new maximum holds from the next checkout on. A raised maximum
 * does not by itself serve the checkouts already queued (pg-pool opens a connection for a queued
 * one only when it pulses its queue, on a release or a removal), so the queue is pulsed once per
 * connection added. Both are the driver's internals: `test/integration/adaptive.test.ts` proves
 * against Postgres that a grown pool opens more backends and a shrunk one fewer, so a driver
 * upgrade that changed them fails there, not in production.
 */
import type { Pool } from "@neondatabase/serverless";

interface PoolInternals {
  options: { max: number };
  _pulseQueue?: () => void;
}

/** The most connections the driver pool may hold. */
export function driverPoolMax(pool: Pool): number {
  return (pool as unknown as PoolInternals).options.max;
}

/**
 * Sets the most connections the driver pool may hold; when raised, lets as many queued checkouts
 * open a connection now. Lowering it closes nothing: the caller closes idle connections itself.
 */
export function setDriverPoolMax(pool: Pool, max: number): void {
  const internals = pool as unknown as PoolInternals;
  const before = internals.options.max;
  internals.options.max = max;
  for (let added = before; added < max && pool.waitingCount > 0; added++) internals._pulseQueue?.();
}
