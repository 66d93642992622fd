/**
 * `cloudflare:sockets` for the unit tests, which run in Node, not workerd: they import modules that
 * import it (src/postgres/socket.ts) but never open a TCP path. Connecting fails, loudly.
 */
export function connect(): never {
  throw new Error("cloudflare:sockets is workerd's: the unit tests open no TCP path");
}
