// Types of idlegate-client (src/index.js).

/** A uid: decimal digits, a bigint, or a number that is a safe integer. */
export type Uid = string | bigint | number;

export type CloseReason =
  | 'idle_timeout'
  | 'logout'
  | 'kicked'
  | 'protocol_error'
  | 'login_timeout'
  | 'auth_failed'
  | 'server_full'
  | 'shutdown'
  | 'slow_consumer'
  | 'token_expired'
  | 'disconnect';

export type State =
  | { state: 'connecting'; attempt: number }
  | { state: 'online'; session: string; timeoutMs: number; tickMs: number; keepaliveMs: number }
  | {
      state: 'offline';
      reason: CloseReason;
      text: string;
      /** The WebSocket close code (4001 for idle_timeout), when a connection closed. */
      code: number | undefined;
      /** When the client tries again, or null until reconnect(). */
      retryInMs: number | null;
    };

/**
 * A token, or a token with its expiry (unix seconds) for a token the client cannot read
 * one from (a JWT's `exp` and an idlegate HMAC token's prefix are read).
 */
export type Token = string | { token: string; expires?: number };

/**
 * Gives the token of each login, and of each refresh (asked a tenth of a token's lifetime
 * before it expires, at least 5 s); `refresh` is true after the gateway refused or expired
 * the last one, and for a refresh.
 */
export type TokenProvider = (uid: string, refresh: boolean) => Token | Promise<Token>;

export interface BackoffOptions {
  /** First window, in ms (default 1000). */
  baseMs?: number;
  /** Largest window, in ms (default 30000). */
  capMs?: number;
}

export interface ClientOptions {
  /** ws://host:port[/path] or wss://...; the path defaults to /v1/ws. */
  url: string;
  uid: Uid;
  /** Which of the uid's devices this is; '' (the default) is the default device. */
  device?: string;
  token?: string | TokenProvider;
  backoff?: BackoffOptions | Backoff;
  /** DATA messages held while offline (default 64); past it send() returns false. */
  maxQueued?: number;
  /** Reconnect after BYE(kicked) (default false). */
  reconnectAfterKick?: boolean;
  /** Ping after a third of the timeout without sending (default true). */
  keepalive?: boolean;
  connectTimeoutMs?: number;
  /** A WebSocket implementation (default globalThis.WebSocket). */
  WebSocket?: unknown;
  /** Connect at once (default true); otherwise on reconnect(). */
  autoConnect?: boolean;
}

export declare const DEFAULT_MAX_QUEUED: number;
export declare const DEFAULT_CONNECT_TIMEOUT_MS: number;
export declare const DEFAULT_BASE_MS: number;
export declare const DEFAULT_CAP_MS: number;

export declare class Client {
  constructor(options: ClientOptions);
  readonly url: string;
  /** The uid in decimal, exact above 2^53. */
  readonly uid: string;
  readonly device: string;
  readonly state: State;
  on(type: 'state', listener: (state: State) => void): () => void;
  on(type: 'push', listener: (payload: Uint8Array) => void): () => void;
  /** The gateway took a refreshed token: the session goes on until `expires` (unix seconds). */
  on(type: 'refreshed', listener: (event: { expires: number }) => void): () => void;
  /** Watched uids' presence: a snapshot answering watch() (again after each reconnect), each change in the gateway's stream order, or a resync of the whole list. */
  on(type: 'presence', listener: (event: { kind: PresenceKind; entries: PresenceEntry[] }) => void): () => void;
  on(type: 'error', listener: (error: Error) => void): () => void;
  /** Watches these uids too; kept, and watched again on every connection. */
  watch(uids: Iterable<Uid>): void;
  /** Stops watching these uids. */
  unwatch(uids: Iterable<Uid>): void;
  /** Sets the user's status (empty: none), which its watchers see; set again on every connection. */
  setStatus(text: string): void;
  /** Sends DATA now when online, else queues it; false (message not taken) when the queue is full. */
  send(payload: Uint8Array | ArrayBuffer | ArrayBufferView | string): boolean;
  logout(): void;
  reconnect(): void;
  close(): void;
}

export declare class Backoff {
  constructor(options?: BackoffOptions);
  readonly baseMs: number;
  readonly capMs: number;
  windowMs(attempt: number): number;
  delayMs(attempt: number, hintMs?: number, random?: () => number): number;
}

export declare const KIND: Readonly<
  Record<
    | 'LOGIN'
    | 'PING'
    | 'DATA'
    | 'LOGOUT'
    | 'REFRESH'
    | 'WATCH'
    | 'UNWATCH'
    | 'STATUS'
    | 'WELCOME'
    | 'PONG'
    | 'PUSH'
    | 'REFRESHED'
    | 'PRESENCE'
    | 'BYE',
    number
  >
>;
export type PresenceKind = 'change' | 'snapshot' | 'resync';
/** One watched uid's presence; `uid` in decimal, exact above 2^53. */
export interface PresenceEntry {
  uid: string;
  online: boolean;
  /** When this state began (unix ms); 0 for a uid never seen. */
  atMs: number;
  status: string;
  /** For an offline uid, when it was last online (unix ms), if known. */
  lastSeenMs: number | null;
}
export declare const PRESENCE_KINDS: readonly PresenceKind[];
export declare const MAX_STATUS_WIRE_BYTES: number;
export declare function encodeUids(kind: number, uids: Iterable<Uid>): Uint8Array;
export declare function encodeStatus(text: string): Uint8Array;
export declare const REASONS: readonly (CloseReason | undefined)[];
export declare const BYE_CLOSE_BASE: number;
export declare const MAX_DEVICE_BYTES: number;

export type Frame =
  | { type: 'welcome'; timeoutMs: number; tickMs: number; session: string }
  | { type: 'pong'; payload: Uint8Array }
  | { type: 'push'; payload: Uint8Array }
  | { type: 'refreshed'; expires: number }
  | { type: 'bye'; reason: CloseReason; text: string }
  | { type: 'presence'; kind: PresenceKind; entries: PresenceEntry[] };

export declare function toUid(uid: Uid): bigint;
export declare function checkDevice(device?: string): string;
export declare function encodeLogin(uid: Uid, token?: string, device?: string): Uint8Array;
export declare function encodePing(payload?: Uint8Array): Uint8Array;
export declare function encodeData(payload: Uint8Array | ArrayBuffer | ArrayBufferView | string): Uint8Array;
export declare function encodeLogout(): Uint8Array;
export declare function encodeRefresh(token: string): Uint8Array;
/** A token's expiry (unix seconds) read without verifying it: a JWT's exp, an idlegate HMAC token's prefix. */
export declare function readExpiry(token: string): number | undefined;
/** Milliseconds from nowMs to the refresh of a token expiring at `expires` (unix seconds). */
export declare function refreshDelayMs(expires: number, nowMs: number): number;
export declare const MIN_REFRESH_LEAD_MS: number;
export declare const MIN_REFRESH_INTERVAL_MS: number;
export declare function decodeFrame(data: Uint8Array | ArrayBuffer): Frame | Error;
export declare function reasonOfCloseCode(code: number): CloseReason | undefined;
export declare function retryHint(text: string): number | undefined;
