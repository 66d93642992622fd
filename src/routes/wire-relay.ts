/**
 * The edge's relay of an authenticated wire connection (src/routes/wire.ts): frames from the client
 * to the tenant's object and back, read by neither side of it, within the bounds the object set
 * (src/core/wire-flow.ts, docs/adr/017-wire-protocol.md "Bounds").
 *
 * - Client to object: at most a window of bytes the object has not acknowledged. The rest is held
 *   here, joined into fewer frames when it goes; a client whose held bytes pass the hold bound is
 *   refused (`pipeline_limit`). The edge cannot stop reading the client's WebSocket (workerd
 *   delivers every message as it arrives and has no pause), so holding and then refusing is what is
 *   left of "stop reading".
 * - Object to client: every frame is handed to the client's socket and acknowledged to the object.
 *   What the runtime then queues towards the client is not visible from here (workerd's
 *   `WebSocket` has no `bufferedAmount` and `send()` reports nothing); it is bounded by what the
 *   object lets through: the pipeline's answer bound and the connection's lifetime.
 * - Every frame relayed counts against the connection's lifetime: past the frame budget the object
 *   is told (it ends the connection at its next boundary); past twice the budget the edge ends it.
 */
import {
  Fifo,
  takeBytes,
  type WireBufferSnapshot,
  type WireGauge,
  WireLedger,
} from "../core/wire-buffers.ts";
import {
  AckMeter,
  ackFrame,
  CreditWindow,
  LifetimeBudget,
  lifetimeFrame,
  parseControlFrame,
  type WireBounds,
} from "../core/wire-flow.ts";
import { LessorError } from "../errors/index.ts";

/** What a held frame costs beyond its bytes (the array and its buffer), counted against the hold bound. */
export const heldFrameOverheadBytes = 64;

/**
 * What this isolate's edge relays hold, per wire connection (by process id): exposed so that tests
 * read the bytes a connection holds, never a clock.
 */
export const wireEdgeLedger = new WireLedger();

/** One wire connection's counts at the edge, live or recently ended; null if unknown. */
export function wireEdgeBuffers(pid: number): WireBufferSnapshot | null {
  return wireEdgeLedger.find(pid);
}

/**
 * Test-only: a client whose socket does not drain. workerd shows no edge what its client's socket
 * has taken, and a test's client inside workerd always reads; so a test names the process id of a
 * connection whose client "stops reading", and for it the edge keeps what the object sends instead
 * of handing it on, and acknowledges none of it: what a drain signal would make it do.
 */
export const wireEdgeHooksForTests: { clientStopsReading?: (pid: number) => boolean } = {};

/** How the relay ends a connection: a FATAL to the client (the object learns it from the close). */
export interface RelayEnd {
  refuse(error: LessorError): void;
}

export class EdgeRelay {
  private readonly up: CreditWindow;
  private readonly down: AckMeter;
  private readonly held = new Fifo<Uint8Array>();
  private heldBytes = 0;
  private readonly withheld = new Fifo<Uint8Array>();
  private withheldBytes = 0;
  private readonly lifetime: LifetimeBudget;
  private lifetimeTold = false;
  private readonly gauge: WireGauge;
  private ended = false;

  constructor(
    private readonly client: WebSocket,
    private readonly upstream: WebSocket,
    private readonly bounds: WireBounds,
    private readonly pid: number,
    private readonly end: RelayEnd,
  ) {
    this.up = new CreditWindow(bounds.upWindowBytes);
    this.down = new AckMeter(bounds.ackBytes);
    this.lifetime = new LifetimeBudget(bounds, Date.now());
    this.gauge = wireEdgeLedger.open(pid);
  }

