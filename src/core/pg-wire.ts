/**
 * The Postgres frontend/backend protocol (version 3.0) as Lessor's wire endpoint speaks it: pure
 * functions over bytes, with no runtime (docs/adr/017-wire-protocol.md).
 *
 * - `MessageReader` (src/core/wire-reassembly.ts, re-exported here) reassembles messages from
 *   WebSocket frames, linear in the bytes, with a bound on a message's declared length;
 * - the startup packet, and the few frontend messages Lessor reads (password, Parse, Bind, Describe,
 *   Close) are decoded; the backend messages Lessor writes itself are encoded;
 * - `ServerFlight` follows a leased server connection from the messages that cross it: how many
 *   answers (ReadyForQuery) are still owed, the transaction status the last one reported, whether
 *   COPY is running, how many answer bytes this cycle carried; from it comes the one decision the
 *   runtime needs: may the connection go back to the pool now;
 * - `NamedStatements` keeps a client's named prepared statements across server connections (as
 *   PgBouncer 1.21 does): it re-prepares one on a connection that lacks it and hides the
 *   ParseComplete that answers the re-preparation;
 * - `refuseCycles` answers messages that could get no connection as Postgres answers a failed
 *   statement: one ErrorResponse per cycle, then ReadyForQuery.
 *
 * The runtime (src/tenant-object/wire.ts, src/routes/wire.ts) only moves bytes and leases.
 */

import type { Message } from "./wire-reassembly.ts";

/** Protocol 3.0 in a startup packet (major 3, minor 0). */
export const protocolVersion3 = 3 << 16;
export const sslRequestCode = 80877103;
export const gssEncRequestCode = 80877104;
export const cancelRequestCode = 80877102;

/** Postgres's own bound on a startup packet (MAX_STARTUP_PACKET_LENGTH). */
export const maxStartupPacketBytes = 10_000;

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8");

/** Message type bytes, as characters. */
export const frontend = {
  bind: 0x42, // B
  close: 0x43, // C
  describe: 0x44, // D
  execute: 0x45, // E
  functionCall: 0x46, // F
  flush: 0x48, // H
  parse: 0x50, // P
  query: 0x51, // Q
  sync: 0x53, // S
  terminate: 0x58, // X
  copyDone: 0x63, // c
  copyData: 0x64, // d
  copyFail: 0x66, // f
  password: 0x70, // p
} as const;

export const backend = {
  parseComplete: 0x31, // 1
  commandComplete: 0x43, // C
  dataRow: 0x44, // D
  errorResponse: 0x45, // E
  copyInResponse: 0x47, // G
  copyOutResponse: 0x48, // H
  noticeResponse: 0x4e, // N
  copyBothResponse: 0x57, // W
  readyForQuery: 0x5a, // Z
  notification: 0x41, // A
  copyDone: 0x63, // c
  copyData: 0x64, // d
} as const;

/** The frontend messages a client may send once it is authenticated (Postgres's own set). */
const afterStartup: ReadonlySet<number> = new Set([
  frontend.bind,
  frontend.close,
  frontend.describe,
  frontend.execute,
  frontend.functionCall,
  frontend.flush,
  frontend.parse,
  frontend.query,
  frontend.sync,
  frontend.terminate,
  frontend.copyDone,
  frontend.copyData,
  frontend.copyFail,
]);

/** Whether `type` is a message a client may send after authentication. */
export function isFrontendMessage(type: number): boolean {
  return afterStartup.has(type);
}

export {
  type FrameProblem,
  isFrameProblem,
  type Message,
  MessageReader,
  maxFramesPerMessage,
} from "./wire-reassembly.ts";

// ── Reading ─────────────────────────────────────────────────────────────────────────────────────

/** The big-endian int32 at `at` (a message's length sits right after its type byte). */
export function readInt32(bytes: Uint8Array, at: number): number {
  return (
    ((bytes[at] ?? 0) << 24) |
    ((bytes[at + 1] ?? 0) << 16) |
    ((bytes[at + 2] ?? 0) << 8) |
    (bytes[at + 3] ?? 0) |
    0
  );
}

