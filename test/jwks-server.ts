/**
 * A loopback JWKS host for the JWT tests: what an identity provider publishes at its JWKS URL.
 * Tests inside workerd publish a key set under a name (`PUT /jwks/<name>`), point a tenant's
 * `jwksUrl` at `GET /jwks/<name>`, and read how often Lessor fetched it (`GET /hits/<name>`).
 */
import { createServer, type Server } from "node:http";

export interface JwksServer {
  url: string;
  close(): Promise<void>;
}

export async function startJwksServer(): Promise<JwksServer> {
  const sets = new Map<string, string>();
  const hits = new Map<string, number>();
  const server: Server = createServer((request, response) => {
    const [, kind, name = ""] = (request.url ?? "").split("/");
    const reply = (status: number, body: string) => {
      response.writeHead(status, { "content-type": "application/json" });
      response.end(body);
    };
    if (kind === "jwks" && request.method === "PUT") {
      let body = "";
      request.on("data", (chunk: Buffer) => {
        body += chunk.toString("utf8");
      });
      request.on("end", () => {
        sets.set(name, body);
        reply(204, "");
      });
      return;
    }
    if (kind === "jwks" && request.method === "GET") {
      hits.set(name, (hits.get(name) ?? 0) + 1);
      const set = sets.get(name);
      reply(set === undefined ? 404 : 200, set ?? "{}");
      return;
    }
    if (kind === "hits") {
      reply(200, JSON.stringify({ hits: hits.get(name) ?? 0 }));
      return;
    }
    reply(404, "{}");
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("JWKS server has no port");
  return {
    url: `http://127.0.0.1:${address.port}`,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}
