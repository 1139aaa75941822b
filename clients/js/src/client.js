// The client: one WebSocket to the gateway that logs in, keeps itself alive from WELCOME,
// hands pushes to the application and comes back after a loss, by the same rules as the
// Rust crate idlegate-client.

import { Backoff } from './backoff.js';
import {
  decodeFrame,
  encodeData,
  encodeLogin,
  encodeLogout,
  encodePing,
  encodeRefresh,
  encodeStatus,
  encodeUids,
  checkDevice,
  KIND,
  readExpiry,
  reasonOfCloseCode,
  refreshDelayMs,
  retryHint,
  toUid,
} from './wire.js';

/** Share of the gateway's timeout after which a client that sent nothing pings. */
const KEEPALIVE_DIVISOR = 3;
/** Shortest keepalive, whatever a misconfigured gateway says. */
const MIN_KEEPALIVE_MS = 10;
/** Default bound of the DATA queue held while offline. */
export const DEFAULT_MAX_QUEUED = 64;
/** Default limit on opening a connection and logging in. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;
/** Wait before asking the token function again after it failed to give a refresh's token. */
const REFRESH_RETRY_MS = 1000;
/** uids in one WATCH or UNWATCH frame: 8 KiB, far under any gateway's frame limit. */
const UIDS_PER_FRAME = 1024;

/**
 * A token function's answer as `{token, expires}`: a string is a token whose expiry is read
 * from it (a JWT's `exp`, an idlegate HMAC token's prefix); an object may say `expires`
 * (unix seconds) for a token the client cannot read.
 */
function tokenOf(answer) {
  if (answer !== null && typeof answer === 'object') {
    const token = String(answer.token ?? '');
    return { token, expires: typeof answer.expires === 'number' ? answer.expires : readExpiry(token) };
  }
  const token = String(answer ?? '');
  return { token, expires: readExpiry(token) };
}

/**
 * How long after a socket's `error` (or a close it was asked for) the client waits for its
 * `close` before ending the attempt itself: some WebSocket implementations (Node 20's) report
 * a failed connection by `error` alone, and an attempt must always end, and be retried.
 */
const CLOSE_GRACE_MS = 1000;

/**
 * A client of one uid's device. States, in order: `connecting` ({attempt}), `online`
 * ({session, timeoutMs, tickMs, keepaliveMs}), `offline` ({reason, text, code, retryInMs};
 * retryInMs null when it will not come back until reconnect()).
 */
export class Client {
  constructor(options) {
    const {
      url,
      uid,
      device = '',
      timeoutMs = undefined,
      token = '',
      backoff = {},
      maxQueued = DEFAULT_MAX_QUEUED,
      reconnectAfterKick = false,
      keepalive = true,
      connectTimeoutMs = DEFAULT_CONNECT_TIMEOUT_MS,
      WebSocket: Impl = globalThis.WebSocket,
      autoConnect = true,
    } = options ?? {};
    if (typeof url !== 'string' || !/^wss?:\/\//i.test(url)) {
      throw new TypeError(`url must be ws:// or wss://, not ${JSON.stringify(url)}`);
    }
    if (typeof Impl !== 'function') {
      throw new TypeError('no WebSocket: run on Node 22+ or a browser, or pass a WebSocket implementation');
    }
    this.url = /^wss?:\/\/[^/]+$/i.test(url) ? `${url}/v1/ws` : url;
    this.uid = toUid(uid).toString();
    this.device = checkDevice(device);
    // The timeout asked for at LOGIN (protocol version 5): the gateway grants a class at
    // or above it, WELCOME says which, and the keepalive is a third of that.
    this.timeoutMs = timeoutMs;
    encodeLogin(0, '', '', timeoutMs);
    this.token = typeof token === 'function' ? token : async () => token;
    this.backoff = backoff instanceof Backoff ? backoff : new Backoff(backoff);
    this.maxQueued = Math.max(1, maxQueued);
    this.reconnectAfterKick = reconnectAfterKick;
    this.keepalive = keepalive;
    this.connectTimeoutMs = connectTimeoutMs;
    this.WebSocket = Impl;
    this.state = { state: 'offline', reason: 'disconnect', text: 'not started', code: undefined, retryInMs: null };
    this.queue = [];
    this.listeners = { state: new Set(), push: new Set(), refreshed: new Set(), presence: new Set(), error: new Set() };
    /** The uids watched (decimal strings) and the status set: sent again on every connection. */
    this.watching = new Set();
    this.status = undefined;
    this.attempt = 0;
    this.refresh = false;
    this.ws = null;
    this.timer = null;
    /** The refresh of the session's token: its timer, then the token being fetched. */
    this.refreshTimer = null;
    this.stopped = false;
    /** A LOGOUT went out: the close that follows is the logout's. */
    this.loggingOut = false;
    if (autoConnect) queueMicrotask(() => this.reconnect());
  }