/** A cursor over a message body; every read is bounds-checked and a bad one makes it fail. */
class BodyReader {
  private at = 0;
  private readonly body: Uint8Array;
  ok = true;

  constructor(body: Uint8Array) {
    this.body = body;
  }

  int32(): number {
    if (this.at + 4 > this.body.byteLength) {
      this.ok = false;
      return 0;
    }
    const value = readInt32(this.body, this.at);
    this.at += 4;
    return value;
  }

  byte(): number {
    if (this.at >= this.body.byteLength) {
      this.ok = false;
      return 0;
    }
    return this.body[this.at++] ?? 0;
  }

  cstring(): string {
    const nul = this.body.indexOf(0, this.at);
    if (nul < 0) {
      this.ok = false;
      return "";
    }
    const text = decoder.decode(this.body.subarray(this.at, nul));
    this.at = nul + 1;
    return text;
  }

  get done(): boolean {
    return this.at === this.body.byteLength;
  }
}

/** What a client's first packet asks for. */
export type StartupPacket =
  | { kind: "ssl" }
  | { kind: "gssenc" }
  | { kind: "cancel"; pid: number; secret: number }
  | { kind: "startup"; minor: number; params: Map<string, string> }
  | { kind: "unsupported"; version: number }
  | { kind: "malformed" };

/** Decodes an untyped startup packet (its body: the code and what follows). */
export function decodeStartupPacket(body: Uint8Array): StartupPacket {
  const reader = new BodyReader(body);
  const code = reader.int32();
  if (!reader.ok) return { kind: "malformed" };
  if (code === sslRequestCode) return reader.done ? { kind: "ssl" } : { kind: "malformed" };
  if (code === gssEncRequestCode) return reader.done ? { kind: "gssenc" } : { kind: "malformed" };
  if (code === cancelRequestCode) {
    const pid = reader.int32();
    const secret = reader.int32();
    return reader.ok && reader.done ? { kind: "cancel", pid, secret } : { kind: "malformed" };
  }
  if (code >>> 16 !== 3) return { kind: "unsupported", version: code };
  const params = new Map<string, string>();
  for (;;) {
    const name = reader.cstring();
    if (!reader.ok) return { kind: "malformed" };
    if (name === "") break;
    const value = reader.cstring();
    if (!reader.ok || params.has(name)) return { kind: "malformed" };
    params.set(name, value);
  }
  if (!reader.done) return { kind: "malformed" };
  return { kind: "startup", minor: code & 0xffff, params };
}

/** The password of a PasswordMessage, or null if the body is not one NUL-terminated string. */
export function decodePassword(body: Uint8Array): string | null {
  const reader = new BodyReader(body);
  const password = reader.cstring();
  return reader.ok && reader.done ? password : null;
}

/** A Parse's statement name (empty: the unnamed statement). */
export function parseStatementName(body: Uint8Array): string | null {
  const reader = new BodyReader(body);
  const name = reader.cstring();
  return reader.ok ? name : null;
}

/** The statement a Bind binds (its portal's name comes first). */
export function bindStatementName(body: Uint8Array): string | null {
  const reader = new BodyReader(body);
  reader.cstring();
  const statement = reader.cstring();
  return reader.ok ? statement : null;
}

/** What a Describe or Close names: a statement (`S`) or a portal (`P`). */
export function describedTarget(body: Uint8Array): { kind: "S" | "P"; name: string } | null {
  const reader = new BodyReader(body);
  const kind = reader.byte();
  const name = reader.cstring();
  if (!reader.ok || !reader.done) return null;
  if (kind === 0x53) return { kind: "S", name };
  if (kind === 0x50) return { kind: "P", name };
  return null;
}

/** The status byte of a ReadyForQuery: `I` idle, `T` in a transaction, `E` in a failed one. */
export type TransactionStatus = "I" | "T" | "E";

