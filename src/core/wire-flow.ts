/**
 * Flow control of the wire relay (docs/adr/017-wire-protocol.md, "Bounds"): what each hop of a wire
 * connection may hold, and the decisions that keep it there. Pure: counts in, decisions out.
 *
 * The hops, client to server: the client's WebSocket at the edge, the edge's WebSocket to the
 * tenant's object, the object's connection to Postgres; and back. workerd gives a WebSocket no
 * backpressure of its own: `send()` queues without a bound and tells nothing of the queue
 * (no `bufferedAmount`), and `message` events are delivered as they arrive, with no way to pause
 * them. So Lessor measures each hop from what it can see:
 *
 * - **edge ⇄ object**, where Lessor is both ends: credit. The receiver acknowledges the bytes it
 *   has taken (`AckMeter`), the sender keeps at most a window unacknowledged (`CreditWindow`).
 * - **object → Postgres**: what the server has not answered. Every cycle (a Sync, a Query, a
 *   FunctionCall) is answered by one ReadyForQuery, so the bytes of unanswered cycles bound what can
 *   be queued towards the server (`PipelineGate`): past a high-water mark no new cycle is sent
 *   until answers bring it below the low-water mark.
 * - **Postgres → object**: the server sends only answers to cycles it was sent, so the object asks
 *   for no new cycle while the client's side is behind, and the answers of one pipeline together
 *   are bounded (`AnswerBudget`), not each cycle's alone.
 * - **edge → client**: nothing to see (a client acknowledges nothing); bounded by the pipeline's
 *   answer budget and by the connection's lifetime (`LifetimeBudget`).
 */
import { frontend } from "./pg-wire.ts";

/** The bounds of one wire connection, as the tenant's object sets them and tells the edge. */
export interface WireBounds {
  /** Largest frame Lessor sends on its own hops (edge ⇄ object, to the client). */
  frameBytes: number;
  /** A receiver acknowledges once it has taken this many bytes since its last acknowledgement. */
  ackBytes: number;
  /** Client → server bytes the edge may have sent the object and not had acknowledged. */
  upWindowBytes: number;
  /** Server → client bytes the object may have sent the edge and not had acknowledged. */
  downWindowBytes: number;
  /** What the edge holds of a client's bytes beyond the window before the client is refused. */
  edgeHoldBytes: number;
  /** Unanswered bytes towards the server past which no new cycle is sent, and below which it resumes. */
  owedHighBytes: number;
  owedLowBytes: number;
  /** Unanswered cycles past which no new cycle is sent (it resumes at half). */
  maxOwedCycles: number;
  /** Largest cycle (its messages up to its Sync), outside COPY data. */
  maxCycleBytes: number;
  /** How long the client's side may leave the object's bytes unacknowledged before the client is refused. */
  drainMs: number;
  /** A connection is told to reconnect, between transactions, after this long … */
  lifetimeMs: number;
  /** … or after the edge relayed this many frames (both ways), whichever comes first. */
  lifetimeFrames: number;
}

/** The settings the bounds are made of (src/config). */
export interface WireBoundSettings {
  maxBodyBytes: number;
  wireBufferBytes: number;
  wireDrainMs: number;
  wireMaxLifetimeMs: number;
  wireMaxFrames: number;
}

/** Framing around a message body: a message may be this much larger than `LESSOR_MAX_BODY_BYTES`. */
export const messageFramingBytes = 64 * 1024;

/** Frames Lessor sends itself are at most this large (a quarter of workerd's smallest receive limit). */
export const relayFrameBytes = 64 * 1024;

/**
 * The bounds for a deployment's settings. The up window must let a whole message through (the
 * object reads whole messages before it forwards them) with an acknowledgement and a frame on top:
 * then the edge is only ever kept waiting while the object holds whole messages back, never because
 * a message cannot be completed (see `CreditWindow`).
 */
export function wireBounds(settings: WireBoundSettings): WireBounds {
  const maxMessage = settings.maxBodyBytes + messageFramingBytes;
  const buffer = settings.wireBufferBytes;
  return {
    frameBytes: relayFrameBytes,
    ackBytes: relayFrameBytes,
    upWindowBytes: maxMessage + 2 * relayFrameBytes,
    downWindowBytes: Math.max(buffer, 2 * relayFrameBytes),
    edgeHoldBytes: Math.max(buffer, maxMessage),
    owedHighBytes: buffer,
    owedLowBytes: Math.floor(buffer / 2),
    maxOwedCycles: 1024,
    maxCycleBytes: maxMessage,
    drainMs: settings.wireDrainMs,
    lifetimeMs: settings.wireMaxLifetimeMs,
    lifetimeFrames: settings.wireMaxFrames,
  };
}

