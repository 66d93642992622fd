import { describe, expect, it } from "vitest";
import { isTransientFailure } from "../../src/core/transient.ts";
import { LessorError } from "../../src/errors/index.ts";

/** A Postgres error as the driver raises it. */
function pgError(code: string, severity = "ERROR"): Error {
  return Object.assign(new Error(`error ${code}`), { code, severity });
}

describe("isTransientFailure", () => {
  it("is true when the connection, the server or the network went away", () => {
    for (const error of [
      pgError("57P01", "FATAL"), // terminating connection due to administrator command
      pgError("57P03", "FATAL"), // the database system is starting up
      pgError("53300", "FATAL"),
      pgError("08006"),
      pgError("40001"),
      pgError("40P01"),
      new Error("Connection terminated unexpectedly"),
      new Error("Connection terminated due to connection timeout"),
      new Error("Network connection lost."),
      Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED" }),
      { type: "error", message: "WebSocket error" },
      new LessorError("connection_lost"),
      new LessorError("maintenance_busy"),
      new LessorError("control_plane_unavailable"),
      new Error("migration 2 failed", { cause: new Error("Connection terminated unexpectedly") }),
    ]) {
      expect(isTransientFailure(error), String((error as Error).message ?? error)).toBe(true);
    }
  });

  it("is false for the work's own failure and for a bound it reached", () => {
    for (const error of [
      pgError("42P01"), // relation does not exist: the migration's SQL
      pgError("23505"),
      pgError("57014"), // a cancel: Lessor's own bound
      pgError("42501"),
      new Error("migration timed out after 60000 ms"),
      new LessorError("schema_upgrade_failed"),
      new LessorError("host_unfit"),
      "a string",
      null,
      undefined,
    ]) {
      expect(isTransientFailure(error), String(error)).toBe(false);
    }
  });
});
