/**
 * The driver `Client` classes Lessor's connections are made of: `SettlingClient` (an `end()` that
 * settles for a connection already cut, and SCRAM's client step in one native derivation), the
 * deployment's configured client, and the `TenantClient`, which mints its one-time login token
 * (src/crypto/login-guard.ts), starts with the session limits in its startup options, records the
 * parameters the server reports.
 */
import { Client } from "@neondatabase/serverless";
import type { LessorConfig } from "../config/index.ts";
import { type ScramClientSession, scramClientFinal } from "../crypto/scram.ts";
import { configure, countOpened, onTcpPath } from "./driver.ts";
import { startupOptions, type TenantConnectionOptions, tenantSessionSettings } from "./session-settings.ts";
import { HostTransportRefused } from "./socket.ts";

interface StartupConfigurable {
  getStartupConf(): Record<string, string>;
}

interface EndEmitter {
  once(event: "end", listener: () => void): void;
}

/**
 * Ends an idle connection the way Postgres sees it end: sends Terminate and waits (bounded) until
 * the server closes the socket, which it does once the backend has exited, so the backend is gone
 * from `pg_stat_activity` when this resolves (or the bound passed). The caller then releases it.
 */
export function terminateAndWait(client: object, timeoutMs = terminateBoundMs): Promise<void> {
  const ending = client as unknown as {
    _ending: boolean;
    _queryable: boolean;
    on(event: "error", listener: () => void): void;
    connection: {
      stream: { write(bytes: Uint8Array): boolean };
      once(event: "end", listener: () => void): void;
    };
  };
  // An end Lessor asked for: the driver must not report the server's close as an unexpected one,
  // nor write to the closed socket when the pool ends the client (it destroys a non-queryable one).
  ending._ending = true;
  ending._queryable = false;
  ending.on("error", () => undefined);
  const { connection } = ending;
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs);
    connection.once("end", () => {
      clearTimeout(timer);
      resolve();
    });
    // Terminate ('X', length 4): the server ends the session and closes the socket.
    connection.stream.write(new Uint8Array([0x58, 0, 0, 0, 4]));
  });
}

/** How long an end waits for the server to close after Terminate before it cuts the connection. */
export const terminateBoundMs = 2_000;

interface EndState {
  _ending: boolean;
  _connected: boolean;
  _queryable: boolean;
  activeQuery: unknown;
}

/**
 * The driver's `Client`, with an `end()` that is over only when the server says so, and that
 * settles when the connection has already ended.
 *
 * Lessor counts a connection as given back to its host's budget when its end settles, so the end
 * must be over only once the backend has left Postgres's count. Here an idle connection sends
 * Terminate and waits until the server closes it (`terminateAndWait`), which the server does once
 * the backend has exited; a backend slow to exit (one dropping a tenant's thousands of temporary
 * tables, one waiting on a lock to drop one) is waited for. The wait is bounded
 * (`terminateBoundMs`): past it the connection is cut, where the driver's own `end()` waited for a
 * server that never closed for ever (test/integration/end-waits-for-backend.test.ts). A busy or
 * broken connection is cut at once, as the driver does.
 *
 * And the driver's `end()` waits for the connection's `end` event, which a connection emits once:
 * when the host cut it first (a killed backend, a restart, a proxy that dropped a frozen tunnel),
 * that event came before, and `end()` never settles. A pool's end waits for every client's `end()`
 * to call back (src/postgres/index.ts `endPool`), so one such client left it pending for ever: the
 * generation never finished closing, and its budget allocation was never released (the chaos
 * soak's leak, issue 32; the sequence is test/integration/pool-end-after-cut.test.ts).
 */
/**
 * What Lessor knows of one of its connections, kept on the connection itself (`SettlingClient`'s
 * `state`), not in tables beside it: its transaction status, whether Lessor ends it on purpose, and
 * what the server reported at its start.
 */