/** Reads bounds the object sent the edge (JSON); null if they are not bounds. */
export function parseWireBounds(raw: string | null): WireBounds | null {
  if (raw === null) return null;
  try {
    const value = JSON.parse(raw) as Record<string, unknown>;
    const keys: (keyof WireBounds)[] = [
      "frameBytes",
      "ackBytes",
      "upWindowBytes",
      "downWindowBytes",
      "edgeHoldBytes",
      "owedHighBytes",
      "owedLowBytes",
      "maxOwedCycles",
      "maxCycleBytes",
      "drainMs",
      "lifetimeMs",
      "lifetimeFrames",
    ];
    for (const key of keys) {
      const field = value[key];
      if (typeof field !== "number" || !Number.isInteger(field) || field <= 0) return null;
    }
    return value as unknown as WireBounds;
  } catch {
    return null;
  }
}

// ── Credit on Lessor's own hop ──────────────────────────────────────────────────────────────────

/**
 * The sending side of a hop whose receiver acknowledges: at most `window` bytes unacknowledged.
 *
 * Why it cannot deadlock: if the receiver acknowledges whenever `ackBytes` are taken, then while the
 * sender waits, what is unacknowledged is what the receiver holds untaken plus less than `ackBytes`
 * taken. A receiver that is not holding anything back holds at most one partial message, so with
 * `window ≥ largest message + ackBytes + frame` the sender can always send what completes it: the
 * sender waits only while the receiver holds whole messages back, which is the backpressure meant.
 */
export class CreditWindow {
  inFlight = 0;
  peak = 0;

  constructor(readonly window: number) {}

  /** Bytes that may be sent now. */
  get room(): number {
    return Math.max(0, this.window - this.inFlight);
  }

  sent(bytes: number): void {
    this.inFlight += bytes;
    if (this.inFlight > this.peak) this.peak = this.inFlight;
  }

  /** The receiver acknowledged `bytes`; false if it acknowledged more than was sent (a broken peer). */
  acked(bytes: number): boolean {
    if (bytes <= 0 || bytes > this.inFlight) return false;
    this.inFlight -= bytes;
    return true;
  }
}

/** The receiving side: acknowledges in batches of at least `every` bytes, so acks cost little. */
export class AckMeter {
  private pending = 0;

  constructor(readonly every: number) {}

  /** Bytes taken and not yet acknowledged. */
  get unacknowledged(): number {
    return this.pending;
  }

  /** `bytes` were taken; answers how many to acknowledge now (0: not yet). */
  took(bytes: number): number {
    this.pending += bytes;
    if (this.pending < this.every) return 0;
    const ack = this.pending;
    this.pending = 0;
    return ack;
  }
}

/** An acknowledgement on Lessor's own hop: a text frame (the protocol's own bytes travel in binary ones). */
export function ackFrame(bytes: number): string {
  return `a${bytes}`;
}

/** Control frames of Lessor's own hop, read from a text frame; null if it is none. */
export type ControlFrame = { kind: "ack"; bytes: number } | { kind: "lifetime" };

export function parseControlFrame(text: string): ControlFrame | null {
  if (text === "l") return { kind: "lifetime" };
  if (!/^a[1-9][0-9]{0,12}$/.test(text)) return null;
  return { kind: "ack", bytes: Number(text.slice(1)) };
}

/** Tells the object the edge's frame budget is spent: end at the next boundary. */
export const lifetimeFrame = "l";

// ── Towards the server ──────────────────────────────────────────────────────────────────────────

/** What to do with the next client message on its way to the server. */
export type GateDecision = "forward" | "hold" | "refuse";

const cycleEnds: ReadonlySet<number> = new Set([frontend.sync, frontend.query, frontend.functionCall]);
const copyMessages: ReadonlySet<number> = new Set([frontend.copyData, frontend.copyDone, frontend.copyFail]);

/**
 * The bytes and cycles a server connection owes answers for. A new cycle is held back (not refused)
 * while the server owes more than the high-water mark, or while the client's side is behind; it is
 * let through again below the low-water mark. A cycle already begun is never held: its Sync must
 * reach the server, or the server would wait for it forever. COPY data goes through while the
 * server takes it (its own bound is `LESSOR_MAX_BODY_BYTES`).
 */
export class PipelineGate {
  /** Bytes of each sent cycle not yet answered, oldest first (from `first`). */
  private cycles: number[] = [];
  private first = 0;
  /** Bytes of the cycle being sent (since the last Sync, Query or FunctionCall). */
  private open = 0;
  private closed = false;
  owedBytes = 0;
  peakOwedBytes = 0;

  constructor(
    private readonly bounds: Pick<
      WireBounds,
      "owedHighBytes" | "owedLowBytes" | "maxOwedCycles" | "maxCycleBytes"
    >,
  ) {}

