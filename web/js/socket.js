/**
 * The one owner of the dashboard's websockets: connect, reconnect with backoff, and
 * dispatch each frame to the handler registered for its `type`.
 *
 * The run list and the open run each hold one `LiveSocket` (`/ws/live` and
 * `/ws/live?run=ID`). After a server restart a socket reconnects by itself; the server then
 * sends a fresh `runs` or `snapshot` frame, so handlers rebuild from it and nothing is lost.
 * A run the server does not hold closes its socket with 4404: the `gone` handler is told,
 * the state is "gone" (the server is up), and the socket looks again every few seconds.
 */

import { wsUrl } from "./api.js";

const BACKOFF_MIN_MS = 250;
const BACKOFF_MAX_MS = 8000;
/** The server's close code for a run it does not hold (server/ws_close.py NO_RUN). */
const NO_RUN = 4404;
/** How often to look again for a run the server does not hold (yet). */
const GONE_RETRY_MS = 3000;

export class LiveSocket {
  /**
   * @param {string} path server path, e.g. "/ws/live"
   * @param {object} query query parameters (the access cookie goes with the handshake)
   * @param {object} handlers `{ [type]: (frame) => void }`
   * @param {(state: {state: string, retryIn?: number, reason?: string}) => void} onState
   */
  constructor(path, query, handlers, onState = () => {}) {
    this.path = path;
    this.query = query;
    this.handlers = handlers;
    this.onState = onState;
    this.ws = null;
    this.attempt = 0;
    this.timer = null;
    this.closed = false;
    this.missing = false;
    this.connect();
  }

  connect() {
    if (this.closed) return;
    if (!this.missing) this.onState({ state: "connecting" });
    let ws;
    try {
      ws = new WebSocket(wsUrl(this.path, this.query));
    } catch (err) {
      this.scheduleReconnect(String(err));
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      this.attempt = 0;
      // An unknown run's socket opens, then closes with 4404: "open" waits for its first
      // frame, so the indicator does not flicker while the run is missing.
      if (!this.missing) this.onState({ state: "open" });
    };
    ws.addEventListener("message", () => {
      if (this.missing) {
        this.missing = false;
        this.onState({ state: "open" });
      }
    }, { once: true });
    ws.onmessage = (ev) => this.dispatch(ev.data);
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      const reason = ev.reason || (ev.code === 1008 ? "access refused (check the token)" : "");
      if (ev.code === NO_RUN) {
        // No such run (yet): the server is up, so this is not "offline". Say so, and keep
        // looking slowly in case its probe starts (a replay prints the link first).
        this.missing = true;
        if (this.handlers.gone) this.handlers.gone({ reason });
        this.onState({ state: "gone", reason });
        clearTimeout(this.timer);
        this.timer = setTimeout(() => this.connect(), GONE_RETRY_MS);
        return;
      }
      this.scheduleReconnect(reason);
    };
    // onerror is always followed by onclose, which does the reconnecting.
    ws.onerror = () => {};
  }

  dispatch(text) {
    let frame;
    try {
      frame = JSON.parse(text);
    } catch {
      console.warn("gradwatch: ignoring a frame that is not JSON");
      return;
    }
    const handler = this.handlers[frame && frame.type];
    if (handler) {
      try {
        handler(frame);
      } catch (err) {
        console.error(`gradwatch: handling a '${frame.type}' frame failed`, err);
      }
    }
  }

  scheduleReconnect(reason = "") {
    if (this.closed) return;
    // Exponential backoff with jitter, so many tabs do not hammer a restarting server.
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** this.attempt);
    const delay = Math.round(base * (0.75 + Math.random() * 0.5));
    this.attempt += 1;
    this.onState({ state: "closed", retryIn: delay, reason });
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), delay);
  }

  /** Reconnect now (e.g. the tab became visible again). */
  poke() {
    if (!this.ws && !this.closed) {
      clearTimeout(this.timer);
      this.connect();
    }
  }

  /** Close for good (the user left this run). */
  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.close(1000, "dashboard left the run");
    }
  }
}
