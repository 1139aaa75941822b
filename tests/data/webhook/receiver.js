// The webhook receiver of tests/webhook.rs: verifies every delivery with the Standard
// Webhooks library (npm `standardwebhooks`), as a backend would, and prints a JSON line per
// request. It listens on PORT (0: any; it prints `LISTENING <port>` first).
//
// env: SECRET      the whsec_ secret it verifies with (one of the gateway's)
//      FAIL_FIRST  how many requests to fail before acknowledging (default 0)
//      FAIL_MODE   how: `status` (answer 500), `hang` (never answer) or `reset` (reset the
//                  connection)
//      HOLD_FILE   while this file exists, every request is reset unread
//      DELAY_MS    how long to wait before answering each request (a slow receiver)
//      TLS_CERT, TLS_KEY  serve HTTPS with this certificate chain and key (PEM files)
"use strict";
const http = require("http");
const { Webhook } = require("standardwebhooks");

const port = Number(process.argv[2] || 0);
const webhook = new Webhook(process.env.SECRET);
let toFail = Number(process.env.FAIL_FIRST || 0);
const mode = process.env.FAIL_MODE || "status";
let attempt = 0;

const fs = require("fs");
const hold = process.env.HOLD_FILE;
const delay = Number(process.env.DELAY_MS || 0);

const handler = (req, res) => {
  if (hold && fs.existsSync(hold)) {
    req.socket.destroy();
    return;
  }
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    attempt += 1;
    const body = Buffer.concat(chunks).toString("utf8");
    let verified = true;
    let why = "";
    try {
      webhook.verify(body, req.headers);
    } catch (e) {
      verified = false;
      why = String(e.message || e);
    }
    const failing = toFail > 0;
    if (failing) toFail -= 1;
    const line = {
      attempt,
      id: req.headers["webhook-id"],
      timestamp: req.headers["webhook-timestamp"],
      signatures: (req.headers["webhook-signature"] || "").split(" ").length,
      content_type: req.headers["content-type"],
      agent: req.headers["user-agent"],
      verified,
      why,
      acknowledged: !failing,
      body: JSON.parse(body),
    };
    process.stdout.write(JSON.stringify(line) + "\n");
    if (failing && mode === "hang") return;
    if (failing && mode === "reset") {
      req.socket.destroy();
      return;
    }
    setTimeout(() => {
      res.writeHead(failing ? 500 : 204);
      res.end();
    }, delay);
  });
};
const server = process.env.TLS_CERT
  ? require("https").createServer(
      { cert: fs.readFileSync(process.env.TLS_CERT), key: fs.readFileSync(process.env.TLS_KEY) },
      handler,
    )
  : http.createServer(handler);
server.listen(port, "127.0.0.1", () => {
  process.stdout.write(`LISTENING ${server.address().port}\n`);
});
