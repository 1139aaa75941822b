// The wire vocabulary against docs/PROTOCOL.md's examples, byte for byte.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  decodeFrame,
  encodeData,
  encodeLogin,
  encodeLogout,
  encodePing,
  encodeRefresh,
  readExpiry,
  refreshDelayMs,
  reasonOfCloseCode,
  retryHint,
  toUid,
  checkDevice,
  REASONS,
  MIN_REFRESH_INTERVAL_MS,
} from '../src/index.js';

const hex = (bytes) => Buffer.from(bytes).toString('hex').match(/../g).join(' ');
const bytes = (s) => Uint8Array.from(s.split(' ').map((b) => parseInt(b, 16)));

test('client frames are PROTOCOL.md bodies (WebSocket messages carry no length prefix)', () => {
  assert.equal(hex(encodeLogin(42)), '01 00 00 00 00 00 00 00 2a');
  assert.equal(hex(encodeLogin('42', '', 'tab')), '01 00 00 00 00 00 00 00 2a 00 74 61 62');
  assert.equal(hex(encodeLogin(42, '17')), '01 00 00 00 00 00 00 00 2a 31 37');
  // Version 5: the timeout asked for, after the device or an empty name (docs/PROTOCOL.md).
  assert.equal(hex(encodeLogin(42, '', 'tab', 120000)), '01 00 00 00 00 00 00 00 2a 00 74 61 62 00 00 01 d4 c0');
  assert.equal(hex(encodeLogin(42, '', '', 120000)), '01 00 00 00 00 00 00 00 2a 00 00 00 01 d4 c0');
  assert.throws(() => encodeLogin(42, '', '', 0), RangeError);
  assert.throws(() => encodeLogin(42, '', '', 1.5), RangeError);
  assert.equal(hex(encodePing(new TextEncoder().encode('hi'))), '02 68 69');
  assert.equal(hex(encodeData('app')), '03 61 70 70');
  assert.equal(hex(encodeLogout()), '04');
  assert.equal(hex(encodeRefresh('a.b.c')), '05 61 2e 62 2e 63');
});

test('token expiries are read from JWTs and HMAC tokens, and refreshed a tenth ahead, at least 5 s', () => {
  // {"alg":"HS256"} . {"sub":"7","exp":1700000020} . a signature it does not check.
  assert.equal(readExpiry('eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI3IiwiZXhwIjoxNzAwMDAwMDIwfQ.c2ln'), 1700000020);
  assert.equal(readExpiry(`1700000020.${'ab'.repeat(32)}`), 1700000020);
  assert.equal(readExpiry('opaque'), undefined);
  assert.equal(readExpiry('a.b.c'), undefined);
  const now = 1_000_000_000_000;
  assert.equal(refreshDelayMs(1_000_000_020, now), 15_000);
  assert.equal(refreshDelayMs(1_000_003_600, now), 3_240_000);
  assert.equal(refreshDelayMs(1_000_000_003, now), MIN_REFRESH_INTERVAL_MS);
});

test('gateway frames decode', () => {
  const welcome = bytes('81 00 00 75 30 00 00 03 e8 30 30 30 30 30 30 30 30 30 30 30 30 30 30 66 66');
  assert.deepEqual(decodeFrame(welcome), { type: 'welcome', timeoutMs: 30000, tickMs: 1000, session: '00000000000000ff' });
  assert.deepEqual(decodeFrame(bytes('83 68 69')), { type: 'push', payload: new TextEncoder().encode('hi') });
  assert.deepEqual(decodeFrame(bytes('8f 01')), { type: 'bye', reason: 'idle_timeout', text: '' });
  assert.deepEqual(decodeFrame(bytes('8f 04 62 61 64')), { type: 'bye', reason: 'protocol_error', text: 'bad' });
  assert.deepEqual(decodeFrame(bytes('81 00 00 75 30 00 00 03 e8')).session, '', 'an old gateway sends no session id');
  assert.deepEqual(decodeFrame(bytes('84 00 00 00 00 65 53 f1 14')), { type: 'refreshed', expires: 1700000020 });
  assert.deepEqual(decodeFrame(bytes('8f 0a')), { type: 'bye', reason: 'token_expired', text: '' });
  for (const bad of ['', '81 00 00', '8f 0b', '8f', '01 00', '05', '84 00 01']) {
    assert.ok(decodeFrame(bad ? bytes(bad) : new Uint8Array()) instanceof Error, bad);
  }
});

