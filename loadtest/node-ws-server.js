// What a WebSocket server users would pick instead costs per connection: Node's `ws`
// package holding the loadtest's WebSocket clients (loadtest/compare.sh, server node_ws).
// It speaks just enough of idlegate's protocol for the ping load: LOGIN gets WELCOME, PING
// gets PONG with the same payload, LOGOUT gets BYE(logout). It tracks nobody and expires
// nobody: a floor for the memory and CPU of the WebSocket door, not a gateway.
//
//   NODE_PATH=<dir with node_modules/ws> node loadtest/node-ws-server.js <port>
"use strict";
const { WebSocketServer } = require("ws");

const port = Number(process.argv[2] || 17070);
const LOGIN = 0x01, PING = 0x02, LOGOUT = 0x04;
const WELCOME = 0x81, PONG = 0x82, BYE = 0x8f;
const LOGOUT_REASON = 2;

// The same timeout and tick the gateway announces (30 s, 1 s), so the loadtest judges both alike.
const welcome = Buffer.from([WELCOME, 0, 0, 0x75, 0x30, 0, 0, 0x03, 0xe8]);

const server = new WebSocketServer({ host: "127.0.0.1", port, path: "/v1/ws", perMessageDeflate: false });
server.on("connection", (ws) => {
  ws.on("message", (data, isBinary) => {
    if (!isBinary || data.length === 0) return ws.close(1003);
    switch (data[0]) {
      case LOGIN: return ws.send(welcome);
      case PING: {
        const pong = Buffer.from(data);
        pong[0] = PONG;
        return ws.send(pong);
      }
      case LOGOUT:
        ws.send(Buffer.from([BYE, LOGOUT_REASON]));
        return ws.close(4000 + LOGOUT_REASON, "logout");
      default: return undefined;
    }
  });
});
process.on("SIGTERM", () => process.exit(0));
