/**
 * How a statement's result is answered on `/sql`, as Neon's HTTP endpoint answers it:
 *
 * - `Neon-Raw-Text-Output: true` (what the official driver sends): every value is its Postgres
 *   text, and the driver parses types itself;
 * - otherwise (curl, other HTTP clients): booleans, int2/int4 and finite floats become JSON
 *   booleans and numbers, json/jsonb is embedded, arrays are parsed (elements by the same rules),
 *   and everything else (int8, numeric, timestamps, bytea, …) stays a string;
 * - `Neon-Array-Mode: true`: each row is an array in column order; otherwise an object keyed by
 *   column name.
 *
 * Rows are encoded to JSON one at a time as they arrive (`rowEncoder`), so an answer is held once,
 * as the text that travels, and measured in the bytes that travel (`utf8Length`); `encodeResult`
 * puts the pieces together exactly as `JSON.stringify(shapeResult(…))` would.
 *
 * Pure: no runtime. One deliberate difference: an empty array is `[]` (Neon's typed mode fails on it).
 */
import type { FieldDescription } from "./neon-protocol.ts";

export interface OutputMode {
  rawText: boolean;
  arrayMode: boolean;
}

/** The mode the driver asks for; also the default when a header says nothing else. */
export const driverOutputMode: OutputMode = { rawText: true, arrayMode: true };

/** Reads the two headers; only the exact value `true` turns a flag on, as on Neon. */
export function outputModeOf(headers: { get(name: string): string | null }): OutputMode {
  return {
    rawText: headers.get("Neon-Raw-Text-Output") === "true",
    arrayMode: headers.get("Neon-Array-Mode") === "true",
  };
}

export interface RawStatementResult {
  command: string;
  rowCount: number | null;
  fields: FieldDescription[];
  rows: (string | null)[][];
}

export interface ShapedResult {
  fields: FieldDescription[];
  rows: unknown[];
  command: string;
  rowCount: number | null;
  rowAsArray: boolean;
}

const boolOid = 16;
const intOids = new Set([21, 23]);
const floatOids = new Set([700, 701]);
const jsonOids = new Set([114, 3802]);
/** Array type OID → element type OID, for the element types that convert (other arrays keep strings). */
const arrayElements = new Map<number, number>([
  [1000, boolOid],
  [1005, 21],
  [1007, 23],
  [1021, 700],
  [1022, 701],
  [199, 114],
  [3807, 3802],
  // Arrays whose elements stay strings are still parsed into JSON arrays.
  [1009, 25],
  [1015, 1043],
  [1016, 20],
  [1231, 1700],
  [2951, 2950],
  [1182, 1082],
  [1115, 1114],
  [1185, 1184],
  [1001, 17],
  [1014, 1042],
  [1028, 26],
]);

/** One non-null text value of type `oid` as JSON (typed mode). */
function typedValue(oid: number, text: string): unknown {
  if (oid === boolOid) return text === "t";
  if (intOids.has(oid)) return Number(text);
  if (floatOids.has(oid)) {
    const value = Number(text);
    return Number.isFinite(value) ? value : text;
  }
  if (jsonOids.has(oid)) return JSON.parse(text) as unknown;
  const element = arrayElements.get(oid);
  if (element !== undefined) return parseArrayLiteral(text).map((item) => typedArrayItem(element, item));
  return text;
}

type ArrayItem = string | null | ArrayItem[];

function typedArrayItem(oid: number, item: ArrayItem): unknown {
  if (item === null) return null;
  if (Array.isArray(item)) return item.map((inner) => typedArrayItem(oid, inner));
  return typedValue(oid, item);
}

/**
 * Parses a Postgres array literal (`{1,2,NULL}`, `{{"a b",c},{d,NULL}}`, with an optional
 * `[1:2]=` bounds decoration) into nested arrays of element texts; unquoted NULL is null.
 */
