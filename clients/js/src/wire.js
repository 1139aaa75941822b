// idlegate's wire vocabulary over WebSocket: one protocol frame (kind byte and payload, no
// length prefix) per binary message. The byte layout is docs/PROTOCOL.md's; the Rust crate
// idlegate-proto is the reference.

/** Frame kind bytes. */
export const KIND = Object.freeze({
  LOGIN: 0x01,
  PING: 0x02,
  DATA: 0x03,
  LOGOUT: 0x04,
  REFRESH: 0x05,
  WATCH: 0x06,
  UNWATCH: 0x07,
  STATUS: 0x08,
  WELCOME: 0x81,
  PONG: 0x82,
  PUSH: 0x83,
  REFRESHED: 0x84,
  PRESENCE: 0x85,
  BYE: 0x8f,
});

/** What a PRESENCE's entries are, by their wire byte. */
export const PRESENCE_KINDS = Object.freeze(['change', 'snapshot', 'resync']);

/** Longest status a PRESENCE entry carries, in UTF-8 bytes (its length is one byte). */
export const MAX_STATUS_WIRE_BYTES = 255;

/** BYE reasons by their wire byte (index 0 unused). */
export const REASONS = Object.freeze([
  undefined,
  'idle_timeout',
  'logout',
  'kicked',
  'protocol_error',
  'login_timeout',
  'auth_failed',
  'server_full',
  'shutdown',
  'slow_consumer',
  'token_expired',
]);

/** A WebSocket BYE closes with this plus the reason's byte (4001 idle_timeout). */
export const BYE_CLOSE_BASE = 4000;

/** Longest device name, in UTF-8 bytes. */
export const MAX_DEVICE_BYTES = 32;

/** Largest uid: the wire carries an unsigned 64-bit integer. */
const MAX_UID = (1n << 64n) - 1n;

const RETRY_HINT = 'retry_after_ms=';
const encoder = new TextEncoder();
const decoder = new TextDecoder('utf-8', { fatal: true });

/**
 * A uid as a BigInt, from a string of decimal digits, a bigint, or a number that is a safe
 * integer (a larger number has already lost precision, so it is refused).
 */
export function toUid(uid) {
  let value;
  if (typeof uid === 'bigint') {
    value = uid;
  } else if (typeof uid === 'number') {
    if (!Number.isSafeInteger(uid)) {
      throw new RangeError(`uid ${uid} is not a safe integer: pass uids above 2^53 as strings or bigints`);
    }
    value = BigInt(uid);
  } else if (typeof uid === 'string' && /^[0-9]+$/.test(uid)) {
    value = BigInt(uid);
  } else {
    throw new TypeError(`uid must be decimal digits, a bigint or a safe integer, not ${JSON.stringify(uid)}`);
  }
  if (value < 0n || value > MAX_UID) {
    throw new RangeError(`uid ${value} is outside 0..2^64-1`);
  }
  return value;
}

/** Checks a device name: 1 to 32 bytes of UTF-8 with no control character; '' is the default device. */
export function checkDevice(device) {
  if (device === undefined || device === '') return '';
  if (typeof device !== 'string') throw new TypeError('device must be a string');
  const bytes = encoder.encode(device).length;
  if (bytes > MAX_DEVICE_BYTES) throw new RangeError(`device name of ${bytes} bytes; at most ${MAX_DEVICE_BYTES}`);
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(device)) throw new RangeError('device name with a control character');
  return device;
}

function frame(kind, payload) {
  const out = new Uint8Array(1 + (payload ? payload.length : 0));
  out[0] = kind;
  if (payload) out.set(payload, 1);
  return out;
}

/**
 * LOGIN: the uid (u64, big-endian), the token, then 0x00 and the device name if one, then
 * 0x00 and the timeout asked for in milliseconds (u32, big-endian; protocol version 5) if
 * `timeoutMs` is given, after a possibly empty device name.
 */