  /**
   * Calls `listener` on each `state` change, `push` (a Uint8Array), `refreshed` ({expires}:
   * the gateway took a refreshed token), `presence` ({kind, entries}: watched uids' presence)
   * or `error` (an Error).
   */
  on(type, listener) {
    this.listeners[type].add(listener);
    return () => this.listeners[type].delete(listener);
  }

  /**
   * Sends `payload` (bytes or a string) as DATA at once when online; holds it while not, up
   * to `maxQueued` messages. Returns false, not taking the message, when the queue is full.
   */
  send(payload) {
    const frame = encodeData(payload);
    if (this.state.state === 'online' && this.ws?.readyState === 1) {
      this.write(frame);
      return true;
    }
    if (this.queue.length >= this.maxQueued) return false;
    this.queue.push(frame);
    return true;
  }

  /**
   * Watches `uids` too (decimal strings, bigints or safe integers): the gateway answers with
   * a `presence` event of kind 'snapshot', then one of kind 'change' per transition, in the
   * order of its event stream ('resync': the whole list again, after the client fell
   * behind). The list is kept and watched again on every connection, each time with a
   * fresh snapshot. Whom a user may watch is the gateway's policy: a uid it may not reads as
   * one that never logged in.
   */
  watch(uids) {
    const added = [...uids].map((uid) => toUid(uid).toString()).filter((uid) => !this.watching.has(uid));
    added.forEach((uid) => this.watching.add(uid));
    this.sendUids(KIND.WATCH, added);
  }

  /** Stops watching `uids`. */
  unwatch(uids) {
    const gone = [...uids].map((uid) => toUid(uid).toString()).filter((uid) => this.watching.delete(uid));
    this.sendUids(KIND.UNWATCH, gone);
  }

  /** Sets the user's status, which its watchers see (empty: none); set again on every connection. */
  setStatus(text) {
    const frame = encodeStatus(text);
    this.status = text;
    if (this.state.state === 'online' && this.ws?.readyState === 1) this.write(frame);
  }

  sendUids(kind, uids) {
    if (this.state.state !== 'online' || this.ws?.readyState !== 1) return;
    for (let i = 0; i < uids.length; i += UIDS_PER_FRAME) {
      this.write(encodeUids(kind, uids.slice(i, i + UIDS_PER_FRAME)));
    }
  }

  /** Ends the session (LOGOUT); stays offline until reconnect(). */
  logout() {
    this.stopped = true;
    if (this.state.state === 'online' && this.ws?.readyState === 1) {
      this.loggingOut = true;
      this.ws.send(encodeLogout());
      return;
    }
    this.drop();
    this.setState({ state: 'offline', reason: 'logout', text: '', code: undefined, retryInMs: null });
  }

  /** Connects now: at start, after a logout, a kick or close(), or instead of waiting out a backoff. */
  reconnect() {
    if (this.ws || this.state.state === 'connecting' || this.state.state === 'online') return;
    clearTimeout(this.timer);
    this.stopped = false;
    this.open();
  }

  /** Drops the connection without a LOGOUT (the gateway reports `disconnect`); reconnect() starts again. */
  close() {
    this.stopped = true;
    this.drop();
    this.setState({ state: 'offline', reason: 'disconnect', text: 'closed by the application', code: undefined, retryInMs: null });
  }

