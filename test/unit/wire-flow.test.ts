/**
 * The wire relay's flow control and bounds (src/core/wire-flow.ts, wire-buffers.ts,
 * cancel-limits.ts), as pure functions: credit that never deadlocks and never lets more than a
 * window out, a gate that holds only whole cycles back, an answer bound per pipeline, frames that end
 * between messages, and counters with a bounded memory. fast-check drives the streams.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { WindowCounter } from "../../src/core/cancel-limits.ts";
import { concatBytes, frontend, frontendMessage, textMessage } from "../../src/core/pg-wire.ts";
import { Fifo, takeBytes, takeWhole, WireLedger } from "../../src/core/wire-buffers.ts";
import {
  AckMeter,
  AnswerBudget,
  ackFrame,
  CreditWindow,
  LifetimeBudget,
  PipelineGate,
  parseControlFrame,
  parseWireBounds,
  wireBounds,
} from "../../src/core/wire-flow.ts";
import { isFrameProblem, MessageReader, maxFramesPerMessage } from "../../src/core/wire-reassembly.ts";

const settings = {
  maxBodyBytes: 4096,
  wireBufferBytes: 8192,
  wireDrainMs: 1000,
  wireMaxLifetimeMs: 60_000,
  wireMaxFrames: 100,
};

describe("credit on Lessor's own hop", () => {
  it("a receiver that holds nothing back never keeps the sender waiting; at most a window is ever out", () => {
    const bounds = { ...wireBounds(settings), frameBytes: 512, ackBytes: 512 };
    const window = bounds.maxCycleBytes + bounds.ackBytes + bounds.frameBytes;
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: bounds.maxCycleBytes - 6 }), { minLength: 1, maxLength: 12 }),
        fc.array(fc.integer({ min: 16, max: bounds.frameBytes }), { minLength: 1, maxLength: 50 }),
        (sizes, frameSizes) => {
          const stream = concatBytes(sizes.map((size) => textMessage(frontend.query, "q".repeat(size))));
          const sender = new CreditWindow(window);
          const meter = new AckMeter(bounds.ackBytes);
          const reader = new MessageReader(bounds.maxCycleBytes);
          let sent = 0;
          let taken = 0;
          let frame = 0;
          for (let steps = 0; sent < stream.byteLength; steps++) {
            // The sender is stuck only if the receiver could not free it: that would be a deadlock.
            if (sender.room === 0) throw new Error(`the sender waits with ${sender.inFlight} out`);
            const want = frameSizes[frame++ % frameSizes.length] ?? 1;
            const size = Math.min(want, sender.room, stream.byteLength - sent);
            reader.push(stream.subarray(sent, sent + size));
            sender.sent(size);
            sent += size;
            if (sender.inFlight > window) throw new Error(`${sender.inFlight} out, past the window`);
            for (let next = reader.next(); next !== null; next = reader.next()) {
              if (isFrameProblem(next)) throw new Error(next.problem);
              taken += next.bytes.byteLength;
              const ack = meter.took(next.bytes.byteLength);
              if (ack > 0 && !sender.acked(ack)) throw new Error(`an ack of ${ack} refused`);
            }
            if (steps > 100_000) throw new Error("no progress");
          }
          expect(taken).toBe(stream.byteLength);
        },
      ),
      { numRuns: 100 },
    );
  });

  it("an acknowledgement of more than was sent is refused, and the window stays as it was", () => {
    const sender = new CreditWindow(100);
    sender.sent(40);
    expect(sender.acked(41)).toBe(false);
    expect(sender.acked(0)).toBe(false);
    expect(sender.inFlight).toBe(40);
    expect(sender.acked(40)).toBe(true);
    expect(sender.room).toBe(100);
    expect(sender.peak).toBe(40);
  });

  it("control frames: acknowledgements and the lifetime notice read back; anything else is none", () => {
    expect(parseControlFrame(ackFrame(65536))).toEqual({ kind: "ack", bytes: 65536 });
    expect(parseControlFrame("l")).toEqual({ kind: "lifetime" });
    for (const junk of ["a0", "a-1", "a", "a1e3", "x", "", "a99999999999999"])
      expect(parseControlFrame(junk)).toBeNull();
  });

  it("bounds cross to the edge and back; bounds that are not bounds are refused", () => {
    const bounds = wireBounds(settings);
    expect(parseWireBounds(JSON.stringify(bounds))).toEqual(bounds);
    expect(parseWireBounds(JSON.stringify({ ...bounds, upWindowBytes: -1 }))).toBeNull();
    expect(parseWireBounds(JSON.stringify({ ...bounds, drainMs: "soon" }))).toBeNull();
    expect(parseWireBounds("{")).toBeNull();
    expect(parseWireBounds(null)).toBeNull();
    // The up window lets a whole message, an acknowledgement and a frame through.
    expect(bounds.upWindowBytes).toBeGreaterThanOrEqual(
      bounds.maxCycleBytes + bounds.ackBytes + bounds.frameBytes,
    );
  });
});

describe("PipelineGate: what the server owes", () => {
  const sync = frontendMessage(frontend.sync, new Uint8Array(0));
  const parse = frontendMessage(frontend.parse, new Uint8Array(10));
  const bounds = { owedHighBytes: 1000, owedLowBytes: 500, maxOwedCycles: 4, maxCycleBytes: 5000 };

  it("never holds a message of a cycle already begun; holds a new cycle past the mark until answers bring it under the low mark", () => {
    const gate = new PipelineGate(bounds);
    const query = (bytes: number) => ({ type: frontend.query, bytes });
    expect(gate.decide(frontend.query, 600, false, false)).toBe("forward");
    gate.forwarded(frontend.query, 600, false);
    expect(gate.decide(frontend.query, 600, false, false)).toBe("forward");
    gate.forwarded(frontend.query, 600, false);
    expect(gate.owedBytes).toBe(1200);
    // Past the high mark: a new cycle waits.
    expect(gate.decide(query(10).type, 10, false, false)).toBe("hold");
    // A cycle begun goes on, whatever is owed.
    gate.forwarded(frontend.parse, parse.byteLength, false);
    expect(gate.atBoundary).toBe(false);
    expect(gate.decide(frontend.sync, sync.byteLength, false, true)).toBe("forward");
    gate.forwarded(frontend.sync, sync.byteLength, false);
    gate.answered();
    // 600 + the extended cycle owed: above the low mark, still held.
    expect(gate.decide(frontend.query, 10, false, false)).toBe("hold");
    gate.answered();
    expect(gate.owedBytes).toBe(parse.byteLength + sync.byteLength);
    expect(gate.decide(frontend.query, 10, false, false)).toBe("forward");
  });

  it("holds a new cycle while the client's side is behind, even with nothing owed; COPY data goes on", () => {
    const gate = new PipelineGate(bounds);
    expect(gate.decide(frontend.query, 10, false, true)).toBe("hold");
    gate.forwarded(frontend.query, 10, false);
    expect(gate.decide(frontend.copyData, 4000, true, true)).toBe("forward");
    gate.forwarded(frontend.copyData, 4000, true);
    expect(gate.owedBytes).toBe(4010);
    gate.answered();
    expect(gate.owedBytes).toBe(0);
  });

  it("refuses a cycle larger than the bound; counts cycles against their own bound", () => {
    const gate = new PipelineGate(bounds);
    expect(gate.decide(frontend.query, 5001, false, false)).toBe("refuse");
    gate.forwarded(frontend.parse, 4990, false);
    expect(gate.decide(frontend.bind, 20, false, false)).toBe("refuse");
    const cycles = new PipelineGate({ ...bounds, owedHighBytes: 1 << 30 });
    for (let i = 0; i < 4; i++) {
      expect(cycles.decide(frontend.query, 5, false, false)).toBe("forward");
      cycles.forwarded(frontend.query, 5, false);
    }
    expect(cycles.owedCycles).toBe(4);
    expect(cycles.decide(frontend.query, 5, false, false)).toBe("hold");
    cycles.answered();
    cycles.answered();
    expect(cycles.decide(frontend.query, 5, false, false)).toBe("forward");
  });

  it("owes exactly what was sent and not answered, for any run of sends and answers", () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.oneof(
            fc.record({ kind: fc.constant("query" as const), bytes: fc.integer({ min: 5, max: 900 }) }),
            fc.record({ kind: fc.constant("answer" as const) }),
          ),
          { maxLength: 200 },
        ),
        (steps) => {
          const gate = new PipelineGate(bounds);
          const owed: number[] = [];
          for (const step of steps) {
            if (step.kind === "answer") {
              gate.answered();
              owed.shift();
            } else if (gate.decide(frontend.query, step.bytes, false, false) === "forward") {
              gate.forwarded(frontend.query, step.bytes, false);
              owed.push(step.bytes);
            }
            expect(gate.owedCycles).toBe(owed.length);
            expect(gate.owedBytes).toBe(owed.reduce((a, b) => a + b, 0));
            // Forwarding stops at the marks: never more than a cycle past either.
            expect(gate.owedBytes).toBeLessThan(bounds.owedHighBytes + 900);
            expect(gate.owedCycles).toBeLessThanOrEqual(bounds.maxOwedCycles);
          }
        },
      ),
    );
  });
});

describe("the answer bound of one pipeline", () => {
  it("answers count together while anything is outstanding, and start again once nothing is", () => {
    const budget = new AnswerBudget(1000);
    expect(budget.add(600)).toBe(true);
    budget.settle(true);
    expect(budget.add(600)).toBe(false);
    budget.settle(false);
    expect(budget.add(999)).toBe(true);
  });
});

describe("lifetime", () => {
  it("spent by frames or by time, whichever first; overdrawn at twice the frames", () => {
    const life = new LifetimeBudget({ lifetimeMs: 1000, lifetimeFrames: 3 }, 0);
    expect(life.spent(999)).toBeNull();
    expect(life.spent(1000)).toBe("time");
    expect(life.relayed(2)).toBe(false);
    expect(life.relayed(1)).toBe(true);
    expect(life.spent(0)).toBe("frames");
    expect(life.overdrawn).toBe(false);
    life.relayed(3);
    expect(life.overdrawn).toBe(true);
  });
});

describe("queues and frames", () => {
  it("Fifo behaves as an array's push and shift, at a constant cost", () => {
    fc.assert(
      fc.property(fc.array(fc.oneof(fc.nat(), fc.constant(-1)), { maxLength: 500 }), (ops) => {
        const fifo = new Fifo<number>();
        const model: number[] = [];
        for (const op of ops) {
          if (op < 0) expect(fifo.shift()).toBe(model.shift());
          else {
            fifo.push(op);
            model.push(op);
          }
          expect(fifo.size).toBe(model.length);
          expect(fifo.peek()).toBe(model[0]);
        }
        expect(fifo.takeAll()).toEqual(model);
        expect(fifo.size).toBe(0);
      }),
    );
  });

  it("takeWhole: frames end between parts unless a part is larger than a frame; nothing is lost or reordered", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 300 }), { minLength: 1, maxLength: 40 }),
        fc.array(fc.integer({ min: 1, max: 200 }), { minLength: 1, maxLength: 20 }),
        (sizes, rooms) => {
          const frameBytes = 128;
          const parts = sizes.map((size, i) => new Uint8Array(size).fill(i % 251));
          const queue = new Fifo<Uint8Array>();
          for (const part of parts) queue.push(part);
          const frames: Uint8Array[] = [];
          const ends = new Set<number>();
          let at = 0;
          for (const part of parts) {
            at += part.byteLength;
            ends.add(at);
          }
          let sent = 0;
          for (let i = 0; queue.size > 0; i++) {
            const room = Math.max(rooms[i % rooms.length] ?? 1, frameBytes);
            const next = takeWhole(queue, Math.min(room, frameBytes), frameBytes);
            if (next === null) throw new Error("a frame-sized room took nothing");
            expect(next.bytes.byteLength).toBeLessThanOrEqual(frameBytes);
            frames.push(next.bytes);
            sent += next.bytes.byteLength;
            if (!next.cut) expect(ends.has(sent)).toBe(true);
          }
          expect([...concatBytes(frames)]).toEqual([...concatBytes(parts)]);
        },
      ),
    );
  });

  it("takeWhole waits for room rather than cut a part that fits a frame", () => {
    const queue = new Fifo<Uint8Array>();
    queue.push(new Uint8Array(100));
    expect(takeWhole(queue, 50, 128)).toBeNull();
    expect(takeWhole(queue, 100, 128)?.bytes.byteLength).toBe(100);
  });

  it("takeBytes takes exactly what it is asked, in order", () => {
    const queue = new Fifo<Uint8Array>();
    for (const part of [[1, 2], [3], [4, 5, 6]]) queue.push(new Uint8Array(part));
    expect([...takeBytes(queue, 4)]).toEqual([1, 2, 3, 4]);
    expect([...takeBytes(queue, 2)]).toEqual([5, 6]);
    expect(queue.size).toBe(0);
  });
});

describe("a message's frames are bounded", () => {
  it("a message spread over more frames than its length allows is refused; within it, read", () => {
    const message = textMessage(frontend.query, "x".repeat(10_000));
    const allowed = maxFramesPerMessage(message.byteLength);
    const inPieces = (count: number) => {
      const reader = new MessageReader(1 << 20, false, true);
      const step = Math.ceil(message.byteLength / count);
      let result: ReturnType<MessageReader["next"]> = null;
      for (let at = 0; at < message.byteLength; at += step) {
        reader.push(message.subarray(at, at + step));
        result = reader.next();
        if (result !== null) break;
      }
      return result;
    };
    const within = inPieces(allowed);
    expect(within !== null && !isFrameProblem(within) && within.bytes.byteLength).toBe(message.byteLength);
    expect(inPieces(message.byteLength)).toMatchObject({
      problem: "fragmented",
      declared: message.byteLength,
    });
  });

  it("without the frame bound (the server's side), any split is read", () => {
    const message = textMessage(frontend.query, "y".repeat(3000));
    const reader = new MessageReader(1 << 20);
    for (const byte of message) reader.push(new Uint8Array([byte]));
    const read = reader.next();
    expect(read !== null && !isFrameProblem(read) && read.bytes.byteLength).toBe(message.byteLength);
    expect(reader.copiedBytes).toBe(message.byteLength);
  });
});

describe("counts", () => {
  it("the ledger sums the live connections, keeps the peaks, and keeps a bounded number of ended ones", () => {
    const ledger = new WireLedger(2);
    const a = ledger.open(1);
    const b = ledger.open(2);
    a.set("toServerEdge", 10);
    a.set("toServerEdge", 4);
    b.set("toServerEdge", 5);
    expect(ledger.totals().toServerEdge).toBe(9);
    expect(ledger.find(1)).toMatchObject({
      now: { toServerEdge: 4 },
      peak: { toServerEdge: 10 },
      ended: false,
    });
    a.set("toServerEdge", 0);
    ledger.close(a);
    expect(ledger.size).toBe(1);
    expect(ledger.find(1)).toMatchObject({ now: { toServerEdge: 0 }, ended: true });
    for (let pid = 3; pid < 6; pid++) ledger.close(ledger.open(pid));
    expect(ledger.find(1)).toBeNull();
  });

  it("WindowCounter: a key's events past its limit in a window are refused; a new window starts over; keys are bounded", () => {
    const counter = new WindowCounter(3, 1000, 100);
    for (let i = 0; i < 3; i++) expect(counter.admit("a", 0)).toBe(true);
    expect(counter.admit("a", 999)).toBe(false);
    expect(counter.admit("b", 999)).toBe(true);
    expect(counter.admit("a", 1000)).toBe(true);
    for (let i = 0; i < 1000; i++) counter.admit(`k${i}`, 2000);
    expect(counter.size).toBeLessThanOrEqual(100);
  });
});
