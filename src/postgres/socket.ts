/**
 * The Neon driver's socket for a host reached over TCP (docs/adr/027-direct-tcp-path.md): the
 * driver's `Connection` talks to this object exactly as it talks to its own WebSocket-backed
 * `Socket` (`connect`, `write`, `end`, `destroy`, `data`/`connect`/`close`/`error` events, and
 * `startTls`, which the driver's `tls.connect` shim calls after the server accepts the SSLRequest),
 * but the bytes go over workerd's `connect()` from `cloudflare:sockets`, with
 * `secureTransport: "starttls"`.
 *
 * With `tls` on (every host off loopback, and loopback unless its configuration says `disable`):
 * - nothing but the SSLRequest (or, for a cancel, nothing at all) leaves before TLS is up: a
 *   startup message or a password can never cross the network in plaintext, whatever the driver
 *   would do;
 * - a server that answers the SSLRequest with `N` is refused (`host_tls_refused`), as is a TLS
 *   handshake that fails: workerd checks the certificate against its trust store and the host name
 *   (`sslmode=verify-full` semantics; workerd has no way to skip the check, and Lessor asks none).
 *
 * Like `PromptCloseWebSocket` (prompt-close.ts): an end waits for the server's close at most
 * `closeGraceMs` (a cut, `destroy()`, not at all), a write after the end is dropped, and a clean end
 * reports no `error`.
 */

import { connect } from "cloudflare:sockets";
import { Buffer } from "node:buffer";
import { EventEmitter } from "node:events";
import { LessorError } from "../errors/index.ts";
import { closeGraceMs } from "./prompt-close.ts";

type Socket = ReturnType<typeof connect>;

/** How this socket reaches its host. */
export interface TcpSocketOptions {
  /** STARTTLS after the SSLRequest, verified against the host name; false only for loopback `disable`. */
  tls: boolean;
}

/** Postgres's SSLRequest: length 8, code 80877103. */
const sslRequest = new Uint8Array([0, 0, 0, 8, 4, 210, 22, 47]);
/** The code of a CancelRequest (length 16), which is sent on a fresh connection, before any login. */
const cancelRequestCode = 80877102;

/** A refusal of the host's transport, with the stable code its start failure is classified by. */
export class HostTransportRefused extends Error {
  override readonly name = "HostTransportRefused";
  constructor(
    readonly code: "host_tls_refused" | "host_auth_refused",
    message: string,
  ) {
    super(message);
  }
}

/** The error a start refused for its transport answers with (src/errors). */
export function transportRefusal(error: HostTransportRefused, retryAfterSeconds: number): LessorError {
  return new LessorError(error.code, { internal: error.message, retryAfterSeconds });
}

type TlsPhase = "plain" | "requested" | "upgrading" | "secure";

/** The driver's socket over `connect()` (see the module's comment). */
export class TcpSocket extends EventEmitter {
  /** Read by the driver's `Connection` before each write. */
  writable = false;
  destroyed = false;
  // The driver's Client reads its settings off its socket (`client.neonConfig` is the socket).
  forceDisablePgSSL: boolean;
  pipelineTLS = false;
  pipelineConnect: false = false;
  useSecureWebSocket = false;
  disableWarningInBrowsers = true;
  coalesceWrites = false;

  private socket: Socket | null = null;
  private writer: WritableStreamDefaultWriter<Uint8Array> | null = null;
  private reader: ReadableStreamDefaultReader<Uint8Array> | null = null;
  private hostname = "";
  private phase: TlsPhase = "plain";
  /** Bytes written while TLS is being set up (a cancel's, which waits for TLS). */
  private held: Uint8Array[] = [];
  /** Bytes received over TLS so far: none means the handshake has not been seen to succeed. */
  private secureBytes = 0;
  private ended = false;
  private closeReported = false;
  private graceTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(private readonly options: TcpSocketOptions) {
    super();
    this.forceDisablePgSSL = !options.tls;
  }

  /** Whether this socket demands TLS before any login byte. */
  get tlsRequired(): boolean {
    return this.options.tls;
  }