export function readyForQueryStatus(body: Uint8Array): TransactionStatus | null {
  if (body.byteLength !== 1) return null;
  const status = String.fromCharCode(body[0] ?? 0);
  return status === "I" || status === "T" || status === "E" ? status : null;
}

/** A CommandComplete's tag (`SELECT 1`, `PREPARE TRANSACTION`, …). */
export function commandTag(body: Uint8Array): string {
  const reader = new BodyReader(body);
  return reader.cstring();
}

/** A ParameterStatus's name and value, or null if its body is not two strings. */
export function parameterStatusOf(body: Uint8Array): [name: string, value: string] | null {
  const reader = new BodyReader(body);
  const name = reader.cstring();
  const value = reader.cstring();
  return reader.ok && reader.done ? [name, value] : null;
}

/** An ErrorResponse's or NoticeResponse's fields by their one-letter codes. */
export function errorFields(body: Uint8Array): Map<string, string> {
  const fields = new Map<string, string>();
  const reader = new BodyReader(body);
  for (;;) {
    const code = reader.byte();
    if (!reader.ok || code === 0) break;
    const value = reader.cstring();
    if (!reader.ok) break;
    fields.set(String.fromCharCode(code), value);
  }
  return fields;
}

// ── Writing ─────────────────────────────────────────────────────────────────────────────────────

function message(type: number, body: Uint8Array): Uint8Array {
  const bytes = new Uint8Array(5 + body.byteLength);
  bytes[0] = type;
  writeInt32(bytes, 1, 4 + body.byteLength);
  bytes.set(body, 5);
  return bytes;
}

function writeInt32(bytes: Uint8Array, at: number, value: number): void {
  bytes[at] = (value >>> 24) & 0xff;
  bytes[at + 1] = (value >>> 16) & 0xff;
  bytes[at + 2] = (value >>> 8) & 0xff;
  bytes[at + 3] = value & 0xff;
}

function int32(value: number): Uint8Array {
  const bytes = new Uint8Array(4);
  writeInt32(bytes, 0, value);
  return bytes;
}

function cstring(text: string): Uint8Array {
  // A NUL inside would end the string early on the other side: it is dropped.
  const encoded = encoder.encode(text.replaceAll("\0", ""));
  const bytes = new Uint8Array(encoded.byteLength + 1);
  bytes.set(encoded);
  return bytes;
}

/** Concatenates byte arrays. */
export function concatBytes(parts: readonly Uint8Array[]): Uint8Array {
  if (parts.length === 1 && parts[0]) return parts[0];
  let total = 0;
  for (const part of parts) total += part.byteLength;
  const out = new Uint8Array(total);
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}

/** The one-byte answer to an SSLRequest or GSSENCRequest: not inside the WebSocket (it is TLS already). */
export const encryptionRefused = new Uint8Array([0x4e]);

export function authenticationCleartextPassword(): Uint8Array {
  return message(0x52, int32(3));
}

export function authenticationOk(): Uint8Array {
  return message(0x52, int32(0));
}

export function parameterStatus(name: string, value: string): Uint8Array {
  return message(0x53, concatBytes([cstring(name), cstring(value)]));
}

export function backendKeyData(pid: number, secret: number): Uint8Array {
  return message(0x4b, concatBytes([int32(pid), int32(secret)]));
}

export function readyForQuery(status: TransactionStatus): Uint8Array {
  return message(backend.readyForQuery, new Uint8Array([status.charCodeAt(0)]));
}

/** The answer to a client asking for a newer minor version or `_pq_` options: 3.0, and those it does not know. */
export function negotiateProtocolVersion(unrecognized: readonly string[]): Uint8Array {
  return message(
    0x76,
    concatBytes([int32(protocolVersion3), int32(unrecognized.length), ...unrecognized.map(cstring)]),
  );
}

