/**
 * `FlightSplitter` (src/core/flight-splitter.ts): where a statement's answer ends and the pipelined
 * reset's begins, in bytes as they arrive, whatever the chunking; and what it keeps of the reset's
 * answer. Backend messages are built byte for byte as Postgres sends them.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { type Cut, FlightSplitter } from "../../src/core/flight-splitter.ts";
import {
  concatBytes,
  errorResponse,
  noticeResponse,
  parameterStatus,
  readyForQuery,
} from "../../src/core/pg-wire.ts";
import { backend, commandComplete, cstring, dataRow, resetOpeningInTransaction } from "./wire-bytes.ts";

const rowDescription = backend("T", concatBytes([new Uint8Array([0, 1]), cstring("n"), new Uint8Array(18)]));

/** The statement's answer: the driver's, byte for byte. Its rows are many and large enough to span chunks. */
const statementAnswer = concatBytes([
  backend("1"),
  backend("2"),
  rowDescription,
  ...Array.from({ length: 20 }, (_, i) => dataRow([`row ${i} ${"x".repeat(i * 13)}`])),
  // Async messages inside the statement's answer are the driver's too.
  noticeResponse({ severity: "NOTICE", code: "00000", message: "a notice of the statement" }),
  commandComplete("SELECT 20"),
  readyForQuery("T"),
]);

/**
 * The reset's answer as Postgres sends it for Lessor's reset (src/tenant-object/pool/connection-state.ts)
 * after a statement that left a transaction open: its `BEGIN` warns.
 */
function resetAnswer(options: { error?: boolean; status?: "I" | "T" | "E" } = {}) {
  return concatBytes([
    ...resetOpeningInTransaction,
    commandComplete("CLOSE CURSOR ALL"),
    commandComplete("SET"),
    parameterStatus("application_name", "lessor:t:1"),
    commandComplete("RESET"),
    ...(options.error ? [errorResponse({ severity: "ERROR", code: "XX000", message: "reset broke" })] : []),
    commandComplete("DEALLOCATE ALL"),
    commandComplete("UNLISTEN"),
    rowDescription,
    dataRow(["t"]),
    commandComplete("SELECT 1"),
    parameterStatus("TimeZone", "UTC"),
    commandComplete("DISCARD TEMP"),
    commandComplete("DISCARD SEQUENCES"),
    readyForQuery(options.status ?? "I"),
  ]);
}

/** After the reset: an async message the driver must still get. */
const trailing = parameterStatus("is_superuser", "off");

/** Splits `bytes` at `cuts` (sorted offsets), feeds the splitter, and collects who got what. */
function feed(bytes: Uint8Array, cuts: number[]) {
  const splitter = new FlightSplitter();
  const toDriver: Uint8Array[] = [];
  const afterReset: Uint8Array[] = [];
  let ended = false;
  const bounds = [0, ...cuts, bytes.byteLength];
  for (let i = 0; i + 1 < bounds.length; i++) {
    const chunk = bytes.subarray(bounds[i], bounds[i + 1]);
    if (ended) {
      afterReset.push(chunk);
      continue;
    }
    const cut: Cut = splitter.push(chunk);
    if (cut.statementEnd > 0) toDriver.push(chunk.subarray(0, cut.statementEnd));
    if (cut.resetEnd !== null) {
      ended = true;
      afterReset.push(chunk.subarray(cut.resetEnd));
    }
  }
  return { splitter, toDriver: concatBytes(toDriver), afterReset: concatBytes(afterReset), ended };
}

const chunking = (length: number) =>
  fc
    .uniqueArray(fc.integer({ min: 1, max: length - 1 }), { maxLength: 40 })
    .map((cuts) => [...cuts].sort((a, b) => a - b));

describe("FlightSplitter", () => {
  it("gives the driver exactly the statement's answer and what follows the reset's, under any chunking", () => {
    const whole = concatBytes([statementAnswer, resetAnswer(), trailing]);
    fc.assert(
      fc.property(chunking(whole.byteLength), (cuts) => {
        const { splitter, toDriver, afterReset, ended } = feed(whole, cuts);
        expect(ended).toBe(true);
        expect(toDriver).toEqual(statementAnswer);
        expect(afterReset).toEqual(trailing);
        expect(splitter.report()).toEqual({
          failure: null,
          status: "I",
          parameters: [
            ["application_name", "lessor:t:1"],
            ["TimeZone", "UTC"],
          ],
        });
      }),
      { numRuns: 300 },
    );
  });

  it("reports the reset's error, and keeps reading to its ReadyForQuery", () => {
    const whole = concatBytes([statementAnswer, resetAnswer({ error: true })]);
    fc.assert(
      fc.property(chunking(whole.byteLength), (cuts) => {
        const { splitter, toDriver, ended } = feed(whole, cuts);
        expect(ended).toBe(true);
        expect(toDriver).toEqual(statementAnswer);
        expect(splitter.report().failure).toBe("the reset failed: XX000 reset broke");
      }),
      { numRuns: 100 },
    );
  });

  it("fails a reset that leaves a transaction open", () => {
    const { splitter } = feed(concatBytes([statementAnswer, resetAnswer({ status: "T" })]), []);
    expect(splitter.report()).toMatchObject({ status: "T" });
    expect(splitter.report().failure).toMatch(/transaction status T/);
  });

  it("fails a reset whose answer has not ended (the connection closed)", () => {
    const reset = resetAnswer();
    const { splitter, ended } = feed(concatBytes([statementAnswer, reset.subarray(0, 30)]), [7]);
    expect(ended).toBe(false);
    expect(splitter.done).toBe(false);
    expect(splitter.report().failure).toBe("the reset did not finish");
  });

  it("hands everything to the driver once the statement's answer cannot be framed, and fails the reset", () => {
    const bad = concatBytes([backend("1"), new Uint8Array([0x32, 0, 0, 0, 2]), resetAnswer()]);
    const { splitter, toDriver } = feed(bad, [3]);
    expect(toDriver).toEqual(bad);
    expect(splitter.done).toBe(true);
    expect(splitter.report().failure).toMatch(/length below 4/);
  });

  it("refuses a kept reset message past its bound", () => {
    const huge = backend("E", new Uint8Array(70 * 1024));
    const { splitter, toDriver, ended } = feed(concatBytes([statementAnswer, huge, readyForQuery("I")]), []);
    expect(ended).toBe(true);
    expect(toDriver).toEqual(statementAnswer);
    expect(splitter.report().failure).toMatch(/past its bound/);
  });

  it("skips a large message that is nobody's (a reset's row) without keeping it", () => {
    const bigRow = dataRow(["y".repeat(200 * 1024)]);
    const whole = concatBytes([statementAnswer, bigRow, readyForQuery("I")]);
    const { splitter, toDriver, ended } = feed(whole, [
      statementAnswer.byteLength + 10,
      whole.byteLength - 3,
    ]);
    expect(ended).toBe(true);
    expect(toDriver).toEqual(statementAnswer);
    expect(splitter.report().failure).toBeNull();
  });
});
