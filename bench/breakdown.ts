/**
 * Where the Worker isolate's time goes on Lessor's `/sql` path, split into the parts a reader asks
 * about: the Worker's own routing and auth, the call into the tenant's object (where RPC's
 * serialisation lands: it is native code, sampled under its JavaScript caller or as "program"), the
 * object's own work, the Neon driver, and the runtime. Finer than profile.ts's summary, which groups
 * by package only; it reads the same profiles and source maps.
 */
import type { CpuProfile, SourceMap } from "./profile.ts";

export interface Breakdown {
  requests: number;
  /** Busy (not idle) sampled milliseconds of the isolate. */
  busyMs: number;
  /** Share of busy time, by part (0–1), largest first. */
  shares: Record<string, number>;
}

/** The part a sampled frame belongs to. */
export function partOf(source: string | null, functionName: string, url: string): string {
  if (functionName === "(garbage collector)") return "V8 garbage collector";
  if (functionName === "(program)") return "runtime: native, not attributed (program)";
  if (!source) return url ? "bundle (unmapped)" : "runtime built-ins (Response, streams, fetch, crypto, …)";
  if (source.includes("node_modules/hono/")) return "Worker: Hono";
  if (source.includes("node_modules/@neondatabase/")) return "Neon driver (in the object)";
  if (source.includes("node_modules/drizzle-orm/")) return "drizzle-orm";
  if (source.includes("node_modules/")) return "other npm packages";
  if (/(^|\/)bench\//.test(source)) return "bench Worker";
  // The one RPC of a /sql request (src/routes/sql-call.ts; before issue 42, campaigns/schema-version.ts).
  if (/(^|\/)src\/(routes\/sql-call|campaigns\/schema-version)/.test(source))
    return "Worker → object call (callSql: RPC stub, serialisation)";
  if (/(^|\/)src\/(routes|app\.ts|crypto|config|errors|core\/(connection-string|neon-protocol))/.test(source))
    return "Worker: Lessor routes, auth, errors";
  if (/(^|\/)src\/(tenant-object|core\/lifecycle|usage|tenant-context|postgres)/.test(source))
    return "TenantObject: auth check, lease, lifecycle, usage";
  return "Lessor src/ (other)";
}

/** Shares of the isolate's busy time by part. */
export function breakdown(profile: CpuProfile, map: SourceMap | null, requests: number): Breakdown {
  const selfUs = new Map<number, number>();
  const samples = profile.samples ?? [];
  const deltas = profile.timeDeltas ?? [];
  for (let i = 0; i < samples.length; i++) {
    const node = samples[i];
    const delta = deltas[i + 1] ?? 0;
    if (node !== undefined) selfUs.set(node, (selfUs.get(node) ?? 0) + Math.max(0, delta));
  }
  const byPart: Record<string, number> = {};
  let busyUs = 0;
  for (const node of profile.nodes) {
    const us = selfUs.get(node.id) ?? 0;
    const frame = node.callFrame;
    if (frame.functionName === "(idle)" || frame.functionName === "(root)") continue;
    busyUs += us;
    const mapped = frame.url && map ? map.lookup(frame.lineNumber, frame.columnNumber) : null;
    const part = partOf(mapped?.source ?? null, frame.functionName, frame.url);
    byPart[part] = (byPart[part] ?? 0) + us;
  }
  return {
    requests,
    busyMs: busyUs / 1000,
    shares: Object.fromEntries(
      Object.entries(byPart)
        .sort((a, b) => b[1] - a[1])
        .map(([part, us]) => [part, busyUs ? us / busyUs : 0]),
    ),
  };
}