  setNoDelay(): this {
    return this;
  }
  setKeepAlive(): this {
    return this;
  }
  ref(): this {
    return this;
  }
  unref(): this {
    return this;
  }

  /** Opens the TCP connection; `connect` is emitted once it is open. */
  connect(port: number | string, host: string, listener?: () => void): this {
    if (listener) this.once("connect", listener);
    this.hostname = host;
    let socket: Socket;
    try {
      socket = connect(
        { hostname: host, port: typeof port === "string" ? Number.parseInt(port, 10) : port },
        { secureTransport: this.options.tls ? "starttls" : "off", allowHalfOpen: false },
      );
    } catch (error) {
      queueMicrotask(() => this.fail(error));
      return this;
    }
    this.adopt(socket);
    socket.opened.then(
      () => {
        if (this.ended) return;
        this.writable = true;
        this.emit("connect");
      },
      (error: unknown) => this.fail(error),
    );
    return this;
  }

  /**
   * Called by the driver's `tls.connect` shim once the server answered the SSLRequest with `S`:
   * upgrades this same socket (the driver keeps using it), verified against the host it was given.
   */
  startTls(servername?: string): this {
    if (this.phase !== "requested" || !this.socket) {
      this.fail(new HostTransportRefused("host_tls_refused", "TLS started out of order"));
      return this;
    }
    this.phase = "upgrading";
    this.release();
    let secure: Socket;
    try {
      // workerd verifies against the name given to `connect()` (it takes no other: an
      // `expectedServerHostname` is ignored with a warning), which is the host the driver names.
      void servername;
      secure = this.socket.startTls();
    } catch (error) {
      this.fail(tlsFailure(this.hostname, error));
      return this;
    }
    this.adopt(secure);
    this.phase = "secure";
    this.emit("secureConnection", this);
    const held = this.held;
    this.held = [];
    for (const bytes of held) this.send(bytes);
    return this;
  }

  write(data: Uint8Array | string, encoding?: unknown, callback?: (error?: Error) => void): boolean {
    const done = typeof encoding === "function" ? (encoding as (error?: Error) => void) : callback;
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
    if (this.ended || bytes.length === 0) {
      done?.();
      return true;
    }
    if (this.options.tls && this.phase === "plain") {
      if (sameBytes(bytes, sslRequest)) {
        this.phase = "requested";
      } else if (isCancelRequest(bytes)) {
        // A cancel carries the backend's key: it too goes over TLS (as libpq 17 sends it).
        this.held.push(bytes);
        this.phase = "requested";
        this.send(sslRequest);
        done?.();
        return true;
      } else {
        this.fail(new HostTransportRefused("host_tls_refused", "a message was about to be sent before TLS"));
        done?.(new Error("refused before TLS"));
        return false;
      }
    } else if (this.phase === "requested" || this.phase === "upgrading") {
      this.held.push(bytes);
      done?.();
      return true;
    }
    this.send(bytes, done);
    return true;
  }

  /**
   * Ends the connection: whatever was queued (the driver's Terminate) leaves, and `close` is
   * reported when the server closes the socket, which it does once the backend has exited, so the
   * backend is gone from `pg_stat_activity` by then (a budget slot released on `close` is free on
   * the host too). A server that never closes is not waited for beyond `closeGraceMs`.
   */
  end(data?: Uint8Array | string, _encoding?: unknown, callback?: () => void): this {
    if (data !== undefined && typeof data !== "function" && data.length > 0) this.write(data);
    this.ended = true;
    this.writable = false;
    if (!this.closeReported) {
      this.graceTimer ??= setTimeout(() => {
        void this.socket?.close().catch(() => undefined);
        this.reportClose();
      }, closeGraceMs);
    }
    if (typeof data === "function") (data as () => void)();
    callback?.();
    return this;
  }

  destroy(): this {
    this.destroyed = true;
    const socket = this.socket;
    this.ended = true;
    this.writable = false;
    void socket?.close().catch(() => undefined);
    // As Node's sockets do, `close` comes after `destroy()` returns: the driver's `end()` of a busy
    // connection destroys its socket and only then listens for the end, which a close reported
    // inside `destroy()` went past (end() waited for ever).
    queueMicrotask(() => this.reportClose());
    return this;
  }

