// idlegate's JavaScript client: see README.md.
export { Client, DEFAULT_MAX_QUEUED, DEFAULT_CONNECT_TIMEOUT_MS } from './client.js';
export { Backoff, DEFAULT_BASE_MS, DEFAULT_CAP_MS } from './backoff.js';
export {
  KIND,
  REASONS,
  BYE_CLOSE_BASE,
  MAX_DEVICE_BYTES,
  toUid,
  checkDevice,
  encodeLogin,
  encodePing,
  encodeData,
  encodeLogout,
  encodeRefresh,
  encodeUids,
  encodeStatus,
  PRESENCE_KINDS,
  MAX_STATUS_WIRE_BYTES,
  readExpiry,
  refreshDelayMs,
  MIN_REFRESH_LEAD_MS,
  MIN_REFRESH_INTERVAL_MS,
  decodeFrame,
  reasonOfCloseCode,
  retryHint,
} from './wire.js';