  async open() {
    const attempt = this.attempt;
    this.setState({ state: 'connecting', attempt });
    let token;
    let expires;
    try {
      ({ token, expires } = tokenOf(await this.token(this.uid, this.refresh)));
    } catch (e) {
      this.lost('disconnect', `no token: ${e?.message ?? e}`, undefined);
      return;
    }
    if (this.stopped) return;
    let ws;
    try {
      ws = new this.WebSocket(this.url);
    } catch (e) {
      this.lost('disconnect', `cannot open ${this.url}: ${e?.message ?? e}`, undefined);
      return;
    }
    this.ws = ws;
    ws.binaryType = 'arraybuffer';
    let bye = null;
    let welcomed = false;
    clearTimeout(this.timer);
    // The attempt ends once, by whichever comes first: the socket's close, or the grace
    // after an error or a close that was asked for and never reported.
    const endWithin = (text) => setTimeout(() => ws.onclose?.({ code: 1006, reason: text }), CLOSE_GRACE_MS);
    this.timer = setTimeout(() => {
      ws.close();
      endWithin('no WELCOME in time');
    }, this.connectTimeoutMs);
    ws.onopen = () => {
      try {
        ws.send(encodeLogin(this.uid, token, this.device, this.timeoutMs));
      } catch (e) {
        this.emit('error', e);
        ws.close();
      }
    };
    ws.onmessage = (event) => {
      if (typeof event.data === 'string') return;
      const frame = decodeFrame(event.data);
      if (frame instanceof Error) {
        this.emit('error', frame);
        return;
      }
      if (frame.type === 'welcome' && !welcomed) {
        welcomed = true;
        this.attempt = 0;
        this.refresh = false;
        const keepaliveMs = Math.max(MIN_KEEPALIVE_MS, Math.floor(frame.timeoutMs / KEEPALIVE_DIVISOR));
        clearTimeout(this.timer);
        this.setState({ state: 'online', session: frame.session, timeoutMs: frame.timeoutMs, tickMs: frame.tickMs, keepaliveMs });
        for (const queued of this.queue.splice(0)) this.write(queued);
        this.sendUids(KIND.WATCH, [...this.watching]);
        if (this.status !== undefined) this.write(encodeStatus(this.status));
        this.schedulePing();
        this.scheduleRefresh(ws, expires);
      } else if (frame.type === 'push') {
        this.emit('push', frame.payload);
      } else if (frame.type === 'presence') {
        this.emit('presence', { kind: frame.kind, entries: frame.entries });
      } else if (frame.type === 'refreshed') {
        // The gateway's word on the new token's expiry: the next refresh runs from it.
        this.scheduleRefresh(ws, frame.expires > 0 ? frame.expires : undefined);
        this.emit('refreshed', { expires: frame.expires });
      } else if (frame.type === 'bye') {
        bye = frame;
      }
    };
    ws.onerror = () => endWithin('the connection failed');
    ws.onclose = (event) => {
      if (this.ws !== ws) return;
      this.ws = null;
      clearTimeout(this.timer);
      clearTimeout(this.refreshTimer);
      const reason = bye?.reason ?? reasonOfCloseCode(event.code) ?? 'disconnect';
      const text = bye?.text ?? event.reason ?? '';
      const code = event.code;
      if (this.loggingOut || reason === 'logout') {
        this.loggingOut = false;
        this.stopped = true;
        this.setState({ state: 'offline', reason: 'logout', text, code, retryInMs: null });
        return;
      }
      if (this.stopped) return;
      if (reason === 'kicked' && !this.reconnectAfterKick) {
        this.stopped = true;
        this.setState({ state: 'offline', reason, text, code, retryInMs: null });
        return;
      }
      // The token was refused or ran out: the next login asks for a new one.
      this.refresh = reason === 'auth_failed' || reason === 'token_expired';
      this.lost(reason, text, code);
    };
  }

  /** Schedules the next attempt after a loss. */
  lost(reason, text, code) {
    this.ws = null;
    const retryInMs = this.backoff.delayMs(this.attempt, retryHint(text));
    this.attempt += 1;
    this.setState({ state: 'offline', reason, text, code, retryInMs });
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.open(), retryInMs);
  }

  /**
   * Pings after `keepaliveMs` without sending: every frame sent starts the wait again, so
   * DATA saves pings. No clock is read: a timer restarted per send is exact and costs
   * nothing at the rates a client sends.
   */
  schedulePing() {
    clearTimeout(this.timer);
    if (!this.keepalive || this.state.state !== 'online') return;
    this.timer = setTimeout(() => {
      if (this.state.state !== 'online' || this.ws?.readyState !== 1) return;
      this.write(encodePing());
    }, this.state.keepaliveMs);
  }

  /**
   * Refreshes the token of the session on `ws`, which expires at `expires` (unix seconds,
   * when known), a tenth of its lifetime before then (at least 5 s): a REFRESH over the
   * live connection, so the session keeps its id. Only a refused refresh reconnects.
   */
  scheduleRefresh(ws, expires) {
    clearTimeout(this.refreshTimer);
    if (expires === undefined) return;
    this.refreshTimer = setTimeout(async () => {
      if (this.ws !== ws || this.state.state !== 'online') return;
      let token;
      try {
        ({ token } = tokenOf(await this.token(this.uid, true)));
      } catch (e) {
        this.emit('error', e instanceof Error ? e : new Error(String(e)));
        this.refreshTimer = setTimeout(() => this.scheduleRefresh(ws, expires), REFRESH_RETRY_MS);
        return;
      }
      if (this.ws !== ws || ws.readyState !== 1) return;
      this.write(encodeRefresh(token));
    }, refreshDelayMs(expires, Date.now()));
  }

  write(frame) {
    this.ws.send(frame);
    this.schedulePing();
  }

  drop() {
    clearTimeout(this.timer);
    clearTimeout(this.refreshTimer);
    const ws = this.ws;
    this.ws = null;
    if (ws && ws.readyState <= 1) ws.close(1000);
  }

  setState(state) {
    this.state = state;
    this.emit('state', state);
  }

  emit(type, value) {
    for (const listener of this.listeners[type]) {
      try {
        listener(value);
      } catch (e) {
        if (type !== 'error') this.emit('error', e);
      }
    }
  }
}