export function encodeLogin(uid, token = '', device = '', timeoutMs = undefined) {
  const tokenBytes = encoder.encode(token);
  const deviceBytes = encoder.encode(checkDevice(device));
  const asks = timeoutMs !== undefined && timeoutMs !== null;
  if (asks && !(Number.isInteger(timeoutMs) && timeoutMs >= 1 && timeoutMs <= 0xffffffff)) {
    throw new RangeError(`timeoutMs must be a whole number of milliseconds from 1 to 2^32 - 1, not ${timeoutMs}`);
  }
  const named = deviceBytes.length || asks ? 1 + deviceBytes.length : 0;
  const payload = new Uint8Array(8 + tokenBytes.length + named + (asks ? 5 : 0));
  const view = new DataView(payload.buffer);
  view.setBigUint64(0, toUid(uid));
  payload.set(tokenBytes, 8);
  if (named) payload.set(deviceBytes, 9 + tokenBytes.length);
  if (asks) view.setUint32(8 + tokenBytes.length + named + 1, timeoutMs);
  return frame(KIND.LOGIN, payload);
}

export function encodePing(payload) {
  return frame(KIND.PING, payload);
}

export function encodeData(payload) {
  return frame(KIND.DATA, toBytes(payload));
}

export function encodeLogout() {
  return frame(KIND.LOGOUT);
}

/** REFRESH: a new token for the logged-in uid (protocol version 4). */
export function encodeRefresh(token) {
  return frame(KIND.REFRESH, encoder.encode(token));
}

/** WATCH (`kind` KIND.WATCH) or UNWATCH (KIND.UNWATCH): the uids, u64 big-endian each (protocol version 5). */
export function encodeUids(kind, uids) {
  const list = [...uids].map(toUid);
  if (list.length === 0) throw new RangeError('a WATCH or UNWATCH names at least one uid');
  const payload = new Uint8Array(8 * list.length);
  const view = new DataView(payload.buffer);
  list.forEach((uid, i) => view.setBigUint64(8 * i, uid));
  return frame(kind, payload);
}

/** STATUS: the user's status as UTF-8 (empty: none), at most MAX_STATUS_WIRE_BYTES (protocol version 5). */
export function encodeStatus(text) {
  if (typeof text !== 'string') throw new TypeError('status must be a string');
  const bytes = encoder.encode(text);
  if (bytes.length > MAX_STATUS_WIRE_BYTES) {
    throw new RangeError(`status of ${bytes.length} bytes; at most ${MAX_STATUS_WIRE_BYTES}`);
  }
  return frame(KIND.STATUS, bytes);
}

/**
 * A PRESENCE payload: what the entries are (u8), their count (u16), then each entry: uid
 * (u64), state (u8), at_ms (u64), the status's length (u8) and the status, and for an
 * offline entry last_seen_ms (u64, 0 when unknown). uids come back as decimal strings.
 */
function decodePresence(payload) {
  if (payload.length < 3) return new Error('PRESENCE shorter than its header');
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const kind = PRESENCE_KINDS[payload[0]];
  if (!kind) return new Error(`PRESENCE of unknown kind ${payload[0]}`);
  const count = view.getUint16(1);
  const entries = [];
  let at = 3;
  for (let i = 0; i < count; i++) {
    if (payload.length < at + 18) return new Error('PRESENCE entry cut short');
    const uid = view.getBigUint64(at).toString();
    const state = payload[at + 8];
    if (state > 1) return new Error(`PRESENCE entry of state ${state}`);
    const online = state === 1;
    const atMs = Number(view.getBigUint64(at + 9));
    const length = payload[at + 17];
    at += 18;
    if (payload.length < at + length + (online ? 0 : 8)) return new Error('PRESENCE entry cut short');
    let status;
    try {
      status = decoder.decode(payload.subarray(at, at + length));
    } catch {
      return new Error('PRESENCE status that is not UTF-8');
    }
    at += length;
    let lastSeenMs = null;
    if (!online) {
      const seen = Number(view.getBigUint64(at));
      lastSeenMs = seen > 0 ? seen : null;
      at += 8;
    }
    entries.push({ uid, online, atMs, status, lastSeenMs });
  }
  if (at !== payload.length) return new Error('PRESENCE with bytes after its last entry');
  return { type: 'presence', kind, entries };
}

/** A tenth of a token's remaining lifetime is the lead a refresh takes before its expiry... */
const REFRESH_SHARE = 10;
/** ...but at least this: a round trip to the token provider and one to the gateway. */
export const MIN_REFRESH_LEAD_MS = 5000;
/** Never sooner than this after the last refresh: tokens about to expire cause no loop. */
export const MIN_REFRESH_INTERVAL_MS = 1000;

