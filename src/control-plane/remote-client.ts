/**
 * The driver-shaped client `withControlPlane` hands drizzle: each `query` runs on a session of a
 * ControlPlaneObject shard, by RPC. It implements the part of the Neon driver's `Client` that
 * drizzle's neon-serverless session and Lessor's raw SQL use (`query(text | config, values)`, array
 * or object rows, per-query type parsers), so everything above it is unchanged. Values travel as
 * Postgres text and are parsed here, with the caller's parsers, as a direct connection would.
 */
import { types } from "@neondatabase/serverless";
import { type PostgresErrorBody, postgresErrorFields } from "../core/neon-protocol.ts";
import { LessorError } from "../errors/index.ts";
import type { RemoteSessionAnswer } from "../rpc/control-plane.ts";

type TypeParser = (value: string) => unknown;

interface QueryConfig {
  text: string;
  values?: unknown[];
  rowMode?: "array";
  types?: { getTypeParser(oid: number, format: "text"): TypeParser };
}

/** The shard methods a session uses (a Durable Object stub). */
interface ControlPlaneShard {
  query(
    sessionId: string,
    text: string,
    values: unknown[],
  ): Promise<RemoteSessionAnswer<import("../rpc/control-plane.ts").RemoteQueryResult>>;
}

/** A Postgres error rebuilt on this side, with its fields, as the driver would have thrown it. */
export class RemotePostgresError extends Error {
  override readonly name = "error";
  constructor(body: PostgresErrorBody) {
    super(body.message);
    for (const field of postgresErrorFields) {
      const value = body[field];
      if (value !== undefined) Object.defineProperty(this, field, { value, enumerable: true });
    }
  }
}

/** The error a failed session call stands for. */
export function answerError(
  answer:
    | { ok: false; postgres: PostgresErrorBody }
    | { ok: false; error: import("../errors/index.ts").WireError },
): Error {
  return "postgres" in answer ? new RemotePostgresError(answer.postgres) : LessorError.fromWire(answer.error);
}

export class RemoteClient {
  constructor(
    private readonly shard: ControlPlaneShard,
    private readonly sessionId: string,
  ) {}

  async query(textOrConfig: string | QueryConfig, values?: unknown[]) {
    const config: QueryConfig = typeof textOrConfig === "string" ? { text: textOrConfig } : textOrConfig;
    const answer = await this.shard.query(this.sessionId, config.text, config.values ?? values ?? []);
    if (!answer.ok) throw answerError(answer);
    const { command, rowCount, fields, rows } = answer.value;
    const parserOf = config.types ?? types;
    const parsers = fields.map((field) => parserOf.getTypeParser(field.dataTypeID, "text"));
    const parsed = rows.map((row) =>
      row.map((value, i) => (value === null ? null : (parsers[i] ?? String)(value))),
    );
    return {
      command,
      rowCount,
      fields,
      rows:
        config.rowMode === "array"
          ? parsed
          : parsed.map((row) => Object.fromEntries(fields.map((field, i) => [field.name, row[i]]))),
    };
  }
}