  /** A client frame, in order. */
  fromClient(bytes: Uint8Array): void {
    if (this.ended || !this.count()) return;
    if (bytes.byteLength > this.bounds.edgeHoldBytes) {
      this.end.refuse(
        new LessorError("frame_limit", {
          publicMessage: `A WebSocket frame of ${bytes.byteLength} bytes is larger than Lessor takes (${this.bounds.edgeHoldBytes}); the connection is closed.`,
        }),
      );
      return;
    }
    let rest = bytes;
    if (this.held.size === 0) {
      while (rest.byteLength > 0 && this.up.room > 0) {
        const piece = Math.min(rest.byteLength, this.up.room, this.bounds.frameBytes);
        if (!this.sendUp(rest.subarray(0, piece))) return;
        rest = rest.subarray(piece);
      }
    }
    if (rest.byteLength > 0) {
      this.held.push(rest);
      this.heldBytes += rest.byteLength;
      if (this.heldBytes + this.held.size * heldFrameOverheadBytes > this.bounds.edgeHoldBytes) {
        this.end.refuse(
          new LessorError("pipeline_limit", {
            publicMessage: `The client sent more than ${this.bounds.edgeHoldBytes} bytes (LESSOR_WIRE_BUFFER_BYTES) that the server has not taken yet (statements behind one that still runs); the connection is closed. Wait for answers before sending more.`,
          }),
        );
        return;
      }
    }
    this.measure();
  }

  /** A frame from the object: the server's bytes for the client, or the object's acknowledgement. */
  fromUpstream(data: string | ArrayBuffer): void {
    if (this.ended) return;
    if (typeof data === "string") {
      const control = parseControlFrame(data);
      if (control?.kind === "ack" && this.up.acked(control.bytes)) {
        this.flush();
        this.measure();
      }
      return;
    }
    if (!this.count()) return;
    const bytes = new Uint8Array(data);
    if (wireEdgeHooksForTests.clientStopsReading?.(this.pid)) {
      this.withheld.push(bytes);
      this.withheldBytes += bytes.byteLength;
      this.measure();
      return;
    }
    try {
      this.client.send(bytes);
    } catch {
      return;
    }
    const ack = this.down.took(bytes.byteLength);
    if (ack > 0) this.sendControl(ackFrame(ack));
  }

  /** Counts a relayed frame against the lifetime; false if the connection ended on it. */
  private count(): boolean {
    const spent = this.lifetime.relayed(1);
    if (spent && !this.lifetimeTold) {
      this.lifetimeTold = true;
      this.sendControl(lifetimeFrame);
    }
    if (this.lifetime.overdrawn) {
      this.end.refuse(
        new LessorError("wire_lifetime", {
          retryAfterSeconds: 1,
          publicMessage: `This connection relayed twice its share of frames (LESSOR_WIRE_MAX_FRAMES, ${this.bounds.lifetimeFrames}) without a boundary to end at; open another.`,
        }),
      );
      return false;
    }
    return true;
  }

  /** Sends held client bytes as the window allows, small frames joined. */
  private flush(): void {
    while (this.heldBytes > 0 && this.up.room > 0) {
      const size = Math.min(this.heldBytes, this.up.room, this.bounds.frameBytes);
      const frame = takeBytes(this.held, size);
      this.heldBytes -= size;
      if (!this.sendUp(frame)) return;
    }
  }

  private sendUp(bytes: Uint8Array): boolean {
    try {
      this.upstream.send(bytes);
    } catch {
      return false;
    }
    this.up.sent(bytes.byteLength);
    return true;
  }

  private sendControl(text: string): void {
    try {
      this.upstream.send(text);
    } catch {
      // The object is gone; its close ends the relay.
    }
  }

  private measure(): void {
    this.gauge.set("toServerEdge", this.heldBytes);
    this.gauge.set("toServerInFlight", this.up.inFlight);
    this.gauge.set("toClientEdge", this.withheldBytes);
  }

  /**
   * The connection ended: everything held is dropped, and the counts read once more and kept. With
   * `deliverWithheld` (the object ended it), what a client that stopped reading was not given is
   * handed on first, as a socket's queue would be read by a client that reads again.
   */
  close(deliverWithheld: boolean): void {
    if (this.ended) return;
    this.ended = true;
    if (deliverWithheld) {
      for (let bytes = this.withheld.shift(); bytes; bytes = this.withheld.shift()) {
        try {
          this.client.send(bytes);
        } catch {
          break;
        }
      }
    }
    this.held.clear();
    this.heldBytes = 0;
    this.withheld.clear();
    this.withheldBytes = 0;
    this.up.inFlight = 0;
    this.measure();
    wireEdgeLedger.close(this.gauge);
  }
}