export function parseArrayLiteral(literal: string): ArrayItem[] {
  let text = literal;
  if (text.startsWith("[")) text = text.slice(text.indexOf("=") + 1);
  let at = 0;
  const parseList = (): ArrayItem[] => {
    if (text[at] !== "{") throw new Error("malformed array literal");
    at++;
    const items: ArrayItem[] = [];
    if (text[at] === "}") {
      at++;
      return items;
    }
    for (;;) {
      if (text[at] === "{") {
        items.push(parseList());
      } else if (text[at] === '"') {
        at++;
        let value = "";
        while (at < text.length && text[at] !== '"') {
          if (text[at] === "\\") at++;
          value += text[at] ?? "";
          at++;
        }
        at++;
        items.push(value);
      } else {
        let end = at;
        while (end < text.length && text[end] !== "," && text[end] !== "}") end++;
        const raw = text.slice(at, end);
        at = end;
        items.push(raw === "NULL" ? null : raw);
      }
      if (text[at] === ",") {
        at++;
        continue;
      }
      if (text[at] === "}") {
        at++;
        return items;
      }
      throw new Error("malformed array literal");
    }
  };
  return parseList();
}

/** Shapes one statement's result for the caller's mode. */
export function shapeResult(result: RawStatementResult, mode: OutputMode): ShapedResult {
  const { fields } = result;
  const convert = (value: string | null, index: number): unknown => {
    if (value === null || mode.rawText) return value;
    return typedValue(fields[index]?.dataTypeID ?? 0, value);
  };
  const rows = result.rows.map((row) => {
    if (mode.arrayMode) return mode.rawText ? row : row.map(convert);
    const object: Record<string, unknown> = {};
    row.forEach((value, index) => {
      object[fields[index]?.name ?? String(index)] = convert(value, index);
    });
    return object;
  });
  return { fields, rows, command: result.command, rowCount: result.rowCount, rowAsArray: mode.arrayMode };
}

/** One row as the JSON text it is answered with, in the caller's mode. */
export type RowEncoder = (row: (string | null)[]) => string;

/** The encoder of rows of `fields` in `mode`: the same text `shapeResult` then `JSON.stringify` give. */
export function rowEncoder(fields: readonly FieldDescription[], mode: OutputMode): RowEncoder {
  // The driver's mode (raw text, arrays): the row as it came.
  if (mode.arrayMode && mode.rawText) return (row) => JSON.stringify(row);
  const names = fields.map((field, index) => field.name ?? String(index));
  const oids = fields.map((field) => field.dataTypeID);
  const convert = (value: string | null, index: number): unknown =>
    value === null || mode.rawText ? value : typedValue(oids[index] ?? 0, value);
  if (mode.arrayMode) return (row) => JSON.stringify(row.map(convert));
  return (row) => {
    const object: Record<string, unknown> = {};
    row.forEach((value, index) => {
      object[names[index] ?? String(index)] = convert(value, index);
    });
    return JSON.stringify(object);
  };
}

/** A statement's result with its rows already encoded (`rowEncoder`). */
export interface EncodedResult {
  command: string;
  rowCount: number | null;
  fields: FieldDescription[];
  /** `JSON.stringify(fields)`, when the runner already made it (to count its bytes): made once. */
  fieldsJson?: string;
  /** Each row's JSON text, in order. */
  rows: string[];
  rowAsArray: boolean;
}

/** The JSON of one statement's answer: byte for byte `JSON.stringify(shapeResult(…))`. */
export function encodeResult(result: EncodedResult): string {
  return `{"fields":${result.fieldsJson ?? JSON.stringify(result.fields)},"rows":[${result.rows.join(",")}],"command":${JSON.stringify(result.command)},"rowCount":${JSON.stringify(result.rowCount)},"rowAsArray":${result.rowAsArray}}`;
}

/**
 * The UTF-8 length of a string (what it takes on the wire and in an RPC), without encoding it: one
 * byte below U+0080, two below U+0800, four for a surrogate pair, three otherwise (a lone surrogate
 * becomes U+FFFD, three bytes).
 */
export function utf8Length(text: string): number {
  let bytes = 0;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code < 0x80) bytes += 1;
    else if (code < 0x800) bytes += 2;
    else if (code >= 0xd800 && code <= 0xdbff && i + 1 < text.length) {
      const next = text.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) {
        bytes += 4;
        i++;
      } else bytes += 3;
    } else bytes += 3;
  }
  return bytes;
}