  private adopt(socket: Socket): void {
    this.socket = socket;
    this.writer = socket.writable.getWriter();
    this.reader = socket.readable.getReader();
    void this.readLoop(socket, this.reader);
  }

  private release(): void {
    try {
      this.writer?.releaseLock();
    } catch {
      // Already released.
    }
    try {
      this.reader?.releaseLock();
    } catch {
      // A read was pending: it ends with an error that the read loop ignores (the socket moved on).
    }
    this.writer = null;
    this.reader = null;
  }

  private send(bytes: Uint8Array, done?: (error?: Error) => void): void {
    const writer = this.writer;
    if (!writer) {
      done?.();
      return;
    }
    writer.write(bytes).then(
      () => done?.(),
      (error: unknown) => {
        done?.(error instanceof Error ? error : new Error("write failed"));
        if (this.socket === null || writer === this.writer) this.fail(error);
      },
    );
  }

  private async readLoop(socket: Socket, reader: ReadableStreamDefaultReader<Uint8Array>): Promise<void> {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (error) {
        if (this.socket !== socket) return;
        this.fail(error);
        return;
      }
      if (this.socket !== socket) return;
      if (chunk.done) {
        if (this.phase === "secure" && this.secureBytes === 0 && !this.ended) {
          this.fail(tlsFailure(this.hostname, new Error("closed during the TLS handshake")));
          return;
        }
        this.ended = true;
        this.writable = false;
        void socket.close().catch(() => undefined);
        this.reportClose();
        return;
      }
      const value = chunk.value;
      if (this.phase === "requested") {
        // The answer to the SSLRequest: one byte, read before the TLS handshake begins.
        if (value.length !== 1 || value[0] !== 0x53) {
          this.fail(
            new HostTransportRefused(
              "host_tls_refused",
              value[0] === 0x4e
                ? `host ${this.hostname} does not offer TLS (it answered the SSLRequest with N)`
                : `host ${this.hostname} answered the SSLRequest with something other than S or N`,
            ),
          );
          return;
        }
        if (this.held.length > 0) {
          // A cancel asked for TLS itself: the driver is not waiting for this answer.
          this.startTls(this.hostname);
          return;
        }
        this.emit("data", Buffer.from(value.buffer, value.byteOffset, value.byteLength));
        return;
      }
      if (this.phase === "secure") this.secureBytes += value.byteLength;
      this.emit("data", Buffer.from(value.buffer, value.byteOffset, value.byteLength));
    }
  }

  /** Reports `error` (unless the connection already ended cleanly), then `close`, and closes. */
  private fail(error: unknown): void {
    if (this.closeReported) return;
    // Anything that fails after TLS began and before a byte came back through it is the handshake:
    // workerd reports a certificate it refused as an opaque "internal error" on the next read or write.
    if (this.phase === "secure" && this.secureBytes === 0 && !(error instanceof HostTransportRefused)) {
      error = tlsFailure(this.hostname, error);
    }
    this.ended = true;
    this.writable = false;
    void this.socket?.close().catch(() => undefined);
    this.emit("error", error instanceof Error ? error : new Error(String(error)));
    this.reportClose();
  }

  private reportClose(): void {
    clearTimeout(this.graceTimer);
    if (this.closeReported) return;
    this.closeReported = true;
    this.emit("close");
  }
}

/** A failed TLS handshake: the certificate is not trusted, or does not name the host. */
function tlsFailure(hostname: string, cause: unknown): HostTransportRefused {
  const detail = cause instanceof Error ? cause.message.slice(0, 200) : "handshake failed";
  return new HostTransportRefused(
    "host_tls_refused",
    `TLS with host ${hostname} failed (its certificate must be trusted and name the host): ${detail}`,
  );
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function isCancelRequest(bytes: Uint8Array): boolean {
  if (bytes.length !== 16) return false;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return view.getInt32(0) === 16 && view.getInt32(4) === cancelRequestCode;
}
