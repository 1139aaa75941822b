// MQTT.js, unmodified, driven by tests/mqttjs.rs: one JSON command per line on stdin, one
// JSON event per line on stdout. Each command names a client ("id"); several clients may
// be open at once.
//
//   {"op":"connect","id":"a","url":"mqtt://127.0.0.1:1883","username":"7","password":"<token>",
//    "clientId":"phone","protocolVersion":5,"keepalive":60,"ca":"<pem path>",
//    "will":{"topic":"t","payload":"bye"}}
//       -> {"id":"a","event":"connect","keepalive":<seconds the client pings at>}
//       or {"id":"a","event":"error","code":<CONNACK code>,"message":"..."}
//   {"op":"subscribe","id":"a","topic":"idlegate/#"}            -> {"id":"a","event":"suback"}
//   {"op":"publish","id":"a","topic":"t","payload":"x","qos":1} -> {"id":"a","event":"published"}
//       (QoS 1: once the PUBACK came)
//   {"op":"end","id":"a"}            a clean DISCONNECT -> {"id":"a","event":"ended"}
//   connect with "authMethod" and "authData": MQTT 5 enhanced authentication (the token as
//   Authentication Data instead of the password); then
//   {"op":"reauth","id":"a","authData":"<token>"}  an AUTH re-authentication (0x19) under
//       the same method (MQTT.js has no public call for it: its packet writer sends it)
//       -> {"id":"a","event":"auth","reasonCode":0,"expires":"<unix s>"} from the gateway's AUTH
// Unprompted: {"id":"a","event":"message","topic":"..","payload":".."},
//             {"id":"a","event":"disconnect","reasonCode":<MQTT 5 reason>},
//             {"id":"a","event":"close"}
// Clients never reconnect on their own: every connection a test sees is one it asked for.
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import mqtt from 'mqtt';

const clients = new Map();
const say = (id, event, rest = {}) => process.stdout.write(JSON.stringify({ id, event, ...rest }) + '\n');

function connect(cmd) {
  const options = {
    username: cmd.username,
    password: cmd.password,
    clientId: cmd.clientId ?? '',
    protocolVersion: cmd.protocolVersion ?? 5,
    keepalive: cmd.keepalive ?? 60,
    clean: true,
    reconnectPeriod: 0,
    connectTimeout: 10_000,
  };
  if (cmd.ca) {
    options.ca = readFileSync(cmd.ca);
    options.rejectUnauthorized = true;
  }
  if (cmd.will) {
    options.will = { topic: cmd.will.topic, payload: Buffer.from(cmd.will.payload), qos: 0, retain: false };
  }
  if (cmd.authMethod) {
    options.properties = { authenticationMethod: cmd.authMethod, authenticationData: Buffer.from(cmd.authData ?? '') };
  }
  const client = mqtt.connect(cmd.url, options);
  clients.set(cmd.id, client);
  // The gateway's AUTH packets (a re-authentication's outcome), told as they come.
  client.handleAuth = (packet, callback) => {
    const expires = packet.properties?.userProperties?.expires ?? null;
    say(cmd.id, 'auth', { reasonCode: packet.reasonCode ?? 0, expires });
    callback();
  };
  client.on('connect', () => say(cmd.id, 'connect', { keepalive: client.keepalive }));
  client.on('error', (e) => say(cmd.id, 'error', { code: e.code ?? null, message: String(e.message) }));
  client.on('message', (topic, payload) => say(cmd.id, 'message', { topic, payload: payload.toString() }));
  client.on('disconnect', (packet) => say(cmd.id, 'disconnect', { reasonCode: packet.reasonCode ?? null }));
  client.on('close', () => say(cmd.id, 'close'));
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  if (!line.trim()) continue;
  const cmd = JSON.parse(line);
  const client = clients.get(cmd.id);
  switch (cmd.op) {
    case 'connect':
      connect(cmd);
      break;
    case 'subscribe':
      client.subscribe(cmd.topic, { qos: 0 }, (err) => say(cmd.id, err ? 'error' : 'suback', err ? { message: String(err) } : {}));
      break;
    case 'publish':
      client.publish(cmd.topic, cmd.payload, { qos: cmd.qos ?? 0 }, (err) =>
        say(cmd.id, err ? 'error' : 'published', err ? { message: String(err) } : {}));
      break;
    case 'reauth':
      client._sendPacket(
        {
          cmd: 'auth',
          reasonCode: 0x19,
          properties: { authenticationMethod: client.options.properties.authenticationMethod, authenticationData: Buffer.from(cmd.authData) },
        },
        (err) => err && say(cmd.id, 'error', { message: String(err) }),
      );
      break;
    case 'end':
      client.end(false, {}, () => say(cmd.id, 'ended'));
      break;
    default:
      say(cmd.id, 'error', { message: `unknown op ${cmd.op}` });
  }
}
for (const client of clients.values()) client.end(true);