export class ConnectionState {
  /** The last ReadyForQuery's status ('I' idle, 'T' in a transaction, 'E' failed); null until tracked. */
  transactionStatus: string | null = null;
  /** Lessor destroys this connection on purpose: its closing errors are expected, not news. */
  endedOnPurpose = false;
  /** The parameters the server reported (ParameterStatus); only a tenant connection records them. */
  serverParameters: Map<string, string> | null = null;
}

const foreignState = Symbol("lessor.connectionState");

/**
 * The state of `client`: a `SettlingClient`'s own; for any other object (a client Lessor did not
 * make, in a test), one kept on that object under a symbol of Lessor's.
 */
export function connectionState(client: object): ConnectionState {
  if (client instanceof SettlingClient) return client.state;
  const holder = client as { [foreignState]?: ConnectionState };
  holder[foreignState] ??= new ConnectionState();
  return holder[foreignState];
}

export class SettlingClient extends Client {
  private connectionEnded = false;
  /** What Lessor knows of this connection (connection-state.ts reads and writes it). */
  readonly state = new ConnectionState();

  /**
   * SCRAM's client-final step with the platform's PBKDF2 in one call, and the salted password kept
   * for the pool's next connection (src/crypto/scram.ts `scramClientFinal`), where the driver spent
   * about 15 ms of the isolate's CPU per connection. A failure ends the connect as the driver's own
   * would, through the connection's error.
   */
  override async _handleAuthSASLContinue(message: { data?: unknown }): Promise<void> {
    const connection = (this as unknown as { connection: SaslConnection }).connection;
    try {
      await scramClientFinal(this.saslSession as ScramClientSession, this.password, message.data);
      connection.sendSCRAMClientFinalMessage((this.saslSession as ScramClientSession).response ?? "");
    } catch (error) {
      connection.emit("error", error instanceof Error ? error : new Error("SASL: login failed"));
    }
  }

  /**
   * Over TCP only SCRAM logs in (docs/adr/027): a server asking for the password in cleartext or as
   * MD5 is refused before a byte of it is sent (`host_auth_refused`), and the connection is cut.
   * Neon's WebSocket endpoint takes the cleartext password by design (the pipelined connect), so the
   * WebSocket path keeps the driver's own answer.
   */
  override _handleAuthCleartextPassword = (message?: unknown): void => {
    if (onTcpPath(this)) {
      this.refusePasswordMethod("cleartext");
      return;
    }
    (Client.prototype as unknown as PasswordHandlers)._handleAuthCleartextPassword.call(this, message);
  };

  _handleAuthMD5Password = (message?: unknown): void => {
    if (onTcpPath(this)) {
      this.refusePasswordMethod("MD5");
      return;
    }
    (Client.prototype as unknown as PasswordHandlers)._handleAuthMD5Password.call(this, message);
  };

  private refusePasswordMethod(method: string): void {
    const connection = (this as unknown as { connection: SaslConnection & { stream: { destroy(): void } } })
      .connection;
    connection.emit(
      "error",
      new HostTransportRefused(
        "host_auth_refused",
        `host ${this.host} asked for the password in ${method}; Lessor logs in over TCP with SCRAM-SHA-256 only`,
      ),
    );
    connection.stream.destroy();
  }

  constructor(config?: ConstructorParameters<typeof Client>[0]) {
    super(config);
    (this as unknown as { connection: EndEmitter }).connection.once("end", () => {
      this.connectionEnded = true;
    });
  }

