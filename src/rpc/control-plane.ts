/** What crosses RPC between a caller of `withControlPlane` and a ControlPlaneObject shard. */
import type { PostgresErrorBody } from "../core/neon-protocol.ts";
import type { WireError } from "../errors/index.ts";

/** One statement's result as Postgres sent it: text values, with each column's type. */
export interface RemoteQueryResult {
  command: string;
  rowCount: number | null;
  fields: { name: string; dataTypeID: number }[];
  rows: (string | null)[][];
}

/** A session call's answer: its value, a Postgres error (with its fields), or a refusal. */
export type RemoteSessionAnswer<T> =
  | { ok: true; value: T }
  | { ok: false; postgres: PostgresErrorBody }
  | { ok: false; error: WireError };