/** The fields of an ErrorResponse or NoticeResponse Lessor writes. */
export interface PostgresErrorFields {
  severity: "ERROR" | "FATAL" | "WARNING" | "NOTICE";
  /** A SQLSTATE. */
  code: string;
  message: string;
  detail?: string;
  hint?: string;
}

function fieldsBody(fields: PostgresErrorFields): Uint8Array {
  const parts: Uint8Array[] = [];
  const add = (code: string, value: string | undefined) => {
    if (value === undefined) return;
    parts.push(new Uint8Array([code.charCodeAt(0)]), cstring(value));
  };
  add("S", fields.severity);
  add("V", fields.severity);
  add("C", fields.code);
  add("M", fields.message);
  add("D", fields.detail);
  add("H", fields.hint);
  parts.push(new Uint8Array([0]));
  return concatBytes(parts);
}

export function errorResponse(fields: PostgresErrorFields): Uint8Array {
  return message(backend.errorResponse, fieldsBody(fields));
}

export function noticeResponse(fields: PostgresErrorFields): Uint8Array {
  return message(backend.noticeResponse, fieldsBody(fields));
}

/** A CancelRequest packet (for tests and for the edge's own use). */
export function cancelRequest(pid: number, secret: number): Uint8Array {
  return concatBytes([int32(16), int32(cancelRequestCode), int32(pid), int32(secret)]);
}

/** A StartupMessage packet. */
export function startupMessage(params: Readonly<Record<string, string>>): Uint8Array {
  const body = concatBytes([
    int32(protocolVersion3),
    ...Object.entries(params).flatMap(([name, value]) => [cstring(name), cstring(value)]),
    new Uint8Array([0]),
  ]);
  return concatBytes([int32(4 + body.byteLength), body]);
}

/** A frontend message of `type` with `body` (for tests). */
export function frontendMessage(type: number, body: Uint8Array): Uint8Array {
  return message(type, body);
}

/** A frontend message whose body is a string (Query, PasswordMessage). */
export function textMessage(type: number, text: string): Uint8Array {
  return message(type, cstring(text));
}

// ── Startup parameters ──────────────────────────────────────────────────────────────────────────

/** How a wire connection uses the tenant's pool. */
export type PoolMode = "transaction" | "session";

/** The startup option that picks the mode: `options=-c lessor.pool_mode=session`. */
export const poolModeSetting = "lessor.pool_mode";

/** What a startup packet asks for, once checked; or why it is refused. */
export type StartupRequest =
  | {
      ok: true;
      user: string;
      database: string;
      mode: PoolMode;
      applicationName: string;
      /** `_pq_.` protocol options, answered as unrecognised. */
      protocolOptions: string[];
    }
  | { ok: false; code: string; message: string };

/** Startup parameters Lessor accepts; any other would be a setting it does not apply, so it is refused. */
const acceptedParameters = new Set(["user", "database", "application_name", "client_encoding", "options"]);

/**
 * Splits a libpq `options` value into its arguments: spaces separate, a backslash escapes the next
 * character (as Postgres's own `pg_split_opts` does).
 */
export function splitOptions(options: string): string[] {
  const args: string[] = [];
  let current = "";
  let pending = false;
  for (let i = 0; i < options.length; i++) {
    const char = options[i] ?? "";
    if (char === "\\" && i + 1 < options.length) {
      current += options[++i] ?? "";
      pending = true;
    } else if (/\s/.test(char)) {
      if (pending) args.push(current);
      current = "";
      pending = false;
    } else {
      current += char;
      pending = true;
    }
  }
  if (pending) args.push(current);
  return args;
}

/**
 * Checks a startup packet's parameters. The user names the tenant and the database must name the
 * same one (or be absent); `options` may choose the pool mode (`-c lessor.pool_mode=session` or
 * `--lessor.pool_mode=session`) and may carry Neon's `endpoint=…` (ignored); any other setting is
 * refused rather than silently not applied.
 */