  override end(): Promise<void>;
  override end(callback: (err?: Error) => void): void;
  override end(callback?: (err?: Error) => void): Promise<void> | void {
    const state = this as unknown as EndState;
    if (
      !this.connectionEnded &&
      state._connected &&
      state._queryable &&
      !state._ending &&
      !state.activeQuery
    ) {
      // Ended on the server's word; past the bound the socket is cut (its close follows on its own).
      const ended = terminateAndWait(this).then(() => {
        if (!this.connectionEnded)
          (this as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy();
      });
      if (!callback) return ended;
      ended.then(
        () => callback(),
        (error: unknown) => callback(error instanceof Error ? error : new Error("end failed")),
      );
      return;
    }
    if (!this.connectionEnded) return callback ? super.end(callback) : super.end();
    // Nothing is left to close: the socket is gone, and the driver would wait for its end for ever.
    (this as unknown as { _ending: boolean })._ending = true;
    if (!callback) return Promise.resolve();
    queueMicrotask(() => callback());
  }
}

interface PasswordHandlers {
  _handleAuthCleartextPassword(message: unknown): void;
  _handleAuthMD5Password(message: unknown): void;
}

interface SaslConnection {
  sendSCRAMClientFinalMessage(response: string): void;
  emit(event: "error", error: Error): void;
}

/** A `SettlingClient` class whose connections carry this deployment's driver settings. */
export function configuredClientClass(config: LessorConfig): typeof SettlingClient {
  return class ConfiguredClient extends SettlingClient {
    constructor(clientConfig?: ConstructorParameters<typeof Client>[0]) {
      super(clientConfig);
      configure(this, config);
    }
  };
}

/**
 * The parameters the server reported when the connection started (ParameterStatus: its version,
 * encoding, date style, time zone, …), as a tenant connection recorded them; empty for any other.
 */
export function serverParameters(client: object): ReadonlyMap<string, string> {
  return connectionState(client).serverParameters ?? new Map();
}

/**
 * Records a parameter the server reported where the driver did not see it (the pipelined reset's
 * answer, read off the wire: src/tenant-object/execute.ts); only a tenant connection keeps them.
 */
export function noteServerParameter(client: object, name: string, value: string): void {
  connectionState(client).serverParameters?.set(name, value);
}

interface ParameterSource {
  on(
    event: "parameterStatus",
    listener: (message: { parameterName: string; parameterValue: string }) => void,
  ): void;
}

/**
 * A driver `Client` class whose connections carry this deployment's driver settings (or their
 * tunnel's), a fresh login token and the session limits, and record the parameters the server
 * reports (the wire endpoint's greeting repeats them, src/tenant-object/wire.ts).
 */
export function tenantClientClass(
  config: LessorConfig,
  options: TenantConnectionOptions,
): typeof SettlingClient {
  const baseStartupConf = (Client.prototype as unknown as StartupConfigurable).getStartupConf;
  const mintToken = options.loginToken;
  const TenantClient = class TenantClient extends SettlingClient {
    private loginToken = "";

    constructor(clientConfig?: ConstructorParameters<typeof Client>[0]) {
      super(clientConfig);
      configure(this, config, options.route);
      const parameters = new Map<string, string>();
      this.state.serverParameters = parameters;
      (this as unknown as { connection: ParameterSource }).connection.on("parameterStatus", (message) => {
        parameters.set(message.parameterName, message.parameterValue);
      });
    }

    override connect(): Promise<void>;
    override connect(callback: (err?: Error) => void): void;
    override connect(callback?: (err?: Error) => void): Promise<void> | void {
      countOpened("tenant");
      // A place among the object's connections opening at once (opening-gate.ts), held until ready.
      const gate = options.openingGate;
      const entered = gate ? gate.enter() : Promise.resolve(() => undefined);
      const minted = entered.then(async (leave) => {
        try {
          this.loginToken = mintToken ? await mintToken() : "";
        } catch (error) {
          leave();
          throw error;
        }
        return leave;
      });
      if (!callback) return minted.then((leave) => super.connect().finally(leave));
      minted.then(
        (leave) =>
          super.connect((error?: Error) => {
            leave();
            callback(error);
          }),
        (error: unknown) => callback(error instanceof Error ? error : new Error("login token failed")),
      );
    }

    /** Called by the driver when it sends the startup message, after `connect` minted the token. */
    override getStartupConf = (): Record<string, string> => {
      const conf = baseStartupConf.call(this);
      conf.options = startupOptions([
        ...tenantSessionSettings(options.limits),
        ...(options.extraSettings ?? []),
        ...(mintToken ? [`lessor.login=${this.loginToken}`] : []),
      ]);
      return conf;
    };
  };
  return TenantClient;
}
