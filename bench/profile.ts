/**
 * A V8 CPU profile of the Worker's isolate (the Worker and its Durable Objects) while one path runs,
 * taken through wrangler dev's inspector, and summarised by where the code came from: Lessor's
 * src/, Hono, the Neon driver, the bench Worker, or the runtime itself. The bundle's source map
 * turns bundle positions back into source files.
 */
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import type { WebSocket as WebSocketType } from "ws";
import { within } from "./processes.ts";

// Loaded through createRequire, as local/wsproxy.ts does: the package's ESM entry is a wrapper.
const require = createRequire(import.meta.url);
const { WebSocket } = require("ws") as typeof import("ws");

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
  columnNumber: number;
}

interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  hitCount?: number;
}

/** The Chrome DevTools `Profiler.Profile` (as written to a .cpuprofile file). */
export interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples?: number[];
  timeDeltas?: number[];
}

/** A DevTools protocol session over the inspector's WebSocket. */
class InspectorSession {
  private nextId = 0;
  private readonly pending = new Map<
    number,
    { done: (value: unknown) => void; fail: (error: Error) => void }
  >();

  private readonly socket: WebSocketType;

  private constructor(socket: WebSocketType) {
    this.socket = socket;
    socket.on("message", (data: Buffer) => {
      const message = JSON.parse(data.toString()) as {
        id?: number;
        result?: unknown;
        error?: { message?: string };
      };
      // wrangler's inspector proxy answers with the request's fields merged in, and drops an empty
      // `result`: any message with the id of a pending call is its answer.
      if (message.id === undefined) return;
      const waiter = this.pending.get(message.id);
      if (!waiter) return;
      this.pending.delete(message.id);
      if (message.error) waiter.fail(new Error(`inspector: ${message.error.message ?? "error"}`));
      else waiter.done(message.result);
    });
    socket.on("close", () => {
      for (const waiter of this.pending.values()) waiter.fail(new Error("inspector closed"));
      this.pending.clear();
    });
  }

  static async open(url: string): Promise<InspectorSession> {
    const socket = new WebSocket(url);
    await within(
      new Promise<void>((done, fail) => {
        socket.once("open", () => done());
        socket.once("error", fail);
      }),
      10_000,
      "inspector connect",
    );
    return new InspectorSession(socket);
  }

  call(method: string, params: Record<string, unknown> = {}): Promise<unknown> {
    const id = ++this.nextId;
    const answer = new Promise<unknown>((done, fail) => this.pending.set(id, { done, fail }));
    this.socket.send(JSON.stringify({ id, method, params }));
    return within(answer, 30_000, `inspector ${method}`);
  }

  close(): void {
    this.socket.close();
  }
}

/** Runs `work` with the sampling profiler on, and returns the profile. */
export async function profileWhile(inspectorUrl: string, work: () => Promise<void>): Promise<CpuProfile> {
  const session = await InspectorSession.open(inspectorUrl);
  try {
    await session.call("Profiler.enable");
    await session.call("Profiler.setSamplingInterval", { interval: 100 });
    await session.call("Profiler.start");
    let failure: { error: unknown } | null = null;
    try {
      await work();
    } catch (error) {
      failure = { error };
    }
    const stopped = (await session.call("Profiler.stop")) as { profile?: CpuProfile };
    if (failure) throw failure.error;
    if (!stopped.profile) throw new Error("the profiler returned no profile");
    return stopped.profile;
  } finally {
    session.close();
  }
}

// ── Source map ───────────────────────────────────────────────────────────────────────────────────

const base64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/** Source file of each generated position, from a version 3 source map. */
export class SourceMap {
  private readonly lines: number[][][] = [];
  private readonly sources: string[];

  constructor(path: string) {
    const map = JSON.parse(readFileSync(path, "utf8")) as { sources: string[]; mappings: string };
    this.sources = map.sources;
    let source = 0;
    let sourceLine = 0;
    let sourceColumn = 0;
    for (const line of map.mappings.split(";")) {
      const segments: number[][] = [];
      let column = 0;
      for (const segment of line.split(",")) {
        if (!segment) continue;
        const fields = decodeVlq(segment);
        column += fields[0] ?? 0;
        if (fields.length >= 4) {
          source += fields[1] ?? 0;
          sourceLine += fields[2] ?? 0;
          sourceColumn += fields[3] ?? 0;
          segments.push([column, source, sourceLine, sourceColumn]);
        }
      }
      this.lines.push(segments);
    }
  }