export function checkStartup(params: ReadonlyMap<string, string>, defaultMode: PoolMode): StartupRequest {
  const user = params.get("user") ?? "";
  if (user === "") {
    return { ok: false, code: "28000", message: "no user name specified in the startup packet" };
  }
  const protocolOptions: string[] = [];
  for (const [name, value] of params) {
    if (name.startsWith("_pq_.")) {
      protocolOptions.push(name);
      continue;
    }
    if (!acceptedParameters.has(name)) {
      return {
        ok: false,
        code: "0A000",
        message: `Lessor does not apply the startup parameter "${name}"; SET it in your transaction instead.`,
      };
    }
    if (name === "client_encoding" && !/^(utf-?8|unicode)$/i.test(value.replaceAll("'", ""))) {
      return { ok: false, code: "22023", message: "Lessor speaks UTF8 only (client_encoding)." };
    }
  }
  let mode = defaultMode;
  const args = splitOptions(params.get("options") ?? "");
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] ?? "";
    let setting: string | null = null;
    if (arg === "-c") setting = args[++i] ?? "";
    else if (arg.startsWith("-c")) setting = arg.slice(2);
    else if (arg.startsWith("--")) setting = arg.slice(2);
    else if (/^endpoint=/i.test(arg)) continue;
    if (setting === null) {
      return { ok: false, code: "0A000", message: `Lessor does not accept the startup option "${arg}".` };
    }
    const eq = setting.indexOf("=");
    const name = (eq < 0 ? setting : setting.slice(0, eq)).replaceAll("-", "_").toLowerCase();
    const value = eq < 0 ? "" : setting.slice(eq + 1);
    if (name === poolModeSetting && (value === "session" || value === "transaction")) {
      mode = value;
      continue;
    }
    if (name === poolModeSetting) {
      return {
        ok: false,
        code: "22023",
        message: `${poolModeSetting} is "transaction" or "session", not "${value}".`,
      };
    }
    return {
      ok: false,
      code: "0A000",
      message: `Lessor does not apply the startup setting "${name}"; SET it in your transaction instead.`,
    };
  }
  return {
    ok: true,
    user,
    database: params.get("database") || user,
    mode,
    applicationName: params.get("application_name") ?? "",
    protocolOptions,
  };
}

// ── A leased server connection ─────────────────────────────────────────────────────────────────

/**
 * One server connection's traffic, seen from both sides. A cycle is what one Sync, Query or
 * FunctionCall asks for: the server answers each with exactly one ReadyForQuery. Messages of the
 * extended protocol sent since the last Sync keep the connection in its implicit transaction.
 */
export class ServerFlight {
  /** ReadyForQuery messages the server still owes. */
  pendingCycles = 0;
  /** Extended-protocol messages were sent after the last Sync. */
  unsynced = false;
  /** What the last ReadyForQuery said. */
  status: TransactionStatus = "I";
  /** The server asked for COPY data (CopyInResponse) and the client has not finished it. */
  copyIn = false;
  /** COPY data the client sent in the running COPY FROM STDIN. */
  copyInBytes = 0;
  /** DataRow and CopyData bytes since the last ReadyForQuery. */
  answerBytes = 0;

  /** Counts a message the client sent to the server. */
  fromClient(type: number, byteLength: number): void {
    switch (type) {
      case frontend.sync:
        this.pendingCycles++;
        this.unsynced = false;
        return;
      case frontend.query:
      case frontend.functionCall:
        this.pendingCycles++;
        return;
      case frontend.copyData:
        if (this.copyIn) this.copyInBytes += byteLength;
        return;
      case frontend.copyDone:
      case frontend.copyFail:
        this.copyIn = false;
        return;
      case frontend.parse:
      case frontend.bind:
      case frontend.describe:
      case frontend.execute:
      case frontend.close:
      case frontend.flush:
        this.unsynced = true;
        return;
    }
  }