/**
 * The expiry a token carries, unix seconds, read without verifying it: a JWT's `exp`, or
 * the `<expiry>` of an idlegate `<expiry>.<mac>` token; undefined for anything else.
 */
export function readExpiry(token) {
  if (typeof token !== 'string') return undefined;
  const parts = token.split('.');
  if (parts.length === 3) {
    try {
      const b64 = parts[1].replace(/-/g, '+').replace(/_/g, '/');
      const json = JSON.parse(decoder.decode(Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))));
      return typeof json.exp === 'number' && json.exp >= 0 ? Math.floor(json.exp) : undefined;
    } catch {
      return undefined;
    }
  }
  if (parts.length === 2 && /^[0-9]+$/.test(parts[0]) && /^[0-9a-f]+$/i.test(parts[1])) return Number(parts[0]);
  return undefined;
}

/** Milliseconds from `nowMs` (unix ms) to the refresh of a token expiring at `expires` (unix s). */
export function refreshDelayMs(expires, nowMs) {
  const left = Math.max(0, expires * 1000 - nowMs);
  const lead = Math.max(left / REFRESH_SHARE, MIN_REFRESH_LEAD_MS);
  return Math.max(MIN_REFRESH_INTERVAL_MS, Math.floor(left - lead));
}

/** Bytes of a DATA payload: a Uint8Array, an ArrayBuffer or a view, or a string (UTF-8). */
export function toBytes(payload) {
  if (payload instanceof Uint8Array) return payload;
  if (typeof payload === 'string') return encoder.encode(payload);
  if (payload instanceof ArrayBuffer) return new Uint8Array(payload);
  if (ArrayBuffer.isView(payload)) return new Uint8Array(payload.buffer, payload.byteOffset, payload.byteLength);
  throw new TypeError('DATA payload must be bytes or a string');
}

/**
 * One frame from the gateway, or an Error saying what is wrong with it:
 * `{type: 'welcome', timeoutMs, tickMs, session}`, `{type: 'pong', payload}`,
 * `{type: 'push', payload}`, `{type: 'refreshed', expires}`, `{type: 'bye', reason, text}`,
 * `{type: 'presence', kind, entries: [{uid, online, atMs, status, lastSeenMs}]}`.
 */
export function decodeFrame(data) {
  const bytes = toBytes(data);
  if (bytes.length === 0) return new Error('an empty frame');
  const payload = bytes.subarray(1);
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  switch (bytes[0]) {
    case KIND.WELCOME: {
      if (payload.length < 8) return new Error(`WELCOME of ${payload.length} bytes`);
      let session = '';
      try {
        session = decoder.decode(payload.subarray(8));
      } catch {
        return new Error('WELCOME with a session id that is not text');
      }
      return { type: 'welcome', timeoutMs: view.getUint32(0), tickMs: view.getUint32(4), session };
    }
    case KIND.PONG:
      return { type: 'pong', payload };
    case KIND.PUSH:
      return { type: 'push', payload };
    case KIND.REFRESHED:
      if (payload.length !== 8) return new Error(`REFRESHED of ${payload.length} bytes`);
      return { type: 'refreshed', expires: Number(view.getBigUint64(0)) };
    case KIND.PRESENCE:
      return decodePresence(payload);
    case KIND.BYE: {
      const reason = REASONS[payload[0]];
      if (!reason) return new Error(`BYE with reason ${payload[0]}`);
      let text = '';
      try {
        text = decoder.decode(payload.subarray(1));
      } catch {
        text = '';
      }
      return { type: 'bye', reason, text };
    }
    default:
      return new Error(`a gateway does not send frame kind 0x${bytes[0].toString(16)}`);
  }
}

/** The BYE reason a WebSocket close code carries (4001 -> 'idle_timeout'), if any. */
export function reasonOfCloseCode(code) {
  const byte = code - BYE_CLOSE_BASE;
  return byte >= 1 && byte < REASONS.length ? REASONS[byte] : undefined;
}

/** The retry hint (milliseconds) at the start of a BYE's text, if any. */
export function retryHint(text) {
  if (typeof text !== 'string' || !text.startsWith(RETRY_HINT)) return undefined;
  const digits = /^[0-9]+/.exec(text.slice(RETRY_HINT.length));
  return digits ? Number(digits[0]) : undefined;
}
