/**
 * Servers that speak just enough of Postgres's startup to be refused (test/integration/
 * tcp-path.test.ts, docs/adr/027-direct-tcp-path.md), on loopback:
 * - `noTls`: answers the SSLRequest with `N`, as a server without TLS does;
 * - `untrusted`: answers `S`, then TLS with a `localhost` certificate no trust store holds;
 * - `cleartext` / `md5`: answers `S`, TLS with the trusted local certificate, then asks for the
 *   password in cleartext (or MD5), and counts every password message that arrives.
 * Every server also counts the bytes that arrived before TLS, beyond the SSLRequest (a plaintext
 * startup message would show there). `GET /stats` on the control URL answers the counts.
 */
import { readFileSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { createServer } from "node:net";
import { TLSSocket } from "node:tls";
import type { LocalTls } from "../local/tls.ts";

export type FakeMode = "noTls" | "untrusted" | "cleartext" | "md5";

export interface FakePostgresStats {
  connections: number;
  /** Bytes received before TLS other than the 8 of an SSLRequest. */
  plaintextBytes: number;
  /** Password messages ('p') received. */
  passwords: number;
}

export interface FakePostgres {
  /** Port per mode, all on 127.0.0.1. */
  ports: Record<FakeMode, number>;
  controlUrl: string;
  close(): Promise<void>;
}

const modes: FakeMode[] = ["noTls", "untrusted", "cleartext", "md5"];

export async function startFakePostgres(tls: LocalTls): Promise<FakePostgres> {
  const stats: Record<FakeMode, FakePostgresStats> = Object.fromEntries(
    modes.map((mode) => [mode, { connections: 0, plaintextBytes: 0, passwords: 0 }]),
  ) as Record<FakeMode, FakePostgresStats>;
  const sockets = new Set<Socket>();
  const servers = modes.map((mode) =>
    createServer((socket) => {
      sockets.add(socket);
      socket.on("close", () => sockets.delete(socket));
      socket.on("error", () => socket.destroy());
      stats[mode].connections++;
      let received = Buffer.alloc(0);
      const onPlain = (chunk: Buffer) => {
        received = Buffer.concat([received, chunk]);
        if (received.length < 8) return;
        const isSslRequest = received.readInt32BE(0) === 8 && received.readInt32BE(4) === 80877103;
        if (!isSslRequest) {
          stats[mode].plaintextBytes += received.length;
          socket.destroy();
          return;
        }
        stats[mode].plaintextBytes += received.length - 8;
        socket.removeListener("data", onPlain);
        if (mode === "noTls") {
          socket.write("N");
          // A real server would now read a plaintext startup; count what comes.
          socket.on("data", (more: Buffer) => {
            stats[mode].plaintextBytes += more.length;
          });
          return;
        }
        socket.write("S");
        const trusted = mode !== "untrusted";
        const secure = new TLSSocket(socket, {
          isServer: true,
          cert: readFileSync(trusted ? tls.certFile : tls.untrustedCertFile),
          key: readFileSync(trusted ? tls.keyFile : tls.untrustedKeyFile),
        });
        secure.on("error", () => socket.destroy());
        let inside = Buffer.alloc(0);
        let startupSeen = false;
        secure.on("data", (chunk: Buffer) => {
          inside = Buffer.concat([inside, chunk]);
          for (;;) {
            if (!startupSeen) {
              if (inside.length < 4) return;
              const length = inside.readInt32BE(0);
              if (inside.length < length) return;
              inside = inside.subarray(length);
              startupSeen = true;
              // AuthenticationCleartextPassword (3) or AuthenticationMD5Password (5, with a salt).
              secure.write(
                mode === "md5"
                  ? Buffer.from([0x52, 0, 0, 0, 12, 0, 0, 0, 5, 1, 2, 3, 4])
                  : Buffer.from([0x52, 0, 0, 0, 8, 0, 0, 0, 3]),
              );
              continue;
            }
            if (inside.length < 5) return;
            const length = inside.readInt32BE(1);
            if (inside.length < length + 1) return;
            if (inside[0] === 0x70) stats[mode].passwords++;
            inside = inside.subarray(length + 1);
          }
        });
      };
      socket.on("data", onPlain);
    }),
  );
  await Promise.all(
    servers.map((server) => new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()))),
  );
  const control = createHttpServer((_request, response) => {
    response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(stats));
  });
  await new Promise<void>((resolve) => control.listen(0, "127.0.0.1", () => resolve()));
  return {
    ports: Object.fromEntries(
      modes.map((mode, i) => [mode, (servers[i]?.address() as AddressInfo | undefined)?.port ?? 0]),
    ) as Record<FakeMode, number>,
    controlUrl: `http://127.0.0.1:${(control.address() as AddressInfo).port}`,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await Promise.all(
        [...servers, control].map((server) => new Promise<void>((resolve) => server.close(() => resolve()))),
      );
    },
  };
}