  /** Counts a message the server sent; answers the ReadyForQuery status if it was one. */
  fromServer(message: Message): void {
    switch (message.type) {
      case backend.readyForQuery:
        this.pendingCycles = Math.max(0, this.pendingCycles - 1);
        this.status = readyForQueryStatus(message.body) ?? this.status;
        this.answerBytes = 0;
        this.copyIn = false;
        return;
      case backend.dataRow:
      case backend.copyData:
        this.answerBytes += message.bytes.byteLength;
        return;
      case backend.copyInResponse:
        this.copyIn = true;
        this.copyInBytes = 0;
        return;
    }
  }

  /** The server owes nothing and holds no half-sent extended-protocol batch. */
  get idle(): boolean {
    return this.pendingCycles === 0 && !this.unsynced && !this.copyIn;
  }

  /** Idle outside any transaction: the connection may go back to the pool (transaction mode). */
  get releasable(): boolean {
    return this.idle && this.status === "I";
  }
}

/** Named prepared statements one client may keep (and their Parse messages' bytes, together). */
export const namedStatementLimits = { count: 256, bytes: 4 * 1024 * 1024 } as const;

/**
 * A client's named prepared statements in transaction mode, where each transaction may run on
 * another server connection. A named statement becomes the client's once the server confirms its
 * Parse (ParseComplete); a Bind, Describe or Parse of one the current server connection has not
 * seen sends the remembered Parse first, and the ParseComplete that answers it is not passed on.
 * So the client sees what one Postgres session would show it: a Bind of a statement it prepared
 * works, a second Parse of the same name fails (42P05), a Close forgets. Statements prepared with
 * SQL (`PREPARE …`) are not tracked: they end with the transaction's connection.
 */
export class NamedStatements {
  private readonly known = new Map<string, Uint8Array>();
  private knownBytes = 0;
  private onServer = new Set<string>();
  /**
   * Parses sent and not yet answered, oldest first: whether Lessor sent it, the cycle it belongs to,
   * and for the client's own named ones the name and bytes to remember once it is confirmed.
   */
  private parses: { injected: boolean; cycle: number; name: string; bytes: Uint8Array | null }[] = [];
  private cyclesSent = 0;
  private cyclesAnswered = 0;

  /** Statements the client holds (for tests and status). */
  get size(): number {
    return this.known.size;
  }

  /** A fresh server connection: it holds none of the client's statements (the reset deallocated them). */
  attached(): void {
    this.onServer = new Set();
    this.parses = [];
    this.cyclesSent = 0;
    this.cyclesAnswered = 0;
  }

  /**
   * What to send the server for a client message: the message, after a re-preparation if it needs
   * one; or a refusal (too many statements, a message that does not decode).
   */
  fromClient(message: Message): Uint8Array[] | { refuse: "too_many_statements" | "malformed" } {
    switch (message.type) {
      case frontend.parse: {
        const name = parseStatementName(message.body);
        if (name === null) return { refuse: "malformed" };
        if (name === "") {
          this.parses.push({ injected: false, cycle: this.cyclesSent, name, bytes: null });
          return [message.bytes];
        }
        if (this.known.has(name)) {
          // Postgres refuses a second Parse of a name its session holds (42P05): so must this one.
          const out = this.withStatement(name, message.bytes);
          this.parses.push({ injected: false, cycle: this.cyclesSent, name, bytes: null });
          return out;
        }
        const pending = this.parses.filter((parse) => parse.bytes !== null);
        const bytes = this.knownBytes + pending.reduce((n, p) => n + (p.bytes?.byteLength ?? 0), 0);
        if (
          this.known.size + pending.length >= namedStatementLimits.count ||
          bytes + message.bytes.byteLength > namedStatementLimits.bytes
        ) {
          return { refuse: "too_many_statements" };
        }
        this.onServer.add(name);
        this.parses.push({ injected: false, cycle: this.cyclesSent, name, bytes: message.bytes.slice() });
        return [message.bytes];
      }
      case frontend.bind: {
        const name = bindStatementName(message.body);
        if (name === null) return { refuse: "malformed" };
        return this.withStatement(name, message.bytes);
      }
      case frontend.describe: {
        const target = describedTarget(message.body);
        if (target === null) return { refuse: "malformed" };
        return target.kind === "S" ? this.withStatement(target.name, message.bytes) : [message.bytes];
      }
      case frontend.close: {
        const target = describedTarget(message.body);
        if (target === null) return { refuse: "malformed" };
        if (target.kind === "S" && target.name !== "") {
          const previous = this.known.get(target.name);
          if (previous) this.knownBytes -= previous.byteLength;
          this.known.delete(target.name);
          this.onServer.delete(target.name);
        }
        return [message.bytes];
      }
      case frontend.sync:
      case frontend.query:
      case frontend.functionCall:
        this.cyclesSent++;
        return [message.bytes];
      default:
        return [message.bytes];
    }
  }