test('uids above 2^53 keep every digit; numbers that lost precision are refused', () => {
  const max = '18446744073709551615';
  assert.equal(hex(encodeLogin(max)), '01 ff ff ff ff ff ff ff ff');
  assert.equal(toUid(max).toString(), max);
  assert.equal(toUid(9007199254740993n).toString(), '9007199254740993');
  assert.equal(toUid(Number.MAX_SAFE_INTEGER).toString(), '9007199254740991');
  assert.throws(() => toUid(2 ** 53 + 2), RangeError);
  assert.throws(() => toUid('18446744073709551616'), RangeError);
  assert.throws(() => toUid('-1'), TypeError);
  assert.throws(() => toUid(1.5), RangeError);
});

test('device names follow the gateway rules', () => {
  assert.equal(checkDevice(''), '');
  assert.equal(checkDevice('phone'), 'phone');
  assert.equal(checkDevice('é'.repeat(16)), 'é'.repeat(16), '32 bytes of UTF-8');
  assert.throws(() => checkDevice('é'.repeat(17)), RangeError);
  assert.throws(() => checkDevice('a\nb'), RangeError);
});

test('close codes map back to the BYE reasons, and retry hints parse', () => {
  assert.equal(reasonOfCloseCode(4001), 'idle_timeout');
  assert.equal(reasonOfCloseCode(4010), 'token_expired');
  for (let byte = 1; byte < REASONS.length; byte++) assert.equal(reasonOfCloseCode(4000 + byte), REASONS[byte]);
  for (const code of [1000, 1006, 4000, 4011]) assert.equal(reasonOfCloseCode(code), undefined);
  assert.equal(retryHint('retry_after_ms=4200; shutting down'), 4200);
  assert.equal(retryHint('retry_after_ms=0'), 0);
  assert.equal(retryHint('retry_after_ms=x'), undefined);
  assert.equal(retryHint('10 connections open'), undefined);
});

test('watch lists and status (version 5) are PROTOCOL.md bodies; PRESENCE decodes, and bad ones are refused', async () => {
  const { encodeUids, encodeStatus, KIND } = await import('../src/index.js');
  assert.equal(hex(encodeUids(KIND.WATCH, [7, '8'])), '06 00 00 00 00 00 00 00 07 00 00 00 00 00 00 00 08');
  assert.equal(hex(encodeUids(KIND.UNWATCH, [18446744073709551615n])), '07 ff ff ff ff ff ff ff ff');
  assert.throws(() => encodeUids(KIND.WATCH, []), RangeError);
  assert.equal(hex(encodeStatus('hi')), '08 68 69');
  assert.equal(hex(encodeStatus('')), '08');
  assert.throws(() => encodeStatus('x'.repeat(256)), RangeError);
  // PROTOCOL.md's example: a snapshot of uid 7, offline at 2 with status "hi", last seen at 1.
  const snapshot = bytes('85 01 00 01 00 00 00 00 00 00 00 07 00 00 00 00 00 00 00 00 02 02 68 69 00 00 00 00 00 00 00 01');
  assert.deepEqual(decodeFrame(snapshot), {
    type: 'presence',
    kind: 'snapshot',
    entries: [{ uid: '7', online: false, atMs: 2, status: 'hi', lastSeenMs: 1 }],
  });
  // An online entry carries no last_seen_ms; a uid above 2^53 stays exact.
  const online = bytes('85 00 00 01 ff ff ff ff ff ff ff ff 01 00 00 00 00 00 00 00 05 00');
  assert.deepEqual(decodeFrame(online).entries, [
    { uid: '18446744073709551615', online: true, atMs: 5, status: '', lastSeenMs: null },
  ]);
  assert.ok(decodeFrame(bytes('85 03 00 00')) instanceof Error, 'an unknown kind');
  assert.ok(decodeFrame(bytes('85 00 ff ff')) instanceof Error, 'more entries than bytes');
  assert.ok(decodeFrame(bytes('85 00 00 00 09')) instanceof Error, 'bytes after the last entry');
  assert.ok(decodeFrame(bytes('85 00 00 01 00 00 00 00 00 00 00 07 02 00 00 00 00 00 00 00 02 00')) instanceof Error, 'state 2');
});
