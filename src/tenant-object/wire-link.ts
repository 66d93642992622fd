/**
 * The tenant object's end of a wire connection's own hop: the WebSocket the edge relays the client
 * through (docs/adr/017-wire-protocol.md, "Bounds"). Lessor is both ends of it, so both directions
 * carry credit (src/core/wire-flow.ts):
 *
 * - client to server: the object acknowledges the bytes it has taken (forwarded to the server,
 *   answered itself, or dropped); what it holds back is not acknowledged, so the edge stops sending
 *   once a window is in flight, and holds the rest itself;
 * - server to client: the object sends at most a window the edge has not acknowledged; the rest
 *   waits here. Waiting longer than the drain bound, or more than the hold bound, ends the
 *   connection (`client_not_reading`): the client's side does not take what it asked for.
 *
 * Acknowledgements and the edge's notice that its frame budget is spent are text frames; the
 * protocol's own bytes are binary frames.
 */
import { Fifo, takeWhole } from "../core/wire-buffers.ts";
import { AckMeter, ackFrame, CreditWindow, parseControlFrame, type WireBounds } from "../core/wire-flow.ts";

export interface EdgeLinkEvents {
  /** Client bytes arrived. */
  data(chunk: Uint8Array): void;
  /** The edge has taken what waited here: the client's side caught up. */
  caughtUp(): void;
  /** The edge's frame budget is spent: end the connection at its next boundary. */
  lifetime(): void;
  /** The client's side left bytes untaken past the drain bound (or past the hold bound). */
  notDraining(reason: "time" | "bytes"): void;
  /** The edge broke the link's own protocol (an ack of bytes never sent, an unknown text frame). */
  broken(): void;
  closed(): void;
}

export class EdgeLink {
  private readonly down: CreditWindow;
  private readonly up: AckMeter;
  /** Server bytes waiting for credit, oldest first. */
  private readonly waiting = new Fifo<Uint8Array>();
  private waitingBytes = 0;
  private drainTimer: ReturnType<typeof setTimeout> | undefined;
  private open = true;
  /** The last frame sent ended inside a message (one larger than a frame): its rest is first in line. */
  private cut = false;

  constructor(
    private readonly socket: WebSocket,
    private readonly bounds: WireBounds,
    private readonly holdBytes: number,
    private readonly events: EdgeLinkEvents,
  ) {
    this.down = new CreditWindow(bounds.downWindowBytes);
    this.up = new AckMeter(bounds.ackBytes);
  }

  listen(): void {
    this.socket.addEventListener("message", (event) => this.fromEdge(event.data));
    this.socket.addEventListener("close", () => this.events.closed());
    this.socket.addEventListener("error", () => this.events.closed());
  }

  /** Server bytes held here, waiting for the edge to take what it was sent. */
  get held(): number {
    return this.waitingBytes;
  }

  /** Server bytes sent to the edge and not yet acknowledged. */
  get inFlight(): number {
    return this.down.inFlight;
  }

  /** The client's side has not taken everything the server sent it. */
  get behind(): boolean {
    return this.waitingBytes > 0;
  }

  private fromEdge(data: string | ArrayBuffer): void {
    if (!this.open) return;
    if (typeof data !== "string") {
      this.events.data(new Uint8Array(data));
      return;
    }
    const control = parseControlFrame(data);
    if (control?.kind === "lifetime") {
      this.events.lifetime();
      return;
    }
    if (control?.kind !== "ack" || !this.down.acked(control.bytes)) {
      this.events.broken();
      return;
    }
    const wasBehind = this.behind;
    this.flush();
    if (wasBehind && !this.behind) this.events.caughtUp();
  }

  /** Client bytes taken (forwarded, answered or dropped): acknowledged in batches. */
  took(bytes: number): void {
    const ack = this.up.took(bytes);
    if (ack > 0) this.sendRaw(ackFrame(ack));
  }

  /** Sends server bytes to the client, within the window; the rest waits. */
  send(parts: readonly Uint8Array[]): void {
    if (!this.open) return;
    for (const part of parts) {
      if (part.byteLength === 0) continue;
      this.waiting.push(part);
      this.waitingBytes += part.byteLength;
    }
    this.flush();
    if (this.waitingBytes > this.holdBytes) this.events.notDraining("bytes");
  }

  /**
   * Sends what the window allows, in frames of at most `frameBytes` that end between messages
   * unless a message is larger than a frame (core `takeWhole`).
   */
  private flush(): void {
    while (this.waitingBytes > 0 && this.down.room > 0) {
      const next = takeWhole(
        this.waiting,
        Math.min(this.down.room, this.bounds.frameBytes),
        this.bounds.frameBytes,
      );
      if (next === null) break;
      this.waitingBytes -= next.bytes.byteLength;
      this.cut = next.cut;
      this.down.sent(next.bytes.byteLength);
      if (!this.sendRaw(next.bytes)) return;
    }
    if (this.waitingBytes === 0) {
      clearTimeout(this.drainTimer);
      this.drainTimer = undefined;
    } else if (this.drainTimer === undefined) {
      this.drainTimer = setTimeout(() => this.events.notDraining("time"), this.bounds.drainMs);
    }
  }

  /**
   * The next `size` waiting bytes as one frame: a part, or a view of one, when it is that large;
   * small parts joined (each byte copied once).
   */
  /**
   * Sends a last message (a FATAL) past the window, dropping what waited: the connection ends, and
   * whatever the client's side did not take it will not be given. If the last frame ended inside a
   * message, the client cannot be told anything after it unless the message is finished: with
   * `finish`, its rest goes first (one message, bounded by the answer bound); without (the client
   * does not read), nothing more is sent and the close says it ended. Answers whether it was sent.
   */
  last(bytes: Uint8Array, finish: boolean): boolean {
    const rest = this.cut ? this.waiting.peek() : undefined;
    this.drop();
    if (!this.open || (rest && !finish)) return false;
    if (rest) this.sendRaw(rest);
    return this.sendRaw(bytes);
  }

  private sendRaw(data: Uint8Array | string): boolean {
    try {
      this.socket.send(data);
      return true;
    } catch {
      this.open = false;
      this.events.closed();
      return false;
    }
  }

  /** Everything waiting is dropped and nothing more is sent (the connection ended). */
  drop(): void {
    this.waiting.clear();
    this.waitingBytes = 0;
    clearTimeout(this.drainTimer);
    this.drainTimer = undefined;
  }

  close(): void {
    this.drop();
    this.open = false;
    this.down.inFlight = 0;
    if (this.socket.readyState === WebSocket.OPEN) {
      try {
        this.socket.close(1000, "closed");
      } catch {
        // Closed meanwhile.
      }
    }
  }
}
