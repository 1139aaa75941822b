// The wire vocabulary against docs/PROTOCOL.md's examples, byte for byte.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { decodeFrame, encodeData, encodeLogin, encodeLogout, encodePing, reasonOfCloseCode, retryHint, toUid, checkDevice, REASONS } from '../src/index.js';

const hex = (bytes) => Buffer.from(bytes).toString('hex').match(/../g).join(' ');
const bytes = (s) => Uint8Array.from(s.split(' ').map((b) => parseInt(b, 16)));

test('client frames are PROTOCOL.md bodies (WebSocket messages carry no length prefix)', () => {
  assert.equal(hex(encodeLogin(42)), '01 00 00 00 00 00 00 00 2a');
  assert.equal(hex(encodeLogin('42', '', 'tab')), '01 00 00 00 00 00 00 00 2a 00 74 61 62');
  assert.equal(hex(encodeLogin(42, '17')), '01 00 00 00 00 00 00 00 2a 31 37');
  assert.equal(hex(encodePing(new TextEncoder().encode('hi'))), '02 68 69');
  assert.equal(hex(encodeData('app')), '03 61 70 70');
  assert.equal(hex(encodeLogout()), '04');
});

test('gateway frames decode', () => {
  const welcome = bytes('81 00 00 75 30 00 00 03 e8 30 30 30 30 30 30 30 30 30 30 30 30 30 30 66 66');
  assert.deepEqual(decodeFrame(welcome), { type: 'welcome', timeoutMs: 30000, tickMs: 1000, session: '00000000000000ff' });
  assert.deepEqual(decodeFrame(bytes('83 68 69')), { type: 'push', payload: new TextEncoder().encode('hi') });
  assert.deepEqual(decodeFrame(bytes('8f 01')), { type: 'bye', reason: 'idle_timeout', text: '' });
  assert.deepEqual(decodeFrame(bytes('8f 04 62 61 64')), { type: 'bye', reason: 'protocol_error', text: 'bad' });
  assert.deepEqual(decodeFrame(bytes('81 00 00 75 30 00 00 03 e8')).session, '', 'an old gateway sends no session id');
  for (const bad of ['', '81 00 00', '8f 0a', '8f', '01 00', '05']) {
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
  for (let byte = 1; byte < REASONS.length; byte++) assert.equal(reasonOfCloseCode(4000 + byte), REASONS[byte]);
  for (const code of [1000, 1006, 4000, 4010]) assert.equal(reasonOfCloseCode(code), undefined);
  assert.equal(retryHint('retry_after_ms=4200; shutting down'), 4200);
  assert.equal(retryHint('retry_after_ms=0'), 0);
  assert.equal(retryHint('retry_after_ms=x'), undefined);
  assert.equal(retryHint('10 connections open'), undefined);
});
