/**
 * Clients of Lessor's wire endpoint for the tests: the Neon driver's `Pool` and `Client` (and
 * node-postgres over the driver's socket), unchanged but for where their WebSocket goes. Inside
 * workerd there is no network between the test and Lessor, so `LessorWebSocket` is the one piece
 * that stands in for it: a WebSocket whose upgrade request goes to Lessor's own fetch handler, as
 * `exports.default.fetch` stands in for the network on `/sql`. Everything on top of it (startup,
 * the pipelined cleartext password, the protocol) is the driver's own code.
 *
 * Settings go on each client (`client.neonConfig`, the driver's documented per-client options):
 * the global `neonConfig` stays pointed at the test Postgres, for the harness's own connections.
 */
import { exports } from "cloudflare:workers";
import { Client, type ClientConfig, Pool, type PoolConfig } from "@neondatabase/serverless";
import {
  cancelRequest,
  concatBytes,
  frontend,
  isFrameProblem,
  type Message,
  MessageReader,
  startupMessage,
  textMessage,
} from "../../src/core/pg-wire.ts";

/** A WebSocket whose connection is Lessor's fetch handler answering the upgrade. */
export class LessorWebSocket extends EventTarget {
  static readonly CONNECTING = 0;
  static readonly OPEN = 1;
  static readonly CLOSING = 2;
  static readonly CLOSED = 3;
  binaryType = "arraybuffer";
  readyState = 0;
  private socket: WebSocket | null = null;

  constructor(url: string) {
    super();
    const request = new Request(url.replace(/^ws/, "http"), { headers: { Upgrade: "websocket" } });
    exports.default.fetch(request).then(
      (response) => {
        const socket = response.webSocket;
        if (!socket) {
          this.readyState = 3;
          this.dispatchEvent(new Event("error"));
          this.dispatchEvent(new CloseEvent("close", { code: 1006, reason: `HTTP ${response.status}` }));
          return;
        }
        socket.binaryType = "arraybuffer";
        socket.accept();
        this.socket = socket;
        socket.addEventListener("message", (event) =>
          this.dispatchEvent(new MessageEvent("message", { data: event.data })),
        );
        socket.addEventListener("close", (event) => {
          this.readyState = 3;
          this.dispatchEvent(new CloseEvent("close", { code: event.code, reason: event.reason }));
        });
        // workerd reports "Network connection lost" on a socket whose close completed once the
        // other side's request ends; a browser's WebSocket never reports an error after its close.
        socket.addEventListener("error", () => {
          if (this.readyState !== 3) this.dispatchEvent(new Event("error"));
        });
        this.readyState = 1;
        this.dispatchEvent(new Event("open"));
      },
      () => {
        this.readyState = 3;
        this.dispatchEvent(new Event("error"));
        this.dispatchEvent(new CloseEvent("close", { code: 1006 }));
      },
    );
  }

  send(data: ArrayBuffer | ArrayBufferView | string): void {
    if (this.readyState !== 1 || !this.socket) return;
    this.socket.send(data as ArrayBuffer);
  }

  close(code = 1000, reason = ""): void {
    if (this.readyState >= 2) return;
    this.readyState = 2;
    try {
      this.socket?.close(code, reason);
    } catch {
      // Already closed.
    }
  }
}

/** Where the driver's WebSocket goes: Lessor's `/v2`, whatever the connection string's host. */
export const wireSettings = {
  webSocketConstructor: LessorWebSocket,
  wsProxy: () => "lessor.test/v2",
  useSecureWebSocket: false,
  forceDisablePgSSL: true,
};

/** A Neon driver `Client` class pointed at Lessor's wire endpoint. */
export class WireClient extends Client {
  constructor(config?: string | ClientConfig) {
    super(config);
    Object.assign(this.neonConfig, wireSettings);
  }
}

/** A Neon driver `Pool` whose clients go to Lessor's wire endpoint. */
export function wirePool(config: PoolConfig): Pool {
  const pool = new Pool(config);
  pool.Client = WireClient;
  // An idle client whose connection Lessor ended must not become an uncaught error.
  pool.on("error", () => undefined);
  return pool;
}

/** The connection string with `options` choosing the pool mode. */
export function inMode(connectionString: string, mode: "session" | "transaction"): string {
  const url = new URL(connectionString.replace(/^postgres(ql)?:/, "http:"));
  url.searchParams.set("options", `-c lessor.pool_mode=${mode}`);
  return url.toString().replace(/^http:/, "postgres:");
}

