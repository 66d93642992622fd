/**
 * The local stack's TLS (docs/adr/027-direct-tcp-path.md): a certificate authority made on this
 * machine, the local Postgres's server certificate signed by it for `localhost` (and only that
 * name: `127.0.0.1` is a wrong name for it, which the tests use), and a self-signed `localhost`
 * certificate that nothing trusts (the tests' untrusted server). Made with `openssl` on first use
 * under `.lessor/tls/` (git-ignored), never committed, reused after.
 *
 * workerd trusts the authority through `NODE_EXTRA_CA_CERTS`: miniflare reads the file named there,
 * once, when it is loaded, into the trusted certificates of workerd's outbound network, against
 * which `connect()`'s STARTTLS verifies. `npm start` and the tests set it (local/start.ts,
 * vitest.config.ts) before miniflare loads.
 */
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";

/** The files of the local TLS. */
export interface LocalTls {
  /** The authority's certificate (PEM): what `NODE_EXTRA_CA_CERTS` names. */
  caFile: string;
  /** The server certificate for `localhost`, signed by the authority. */
  certFile: string;
  keyFile: string;
  /** A self-signed certificate for `localhost` that no trust store holds. */
  untrustedCertFile: string;
  untrustedKeyFile: string;
}

/** The host name the local server certificate names (and only it). */
export const localTlsHostname = "localhost";

/** The default folder of the local TLS files. */
export const localTlsDir = resolve(import.meta.dirname, "../.lessor/tls");

/** The local TLS files under `dir`, made if missing (idempotent; made in a scratch folder, then moved). */
export function ensureLocalTls(dir = localTlsDir): LocalTls {
  const files = (base: string): LocalTls => ({
    caFile: resolve(base, "ca.pem"),
    certFile: resolve(base, "server.pem"),
    keyFile: resolve(base, "server.key"),
    untrustedCertFile: resolve(base, "untrusted.pem"),
    untrustedKeyFile: resolve(base, "untrusted.key"),
  });
  const tls = files(dir);
  if (Object.values(tls).every((file) => existsSync(file))) return tls;
  const scratch = `${dir}.${process.pid}.tmp`;
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  const made = files(scratch);
  const caKey = resolve(scratch, "ca.key");
  const csr = resolve(scratch, "server.csr");
  const ext = resolve(scratch, "server.ext");
  const run = (...args: string[]) => execFileSync("openssl", args, { stdio: "ignore" });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  // The authority (ten years: a local machine's, never a deployment's).
  run(
    "req",
    "-x509",
    ...ec,
    "-days",
    "3650",
    "-subj",
    "/CN=Lessor local CA",
    "-keyout",
    caKey,
    "-out",
    made.caFile,
  );
  // The server's certificate, for localhost only.
  run("req", ...ec, "-subj", `/CN=${localTlsHostname}`, "-keyout", made.keyFile, "-out", csr);
  writeFileSync(
    ext,
    `basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:${localTlsHostname}\n`,
  );
  run(
    "x509",
    "-req",
    "-in",
    csr,
    "-CA",
    made.caFile,
    "-CAkey",
    caKey,
    "-CAcreateserial",
    "-days",
    "3650",
    "-extfile",
    ext,
    "-out",
    made.certFile,
  );
  // The untrusted one: self-signed, same name.
  run(
    "req",
    "-x509",
    ...ec,
    "-days",
    "3650",
    "-subj",
    `/CN=${localTlsHostname}`,
    "-addext",
    `subjectAltName=DNS:${localTlsHostname}`,
    "-keyout",
    made.untrustedKeyFile,
    "-out",
    made.untrustedCertFile,
  );
  // The authority's key is not needed again: nothing else is ever signed with it.
  rmSync(caKey, { force: true });
  mkdirSync(resolve(dir, ".."), { recursive: true });
  // A folder with some of the files gone is made again whole.
  if (existsSync(dir) && !Object.values(tls).every((file) => existsSync(file))) {
    rmSync(dir, { recursive: true, force: true });
  }
  try {
    renameSync(scratch, dir);
  } catch {
    // Another process made them first: keep theirs.
    rmSync(scratch, { recursive: true, force: true });
  }
  return tls;
}