  /** The source file and 1-based line of a 0-based generated position, if mapped. */
  lookup(line: number, column: number): { source: string; line: number } | null {
    const segments = this.lines[line];
    if (!segments || segments.length === 0) return null;
    let found: number[] | undefined;
    for (const segment of segments) {
      if ((segment[0] ?? 0) > column) break;
      found = segment;
    }
    found ??= segments[0];
    const source = found ? this.sources[found[1] ?? -1] : undefined;
    return source && found ? { source, line: (found[2] ?? 0) + 1 } : null;
  }
}

function decodeVlq(segment: string): number[] {
  const values: number[] = [];
  let value = 0;
  let shift = 0;
  for (const char of segment) {
    const digit = base64.indexOf(char);
    value += (digit & 31) << shift;
    if (digit & 32) {
      shift += 5;
      continue;
    }
    values.push(value & 1 ? -(value >>> 1) : value >>> 1);
    value = 0;
    shift = 0;
  }
  return values;
}

// ── Summary ──────────────────────────────────────────────────────────────────────────────────────

export interface ProfileSummary {
  requests: number;
  /** Sampled wall time of the isolate, and the part of it that was not idle. */
  sampledMs: number;
  busyMs: number;
  /** Busy milliseconds per request, by where the code came from. */
  msPerRequestBySource: Record<string, number>;
  /** The functions with the most self time, per request. */
  top: { fn: string; source: string; msPerRequest: number }[];
}

/** Where a source file belongs, for the summary. */
function category(source: string | null, frame: CallFrame): string {
  if (frame.functionName === "(garbage collector)") return "V8 garbage collector";
  if (frame.functionName === "(program)") return "V8/runtime (program)";
  if (!source) return frame.url ? "bundle (unmapped)" : "runtime built-ins (Response, URL, streams, …)";
  if (source.includes("node_modules/hono/")) return "hono";
  if (source.includes("node_modules/@neondatabase/")) return "Neon driver";
  if (source.includes("node_modules/drizzle-orm/")) return "drizzle-orm";
  if (source.includes("node_modules/")) return "other npm packages";
  if (/(^|\/)bench\//.test(source)) return "bench Worker";
  if (/(^|\/)src\//.test(source)) return "Lessor src/";
  return "other";
}

function shortSource(source: string): string {
  const at = source.search(/(node_modules\/|src\/|bench\/)/);
  return at >= 0 ? source.slice(at) : source;
}

export function summarise(profile: CpuProfile, map: SourceMap | null, requests: number): ProfileSummary {
  const selfUs = new Map<number, number>();
  const samples = profile.samples ?? [];
  const deltas = profile.timeDeltas ?? [];
  // The time between a sample and the next belongs to that sample's function.
  for (let i = 0; i < samples.length; i++) {
    const node = samples[i];
    const delta = deltas[i + 1] ?? 0;
    if (node !== undefined) selfUs.set(node, (selfUs.get(node) ?? 0) + Math.max(0, delta));
  }
  const bySource: Record<string, number> = {};
  const byFunction = new Map<string, { fn: string; source: string; us: number }>();
  let sampledUs = 0;
  let busyUs = 0;
  for (const node of profile.nodes) {
    const us = selfUs.get(node.id) ?? 0;
    sampledUs += us;
    const frame = node.callFrame;
    if (frame.functionName === "(idle)" || frame.functionName === "(root)") continue;
    busyUs += us;
    const mapped = frame.url && map ? map.lookup(frame.lineNumber, frame.columnNumber) : null;
    const where = category(mapped?.source ?? null, frame);
    bySource[where] = (bySource[where] ?? 0) + us;
    const source = mapped ? `${shortSource(mapped.source)}:${mapped.line}` : frame.url || "(native)";
    const fn = frame.functionName || "(anonymous)";
    const key = `${fn} ${source}`;
    const entry = byFunction.get(key) ?? { fn, source, us: 0 };
    entry.us += us;
    byFunction.set(key, entry);
  }
  const perRequest = (us: number) => (requests ? us / 1000 / requests : 0);
  return {
    requests,
    sampledMs: sampledUs / 1000,
    busyMs: busyUs / 1000,
    msPerRequestBySource: Object.fromEntries(
      Object.entries(bySource)
        .sort((a, b) => b[1] - a[1])
        .map(([key, us]) => [key, perRequest(us)]),
    ),
    top: [...byFunction.values()]
      .sort((a, b) => b.us - a.us)
      .slice(0, 15)
      .map((entry) => ({ fn: entry.fn, source: entry.source, msPerRequest: perRequest(entry.us) })),
  };
}
