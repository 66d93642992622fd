/**
 * The part of a Postgres client that plain SQL work needs: node-postgres and the Neon driver both
 * fit, so the same code runs in the Worker and in Node (benchmarks, tests).
 */
export interface Queryable {
  query(text: string, params?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
}