  private withStatement(name: string, bytes: Uint8Array): Uint8Array[] {
    const parse = name === "" ? undefined : this.known.get(name);
    if (!parse || this.onServer.has(name)) return [bytes];
    this.onServer.add(name);
    this.parses.push({ injected: true, cycle: this.cyclesSent, name, bytes: null });
    return [parse, bytes];
  }

  /** Whether a server message is passed on (`false`: it answers a re-preparation Lessor sent). */
  fromServer(message: Message): boolean {
    switch (message.type) {
      case backend.parseComplete: {
        const parse = this.parses.shift();
        if (parse?.bytes) {
          this.known.set(parse.name, parse.bytes);
          this.knownBytes += parse.bytes.byteLength;
        }
        return !(parse?.injected ?? false);
      }
      case backend.errorResponse: {
        // The server skips the rest of the cycle: its Parses will never be answered, and the
        // statements they named were never made.
        const cycle = this.cyclesAnswered;
        for (const parse of this.parses) {
          if (parse.cycle === cycle && (parse.bytes || parse.injected)) this.onServer.delete(parse.name);
        }
        this.parses = this.parses.filter((parse) => parse.cycle !== cycle);
        return true;
      }
      case backend.readyForQuery: {
        // A Parse of the cycle that ended and never answered was skipped (an error came first,
        // and the server skipped the rest of the cycle): its statement is not on the server.
        const ended = this.cyclesAnswered;
        for (const parse of this.parses) {
          if (parse.cycle === ended && (parse.bytes || parse.injected)) this.onServer.delete(parse.name);
        }
        this.cyclesAnswered++;
        this.parses = this.parses.filter((parse) => parse.cycle >= this.cyclesAnswered);
        return true;
      }
      default:
        return true;
    }
  }
}

/**
 * Answers client messages no server connection will see (no connection could be leased), as
 * Postgres answers a failed statement: the first message of each cycle gets `error`, the cycle's
 * Sync (or the Query or FunctionCall itself) gets ReadyForQuery. `skipping` says the last cycle
 * is still open: messages until its Sync are dropped, and the Sync is answered with ReadyForQuery.
 */
export function refuseCycles(
  messages: readonly Message[],
  error: Uint8Array,
  skipping: boolean,
): { answer: Uint8Array[]; skipping: boolean; terminate: boolean } {
  const answer: Uint8Array[] = [];
  let open = skipping;
  for (const message of messages) {
    switch (message.type) {
      case frontend.terminate:
        return { answer, skipping: open, terminate: true };
      case frontend.query:
      case frontend.functionCall:
        if (open) break;
        answer.push(error, readyForQuery("I"));
        break;
      case frontend.sync:
        if (!open) answer.push(error);
        answer.push(readyForQuery("I"));
        open = false;
        break;
      case frontend.copyData:
      case frontend.copyDone:
      case frontend.copyFail:
        // Postgres ignores COPY messages outside COPY.
        break;
      default:
        if (!open) answer.push(error);
        open = true;
    }
  }
  return { answer, skipping: open, terminate: false };
}
