/**
 * Answers encoded row by row (src/core/result-shape.ts) are the very text the whole-result shaping
 * gave, and their size is counted in the UTF-8 bytes that travel.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import type { FieldDescription } from "../../src/core/neon-protocol.ts";
import {
  encodeResult,
  type OutputMode,
  rowEncoder,
  shapeResult,
  utf8Length,
} from "../../src/core/result-shape.ts";

const types = [25, 23, 21, 16, 700, 701, 20, 1700, 3802, 114, 1009, 1007, 1184] as const;

function field(name: string, dataTypeID: number): FieldDescription {
  return {
    name,
    tableID: 0,
    columnID: 0,
    dataTypeID,
    dataTypeSize: -1,
    dataTypeModifier: -1,
    format: "text",
  };
}

/** A text value Postgres could send for a column of `oid`. */
function valueFor(oid: number): fc.Arbitrary<string | null> {
  const text = fc.string({ unit: "binary" });
  const byType: Record<number, fc.Arbitrary<string>> = {
    23: fc.integer().map(String),
    21: fc.integer({ min: -32768, max: 32767 }).map(String),
    16: fc.constantFrom("t", "f"),
    700: fc.oneof(fc.double({ noNaN: true }).map(String), fc.constantFrom("NaN", "Infinity")),
    701: fc.double().map(String),
    3802: fc.jsonValue().map((v) => JSON.stringify(v)),
    114: fc.jsonValue().map((v) => JSON.stringify(v)),
    1007: fc.array(fc.integer(), { maxLength: 4 }).map((a) => `{${a.join(",")}}`),
    1009: fc
      .array(fc.string({ unit: "grapheme" }), { maxLength: 4 })
      .map((a) => `{${a.map((s) => `"${s.replaceAll("\\", "\\\\").replaceAll('"', '\\"')}"`).join(",")}}`),
  };
  return fc.option(byType[oid] ?? text, { nil: null });
}

const modes: OutputMode[] = [
  { rawText: true, arrayMode: true },
  { rawText: true, arrayMode: false },
  { rawText: false, arrayMode: true },
  { rawText: false, arrayMode: false },
];

describe("rowEncoder and encodeResult", () => {
  it("give byte for byte what JSON.stringify(shapeResult(…)) gives, in every mode", () => {
    fc.assert(
      fc.property(
        fc.array(fc.tuple(fc.string({ unit: "grapheme", maxLength: 8 }), fc.constantFrom(...types)), {
          minLength: 1,
          maxLength: 5,
        }),
        fc.nat({ max: 6 }),
        fc.constantFrom(...modes),
        fc.nat(),
        (columns, rowCount, mode, seed) => {
          const fields = columns.map(([name, oid]) => field(name, oid));
          const rows = fc.sample(fc.tuple(...fields.map((f) => valueFor(f.dataTypeID))), {
            numRuns: rowCount,
            seed,
          });
          const raw = { command: "SELECT", rowCount: rows.length, fields, rows };
          const encode = rowEncoder(fields, mode);
          const encoded = encodeResult({
            command: "SELECT",
            rowCount: rows.length,
            fields,
            rows: rows.map((row) => encode(row)),
            rowAsArray: mode.arrayMode,
          });
          expect(encoded).toBe(JSON.stringify(shapeResult(raw, mode)));
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe("utf8Length", () => {
  it("is the length TextEncoder gives, for any string (lone surrogates included)", () => {
    const encoder = new TextEncoder();
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (text) => {
        expect(utf8Length(text)).toBe(encoder.encode(text).byteLength);
      }),
      { numRuns: 1000 },
    );
    expect(utf8Length("é")).toBe(2);
    expect(utf8Length("漢")).toBe(3);
    expect(utf8Length("😀")).toBe(4);
    expect(utf8Length("\ud800")).toBe(3);
  });
});