/**
 * A raw wire connection, for the protocol tests: bytes in, messages out, with nothing of a
 * driver's politeness in between.
 */
export class RawWire {
  private readonly reader = new MessageReader(64 * 1024 * 1024, false);
  private readonly received: Message[] = [];
  private waiters: (() => void)[] = [];
  /** Waiting for the one-byte answer to an SSLRequest. */
  private byteAnswer: ((byte: string) => void) | null = null;
  closed = false;
  closeCode: number | null = null;

  private constructor(private readonly socket: WebSocket) {
    socket.addEventListener("message", (event) => {
      if (typeof event.data === "string") return;
      let bytes = new Uint8Array(event.data);
      if (this.byteAnswer && bytes.byteLength > 0) {
        this.byteAnswer(String.fromCharCode(bytes[0] ?? 0));
        this.byteAnswer = null;
        bytes = bytes.subarray(1);
      }
      this.reader.push(bytes);
      for (;;) {
        const message = this.reader.next();
        if (message === null || isFrameProblem(message)) break;
        this.received.push(message);
      }
      this.wake();
    });
    socket.addEventListener("close", (event) => {
      this.closed = true;
      this.closeCode = event.code;
      this.wake();
    });
  }

  /** Opens a WebSocket to `/v2` (`headers`: what the platform would add, as `CF-Connecting-IP`). */
  static async open(headers: Record<string, string> = {}): Promise<RawWire> {
    const response = await exports.default.fetch(
      new Request("http://lessor.test/v2", { headers: { ...headers, Upgrade: "websocket" } }),
    );
    const socket = response.webSocket;
    if (!socket) throw new Error(`no WebSocket: ${response.status} ${await response.text()}`);
    socket.binaryType = "arraybuffer";
    socket.accept();
    return new RawWire(socket);
  }

  /** Opens, starts up and authenticates (the password pipelined, as the driver does). */
  static async connect(user: string, key: string, params: Record<string, string> = {}): Promise<RawWire> {
    const wire = await RawWire.open();
    wire.send(
      concatBytes([startupMessage({ user, database: user, ...params }), textMessage(frontend.password, key)]),
    );
    return wire;
  }

  private wake(): void {
    for (const wake of this.waiters.splice(0)) wake();
  }

  send(bytes: Uint8Array): void {
    this.socket.send(bytes);
  }

  /** Sends an SSLRequest; answers the one byte that comes back. */
  sslRequest(): Promise<string> {
    const answer = new Promise<string>((resolve) => {
      this.byteAnswer = resolve;
    });
    this.send(new Uint8Array([0, 0, 0, 8, 4, 210, 22, 47]));
    return answer;
  }

  /** Sends a CancelRequest on a connection of its own. */
  static async cancel(pid: number, secret: number): Promise<void> {
    const wire = await RawWire.open();
    wire.send(cancelRequest(pid, secret));
    await wire.untilClosed();
  }

  /** Messages until (and including) the first one `done` accepts, or until the socket closes. */
  async until(done: (message: Message) => boolean, timeoutMs = 20_000): Promise<Message[]> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const index = this.received.findIndex(done);
      if (index >= 0) return this.received.splice(0, index + 1);
      if (this.closed || Date.now() > deadline) return this.received.splice(0);
      await new Promise<void>((resolve) => {
        this.waiters.push(resolve);
        setTimeout(resolve, 250);
      });
    }
  }

  /** Messages until the next ReadyForQuery (included). */
  untilReady(): Promise<Message[]> {
    return this.until((message) => message.type === 0x5a);
  }

  async untilClosed(timeoutMs = 20_000): Promise<Message[]> {
    const messages = await this.until(() => false, timeoutMs);
    return [...messages, ...this.received.splice(0)];
  }

  close(): void {
    try {
      this.socket.close(1000, "test");
    } catch {
      // Already closed.
    }
  }
}

/** The type letters of messages, for readable assertions (`RZ` = AuthenticationOk … ReadyForQuery). */
export function typesOf(messages: readonly Message[]): string {
  return messages.map((message) => String.fromCharCode(message.type)).join("");
}

/** An ErrorResponse's fields by letter. */
export function fieldsOf(message: Message | undefined): Record<string, string> {
  const fields: Record<string, string> = {};
  if (!message) return fields;
  let at = 0;
  const body = message.body;
  while (at < body.length && body[at] !== 0) {
    const code = String.fromCharCode(body[at] ?? 0);
    const end = body.indexOf(0, at + 1);
    fields[code] = new TextDecoder().decode(body.subarray(at + 1, end));
    at = end + 1;
  }
  return fields;
}
