import { describe, expect, it } from "vitest";
import type { SqlRequest } from "../../src/core/neon-protocol.ts";
import { mayLeaveSessionState } from "../../src/tenant-object/execute.ts";

const single = (query: string): SqlRequest => ({ kind: "single", statement: { query, params: [] } });

describe("mayLeaveSessionState", () => {
  it.each([
    "SET search_path = x",
    "  set local work_mem = '8MB'",
    "RESET ALL",
    "PREPARE p AS SELECT 1",
    "LISTEN chan",
    "DECLARE c CURSOR WITH HOLD FOR SELECT 1",
    "CREATE TEMP TABLE t (x int)",
    "CREATE TEMPORARY TABLE t (x int)",
    "SELECT * INTO TEMP t FROM notes",
    "SELECT pg_advisory_lock(1)",
    "SELECT pg_try_advisory_lock_shared(1)",
    "SELECT set_config('search_path', 'x', false)",
    "SELECT 1; SET ROLE other",
    "DO $$ BEGIN EXECUTE 'SET work_mem = 1'; END $$",
    "SET SESSION AUTHORIZATION DEFAULT",
  ])("matches %s", (query) => {
    expect(mayLeaveSessionState(single(query))).toBe(true);
  });

  it.each([
    "SELECT 1",
    "UPDATE notes SET body = 'x' WHERE id = 1",
    "INSERT INTO notes (body) VALUES ('settings')",
    "SELECT reset_count FROM stats",
    "WITH x AS (SELECT 1) SELECT * FROM x",
  ])("does not match %s", (query) => {
    expect(mayLeaveSessionState(single(query))).toBe(false);
  });

  it("checks every statement of a transaction batch", () => {
    const batch: SqlRequest = {
      kind: "transaction",
      statements: [
        { query: "SELECT 1", params: [] },
        { query: "LISTEN x", params: [] },
      ],
      options: { isolationLevel: null, readOnly: null, deferrable: null },
    };
    expect(mayLeaveSessionState(batch)).toBe(true);
  });
});
