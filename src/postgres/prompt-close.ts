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
 */

/** How long a closing socket waits for the peer's close frame before it reports itself closed. */
export const closeGraceMs = 1_000;

type CloseListener = EventListenerOrEventListenerObject<CloseEvent>;

/** `WebSocket` whose `close` event fires within `closeGraceMs` of `close()`, answered or not. */
export class PromptCloseWebSocket extends WebSocket {
  private closeReported = false;
  private readonly closeListeners: CloseListener[] = [];
  private graceTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(url: string, protocols?: string | string[]) {
    super(url, protocols);
    super.addEventListener("close", (event) => this.reportClose(event));
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
    super.addEventListener(type, handler, options);
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
