/**
 * The WebSocket the Neon driver connects through, with one change: closing it does not wait on the
 * peer. A WebSocket reports `close` only once the other side answers the close frame, so a database
 * that has gone silent (a stalled network, a frozen compute, a proxy that never answers) would
 * leave a "cut" connection open forever: its query never fails, its pool slot never frees, and its
 * connect timeout never fires its callback (the driver ends a connection by closing its socket and
 * then waits for `close`). Here `close()` reports `close` itself once `closeGraceMs` has passed
 * without the peer's answer, exactly once either way.
 *
 * And a second: a write to a socket that is already closing or closed is dropped instead of thrown.
 * The driver coalesces its writes and sends them from a timer (`coalesceWrites`); when the peer
 * closes in between (a proxy whose database refused the connection or restarted sends the close
 * right after the upgrade), that timer's `send` threw "Can't call WebSocket send() after close()"
 * as an uncaught exception. The bytes could not be delivered anyway, and the driver learns of the
 * end from the `close` event, which fails the connect or the query as it should.
 *
 * And a third: after a clean close, no `error`. When the peer ends a connection cleanly (Postgres
 * closing after the driver's Terminate, the proxy closing the WebSocket with a close frame),
 * workerd reports the close, then an `error` "Network connection lost." for the same hang-up. The
 * driver took that error for a failure: for an idle connection its pool was ending on its idle
 * timeout, the pool passed it on as an idle client's error, and `npm start` printed
 * `control_plane_connection_error … Network connection lost` whenever a control-plane shard's idle
 * connection timed out. A socket that closed cleanly has nothing left to fail.
 */

/** How long a closing socket waits for the peer's close frame before it reports itself closed. */
export const closeGraceMs = 1_000;

type CloseListener = EventListenerOrEventListenerObject<CloseEvent>;
type ErrorListener = EventListenerOrEventListenerObject<ErrorEvent>;

/** `WebSocket` whose `close` event fires within `closeGraceMs` of `close()`, answered or not. */
export class PromptCloseWebSocket extends WebSocket {
  private closeReported = false;
  /** The peer answered or sent a close frame: the connection ended, and nothing failed. */
  private closedCleanly = false;
  private readonly closeListeners: CloseListener[] = [];
  /** Each `error` listener, as the wrapper that leaves out an error after a clean close. */
  private readonly errorListeners = new Map<ErrorListener, (event: ErrorEvent) => void>();
  private graceTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(url: string, protocols?: string | string[]) {
    super(url, protocols);
    super.addEventListener("close", (event) => {
      if (event.wasClean) this.closedCleanly = true;
      this.reportClose(event);
    });
  }

  override addEventListener<Type extends keyof WebSocketEventMap>(
    type: Type,
    handler: EventListenerOrEventListenerObject<WebSocketEventMap[Type]>,
    options?: EventTargetAddEventListenerOptions | boolean,
  ): void {
    if (type === "close") {
      this.closeListeners.push(handler as CloseListener);
      return;
    }
    if (type === "error") {
      const listener = handler as ErrorListener;
      if (this.errorListeners.has(listener)) return;
      const once = typeof options === "object" && options.once === true;
      const wrapper = (event: ErrorEvent) => {
        // The runtime drops a `once` listener after this call; so does this map.
        if (once) this.errorListeners.delete(listener);
        if (this.closedCleanly) return;
        if (typeof listener === "function") listener.call(this, event);
        else listener.handleEvent(event);
      };
      this.errorListeners.set(listener, wrapper);
      super.addEventListener("error", wrapper, options);
      return;
    }
    super.addEventListener(type, handler, options);
  }

  override removeEventListener<Type extends keyof WebSocketEventMap>(
    type: Type,
    handler: EventListenerOrEventListenerObject<WebSocketEventMap[Type]>,
    options?: EventTargetEventListenerOptions | boolean,
  ): void {
    const wrapper = type === "error" ? this.errorListeners.get(handler as ErrorListener) : undefined;
    if (wrapper === undefined) {
      super.removeEventListener(type, handler, options);
      return;
    }
    this.errorListeners.delete(handler as ErrorListener);
    super.removeEventListener("error", wrapper, options);
  }

  /** As the WHATWG spec has it (and browsers do): data for a closing or closed socket is discarded. */
  override send(data: (ArrayBuffer | ArrayBufferView) | string): void {
    if (this.readyState === WebSocket.CLOSING || this.readyState === WebSocket.CLOSED) return;
    super.send(data);
  }

  override close(code?: number, reason?: string): void {
    try {
      super.close(code, reason);
    } catch {
      // Already closing or never opened: the grace below still reports the end.
    }
    this.graceTimer ??= setTimeout(() => this.reportClose(unanswered()), closeGraceMs);
  }

  private reportClose(event: CloseEvent): void {
    clearTimeout(this.graceTimer);
    if (this.closeReported) return;
    this.closeReported = true;
    for (const listener of this.closeListeners) {
      if (typeof listener === "function") listener.call(this, event);
      else listener.handleEvent(event);
    }
  }
}

/** The close a silent peer never sent: abnormal closure (1006), as a dropped connection reports. */
function unanswered(): CloseEvent {
  return new CloseEvent("close", { code: 1006, reason: "peer did not answer the close", wasClean: false });
}
