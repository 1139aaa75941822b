// The client's behaviour against a scripted gateway (a fake WebSocket) under mocked timers:
// keepalive from WELCOME, DATA saving pings, the bounded queue, backoff and hints, no
// reconnect after a kick or a logout, tokens refreshed after auth_failed.
import { test, mock, beforeEach, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { Backoff, Client, decodeFrame, KIND } from '../src/index.js';

/** A WebSocket whose gateway side the test scripts. */
class FakeSocket {
  static opened = [];
  constructor(url) {
    this.url = url;
    this.readyState = 0;
    this.sent = [];
    FakeSocket.opened.push(this);
  }
  send(bytes) {
    assert.equal(this.readyState, 1, 'sends only on an open socket');
    this.sent.push(Uint8Array.from(bytes));
  }
  close(code = 1000, reason = '') {
    if (this.readyState === 3) return;
    this.readyState = 3;
    queueMicrotask(() => this.onclose?.({ code, reason }));
  }
  // The gateway's side.
  accept() {
    this.readyState = 1;
    this.onopen?.();
  }
  deliver(...bytes) {
    this.onmessage?.({ data: Uint8Array.from(bytes).buffer });
  }
  welcome(timeoutMs = 30000, session = '00000000000000ff') {
    const out = new Uint8Array(9 + session.length);
    out[0] = KIND.WELCOME;
    new DataView(out.buffer).setUint32(1, timeoutMs);
    new DataView(out.buffer).setUint32(5, 1000);
    out.set(new TextEncoder().encode(session), 9);
    this.deliver(...out);
  }
  bye(reasonByte, text = '') {
    this.deliver(KIND.BYE, reasonByte, ...new TextEncoder().encode(text));
    this.readyState = 3;
    this.onclose?.({ code: 4000 + reasonByte, reason: '' });
  }
  kinds() {
    return this.sent.map((f) => f[0]);
  }
}

const flush = () => new Promise((resolve) => setImmediate(resolve));

/** Runs the mocked clock forward in steps, letting promises settle between them. */
async function advance(ms, step = 100) {
  for (let t = 0; t < ms; t += step) {
    mock.timers.tick(Math.min(step, ms - t));
    await flush();
  }
}

function client(options = {}) {
  const states = [];
  const c = new Client({ url: 'ws://gw.test', uid: 7, WebSocket: FakeSocket, ...options });
  c.on('state', (s) => states.push(s));
  return { c, states };
}

async function online(options) {
  const made = client(options);
  await flush();
  const ws = FakeSocket.opened.at(-1);
  ws.accept();
  ws.welcome(options?.timeoutMs);
  return { ...made, ws };
}

beforeEach(() => {
  FakeSocket.opened = [];
  // Node 20.11+ takes options; older releases (Debian bookworm's 18) a list of APIs.
  try {
    mock.timers.enable({ apis: ['setTimeout'] });
  } catch {
    mock.timers.enable(['setTimeout']);
  }
});
afterEach(() => mock.timers.reset());

test('it logs in with its uid, device and token, on /v1/ws by default', async () => {
  const { c, ws, states } = await online({ uid: '18446744073709551615', device: 'tab', token: 'tok' });
  assert.equal(ws.url, 'ws://gw.test/v1/ws');
  assert.equal(Buffer.from(ws.sent[0]).toString('hex'), '01ffffffffffffffff' + Buffer.from('tok\0tab').toString('hex'));
  assert.deepEqual(states.map((s) => s.state), ['connecting', 'online']);
  assert.deepEqual(c.state, { state: 'online', session: '00000000000000ff', timeoutMs: 30000, tickMs: 1000, keepaliveMs: 10000 });
});

test('it pings after a third of the timeout of silence, and DATA saves the ping', async () => {
  const { c, ws } = await online();
  await advance(9_900);
  assert.deepEqual(ws.kinds(), [KIND.LOGIN], 'no ping before 10 s');
  await advance(200);
  assert.deepEqual(ws.kinds(), [KIND.LOGIN, KIND.PING]);
  // DATA every 5 s: no ping for a minute.
  for (let i = 0; i < 12; i++) {
    c.send('x');
    await advance(5_000);
  }
  assert.equal(ws.kinds().filter((k) => k === KIND.PING).length, 1);
  await advance(10_100);
  assert.equal(ws.kinds().filter((k) => k === KIND.PING).length, 2, 'silent again, it pings again');
});

test('pushes reach the application', async () => {
  const { c, ws } = await online();
  const pushes = [];
  c.on('push', (p) => pushes.push(new TextDecoder().decode(p)));
  ws.deliver(KIND.PUSH, 0x68, 0x69);
  assert.deepEqual(pushes, ['hi']);
});

test('after BYE(shutdown) it waits at least the hint, and sends what it queued meanwhile', async () => {
  const { c, ws, states } = await online({ maxQueued: 2 });
  ws.bye(8, 'retry_after_ms=4200; shutting down');
  await flush();
  const offline = states.at(-1);
  assert.equal(offline.reason, 'shutdown');
  assert.equal(offline.code, 4008);
  assert.ok(offline.retryInMs >= 4200, `${offline.retryInMs}`);
  assert.equal(c.send('a'), true);
  assert.equal(c.send('b'), true);
  assert.equal(c.send('c'), false, 'past the bound the message is not taken');
  await advance(4_100);
  assert.equal(FakeSocket.opened.length, 1, 'not before the hint');
  await advance(offline.retryInMs - 4_100 + 100);
  assert.equal(FakeSocket.opened.length, 2);
  const again = FakeSocket.opened[1];
  again.accept();
  again.welcome();
  assert.deepEqual(again.sent.slice(1).map((f) => new TextDecoder().decode(f.subarray(1))), ['a', 'b']);
});

test('a lost connection is retried in growing full-jitter windows', async () => {
  const { states } = client({ backoff: { baseMs: 100, capMs: 400 } });
  await flush();
  for (let attempt = 0; attempt < 5; attempt++) {
    const ws = FakeSocket.opened.at(-1);
    ws.close(1006);
    await flush();
    const offline = states.at(-1);
    assert.equal(offline.state, 'offline');
    assert.equal(offline.reason, 'disconnect');
    assert.ok(offline.retryInMs <= Math.min(400, 100 * 2 ** attempt), `attempt ${attempt}: ${offline.retryInMs}`);
    await advance(offline.retryInMs + 1, 1);
    assert.equal(FakeSocket.opened.length, attempt + 2);
  }
});

test('a socket that reports an error and never closes still ends its attempt, and is retried', async () => {
  const { states } = client({ backoff: { baseMs: 100, capMs: 400 } });
  await flush();
  const ws = FakeSocket.opened.at(-1);
  ws.onerror?.({});
  await advance(1500);
  const offline = states.find((s) => s.state === 'offline');
  assert.ok(offline, `offline after the error: ${JSON.stringify(states)}`);
  assert.equal(offline.reason, 'disconnect');
  assert.ok(offline.retryInMs !== null);
  await advance(offline.retryInMs + 1, 1);
  assert.equal(FakeSocket.opened.length, 2, 'a new attempt');
  // An error followed by its close ends the attempt once.
  const second = FakeSocket.opened.at(-1);
  second.onerror?.({});
  second.close(1006);
  await advance(1500);
  assert.equal(states.filter((s) => s.state === 'offline').length, 2);
});

test('kicked, it stays offline until asked; logged out too', async () => {
  const { c, ws, states } = await online();
  ws.bye(3, 'replaced by a newer login');
  await flush();
  assert.equal(states.at(-1).reason, 'kicked');
  assert.equal(states.at(-1).retryInMs, null);
  await advance(60_000, 1_000);
  assert.equal(FakeSocket.opened.length, 1);
  c.reconnect();
  await flush();
  const again = FakeSocket.opened[1];
  again.accept();
  again.welcome();
  c.logout();
  assert.equal(again.kinds().at(-1), KIND.LOGOUT);
  again.bye(2);
  await flush();
  assert.deepEqual(states.at(-1), { state: 'offline', reason: 'logout', text: '', code: 4002, retryInMs: null });
  await advance(60_000, 1_000);
  assert.equal(FakeSocket.opened.length, 2);
});

test('a refused token is asked for again with refresh', async () => {
  const asked = [];
  const token = async (uid, refresh) => {
    asked.push([uid, refresh]);
    return refresh ? 'fresh' : 'stale';
  };
  const { states } = client({ token, backoff: { baseMs: 10, capMs: 10 } });
  await flush();
  FakeSocket.opened[0].accept();
  FakeSocket.opened[0].bye(6, 'token expired');
  await flush();
  assert.equal(states.at(-1).reason, 'auth_failed');
  await advance(20, 1);
  FakeSocket.opened[1].accept();
  assert.deepEqual(asked, [['7', false], ['7', true]]);
  assert.ok(Buffer.from(FakeSocket.opened[1].sent[0]).toString().endsWith('fresh'));
});

test('a close with a BYE code but no BYE (a browser that missed it) still names the reason', async () => {
  const { ws, states } = await online();
  ws.close(4001, 'idle_timeout');
  await flush();
  assert.equal(states.at(-1).reason, 'idle_timeout');
  assert.equal(states.at(-1).code, 4001);
  assert.notEqual(states.at(-1).retryInMs, null);
});

test('bad options are refused up front', () => {
  assert.throws(() => new Client({ url: 'http://x', uid: 1, WebSocket: FakeSocket }), TypeError);
  assert.throws(() => new Client({ url: 'ws://x', uid: 2 ** 60, WebSocket: FakeSocket }), RangeError);
  assert.throws(() => new Client({ url: 'ws://x', uid: 1, WebSocket: undefined }), TypeError);
  assert.throws(() => new Client({ url: 'ws://x', uid: 1, device: 'x'.repeat(33), WebSocket: FakeSocket }), RangeError);
});

test('the backoff matches the Rust crate: windows double to the cap, the hint is a floor', () => {
  const b = new Backoff({ baseMs: 100, capMs: 5000 });
  assert.deepEqual([0, 1, 2, 3, 4, 5, 6, 7].map((n) => b.windowMs(n)), [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
  assert.equal(b.windowMs(10_000), 5000);
  assert.equal(new Backoff().delayMs(0, undefined, () => 0.5), 500);
  assert.equal(new Backoff().delayMs(0, 4200, () => 0.999), 4200);
  assert.equal(new Backoff().delayMs(4, 4200, () => 0.5), 8000);
  const tenths = new Set(Array.from({ length: 2000 }, () => Math.floor(new Backoff({ baseMs: 1000, capMs: 1000 }).delayMs(0) / 100)));
  assert.deepEqual([...tenths].sort((a, b) => a - b), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
});

void decodeFrame;

test('watch, unwatch and setStatus go out when online, again on every connection, and presence is handed over', async () => {
  FakeSocket.opened = [];
  const client = new Client({ url: 'ws://gw', uid: 1, WebSocket: FakeSocket, backoff: { baseMs: 10, capMs: 10 } });
  const presence = [];
  client.on('presence', (p) => presence.push(p));
  client.watch([7, '8']);
  client.setStatus('away');
  await flush();
  const first = FakeSocket.opened[0];
  first.accept();
  first.welcome();
  // After the LOGIN: the list and the status, kept from before the session.
  assert.deepEqual(first.kinds(), [KIND.LOGIN, KIND.WATCH, KIND.STATUS]);
  client.watch([8, 9]);
  client.unwatch([7, 100]);
  assert.deepEqual(first.kinds().slice(3), [KIND.WATCH, KIND.UNWATCH]);
  assert.equal(first.sent[3].length, 9, 'only 9 is new');
  first.deliver(0x85, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9, 1, 0, 0, 0, 0, 0, 0, 0, 5, 0);
  assert.deepEqual(presence, [{ kind: 'change', entries: [{ uid: '9', online: true, atMs: 5, status: '', lastSeenMs: null }] }]);
  // A loss, and the next connection watches 8 and 9 and sets the status again.
  first.close(1006);
  await advance(100, 10);
  const second = FakeSocket.opened[1];
  second.accept();
  second.welcome();
  assert.deepEqual(second.kinds(), [KIND.LOGIN, KIND.WATCH, KIND.STATUS]);
  const watched = decodeUids(second.sent[1]);
  assert.deepEqual(watched.sort(), ['8', '9']);
  client.close();
});

/** The uids of a WATCH or UNWATCH body. */
function decodeUids(frame) {
  const view = new DataView(frame.buffer, frame.byteOffset + 1, frame.byteLength - 1);
  return Array.from({ length: view.byteLength / 8 }, (_, i) => view.getBigUint64(8 * i).toString());
}
