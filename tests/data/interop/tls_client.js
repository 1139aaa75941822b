// A TLS client of the gateway's `tls` door on Node's tls (OpenSSL underneath).
//
// usage: node tls_client.js HOST PORT CA VERSION CIPHER HEX_FRAMES CLOSE
//   as tls_client.py: VERSION 1.3 or 1.2, CIPHER an OpenSSL name of either version,
//   HEX_FRAMES login,ping-before,ping-after,logout, CLOSE `server` or `client`.
"use strict";
const tls = require("tls");
const fs = require("fs");

const [host, port, ca, version, cipher, frames, close] = process.argv.slice(2);
const [login, before, after, logout] = frames.split(",").map((h) => Buffer.from(h, "hex"));
const v = version === "1.3" ? "TLSv1.3" : "TLSv1.2";
const options = {
  host,
  port: Number(port),
  ca: fs.readFileSync(ca),
  minVersion: v,
  maxVersion: v,
  ALPNProtocols: ["idlegate"],
  // Node takes TLS 1.3's suites (names beginning TLS_) in the same list as 1.2's.
  ciphers: cipher,
};

const socket = tls.connect(options, () => {
  console.log("CIPHER", socket.getCipher().name, socket.getProtocol());
  socket.write(Buffer.concat([login, before]));
});
let got = Buffer.alloc(0);
let step = "before";
socket.on("data", (chunk) => {
  got = Buffer.concat([got, chunk]);
  if (step === "before" && got.includes("before")) {
    step = "after";
    socket.write(after);
  } else if (step === "after" && got.includes("after")) {
    step = "closing";
    console.log("DATA OK");
    // `end` sends close_notify; a logout has the server close first.
    if (close === "server") socket.write(logout);
    else socket.end();
  }
});
// Node ends the readable side on the server's close_notify.
socket.on("end", () => {
  console.log(step === "closing" ? (close === "server" ? "CLOSE_NOTIFY FROM SERVER" : "CLOSE_NOTIFY BOTH WAYS") : "SERVER CLOSED CLEANLY");
  process.exitCode = step === "closing" ? 0 : 3;
});
socket.on("error", (e) => {
  console.log("ERROR", e.code || e.message);
  process.exitCode = 2;
});