  /** Cycles sent and not answered. */
  get owedCycles(): number {
    return this.cycles.length - this.first;
  }

  /** The next message would begin a cycle. */
  get atBoundary(): boolean {
    return this.open === 0;
  }

  /**
   * Whether a message of `type` and `bytes` goes to the server now: `copyIn` says the server is
   * taking COPY data, `clientBehind` that the client's side has not taken what was sent to it.
   */
  decide(type: number, bytes: number, copyIn: boolean, clientBehind: boolean): GateDecision {
    if (copyIn && copyMessages.has(type)) return "forward";
    if (this.open > 0) return this.open + bytes > this.bounds.maxCycleBytes ? "refuse" : "forward";
    if (bytes > this.bounds.maxCycleBytes) return "refuse";
    if (this.owedCycles === 0 && !clientBehind) return "forward";
    if (clientBehind) return "hold";
    if (this.closed) {
      if (this.owedBytes <= this.bounds.owedLowBytes && this.owedCycles <= this.bounds.maxOwedCycles / 2) {
        this.closed = false;
      } else {
        return "hold";
      }
    }
    if (this.owedBytes >= this.bounds.owedHighBytes || this.owedCycles >= this.bounds.maxOwedCycles) {
      this.closed = true;
      return "hold";
    }
    return "forward";
  }

  /** A message went to the server (after `decide` said so, or as a re-preparation Lessor added). */
  forwarded(type: number, bytes: number, copyIn: boolean): void {
    this.owedBytes += bytes;
    if (this.owedBytes > this.peakOwedBytes) this.peakOwedBytes = this.owedBytes;
    if (copyIn && copyMessages.has(type) && this.open === 0 && this.owedCycles > 0) {
      // COPY data belongs to the cycle the server is in (the oldest unanswered one).
      this.cycles[this.first] = (this.cycles[this.first] ?? 0) + bytes;
      return;
    }
    this.open += bytes;
    if (cycleEnds.has(type)) {
      this.cycles.push(this.open);
      this.open = 0;
    }
  }

  /** The server answered its oldest cycle (a ReadyForQuery). */
  answered(): void {
    if (this.owedCycles === 0) return;
    this.owedBytes -= this.cycles[this.first] ?? 0;
    this.first++;
    if (this.first === this.cycles.length) {
      this.cycles = [];
      this.first = 0;
    } else if (this.first >= 64 && this.first * 2 >= this.cycles.length) {
      this.cycles = this.cycles.slice(this.first);
      this.first = 0;
    }
  }

  /** A new server connection: it owes nothing (what the old one owed ended with it). */
  reset(): void {
    this.cycles = [];
    this.first = 0;
    this.open = 0;
    this.owedBytes = 0;
    this.closed = false;
  }
}

/**
 * The answer bound of one pipeline: what a client sends before it has nothing outstanding. The
 * answers (rows and COPY data) of all its cycles together may not pass the bound, so pipelining
 * does not multiply it; a client that waits for each answer (every driver's `query`) has each
 * statement's answer bounded alone, as before.
 */
export class AnswerBudget {
  used = 0;

  constructor(readonly max: number) {}

  /** Counts answer bytes; false once the pipeline's answers pass the bound. */
  add(bytes: number): boolean {
    this.used += bytes;
    return this.used <= this.max;
  }

  /** The client has nothing outstanding (no cycle owed, nothing waiting in Lessor): a new pipeline. */
  settle(outstanding: boolean): void {
    if (!outstanding) this.used = 0;
  }
}

// ── Lifetime ────────────────────────────────────────────────────────────────────────────────────

/** Why a connection's lifetime is spent. */
export type LifetimeSpent = "time" | "frames";

/**
 * A wire connection's lifetime, as poolers bound a server connection's (`server_lifetime`): past it
 * the client is told to reconnect at its next boundary (idle, outside a transaction). The edge's
 * CPU per invocation is what it bounds: frames × CPU per frame stays under the Worker's `cpu_ms`.
 */
export class LifetimeBudget {
  frames = 0;

  constructor(
    private readonly bounds: Pick<WireBounds, "lifetimeMs" | "lifetimeFrames">,
    private readonly startedAt: number,
  ) {}

  /** Counts relayed frames; answers whether the frame budget is spent. */
  relayed(frames: number): boolean {
    this.frames += frames;
    return this.frames >= this.bounds.lifetimeFrames;
  }

  /** Past twice the frame budget the edge ends the connection without waiting for a boundary. */
  get overdrawn(): boolean {
    return this.frames >= 2 * this.bounds.lifetimeFrames;
  }

  spent(now: number): LifetimeSpent | null {
    if (this.frames >= this.bounds.lifetimeFrames) return "frames";
    if (now - this.startedAt >= this.bounds.lifetimeMs) return "time";
    return null;
  }
}
