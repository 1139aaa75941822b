#!/usr/bin/env python3
"""A fixed workload for counting the gateway's instructions per PING on each door.

    python3 loadtest/pings.py <tcp|tls|ws|wss|mqtt> <port> <connections> <pings> [ca.pem]

With DATA=1 in the environment, each client sends a 16-byte DATA (MQTT: a QoS 0 PUBLISH)
just before each PING: the difference from a run without is what one DATA costs.

Opens `connections` clients (TLS trusting ca.pem for tls and wss; the WebSocket upgrade for
ws and wss; MQTT 3.1.1 for mqtt, to idlegate's MQTT door or any broker), logs each in (MQTT:
CONNECT with the uid as username, CONNACK), then `pings` rounds of one PING (PINGREQ) on
every client followed by every PONG (PINGRESP), and closes. The frames are exactly the same every run, so the gateway's
instruction count (loadtest/ping-instructions.sh, under callgrind) repeats; the difference
between a run with pings and one without, divided by the pings, is what one PING costs.
"""
import base64
import os
import socket
import ssl
import struct
import sys

LOGIN, PING, DATA, WELCOME, PONG = 0x01, 0x02, 0x03, 0x81, 0x82
# MQTT 3.1.1: keepalive 20 s (within what idlegate's MQTT door takes under a 30 s timeout;
# the workload's own pings come far more often), clean session, a username.
MQTT_KEEPALIVE = 20
PINGREQ, PINGRESP, CONNACK_OK = b"\xc0\x00", b"\xd0\x00", b"\x20\x02\x00\x00"
MASK = b"\x5a\x3c\x96\x0f"


def read_exact(s, n):
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise EOFError("the gateway closed")
        out += chunk
    return out


class Client:
    def __init__(self, transport, port, ca):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if transport in ("tls", "wss"):
            ctx = ssl.create_default_context(cafile=ca)
            ctx.set_alpn_protocols(["idlegate" if transport == "tls" else "http/1.1"])
            s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        self.s = s
        self.mqtt = transport == "mqtt"
        self.ws = transport in ("ws", "wss")
        if self.ws:
            key = base64.b64encode(os.urandom(16)).decode()
            s.sendall((f"GET /v1/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                       f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                head += read_exact(s, 1)
            assert head.startswith(b"HTTP/1.1 101"), head

    def send(self, body):
        if self.ws:
            masked = bytes(b ^ MASK[i % 4] for i, b in enumerate(body))
            self.s.sendall(bytes([0x82, 0x80 | len(body)]) + MASK + masked)
        else:
            self.s.sendall(struct.pack(">I", len(body)) + body)

    def recv(self):
        if self.ws:
            b0, b1 = read_exact(self.s, 2)
            return read_exact(self.s, b1 & 0x7F)
        (n,) = struct.unpack(">I", read_exact(self.s, 4))
        return read_exact(self.s, n)


    def login(self, uid):
        if self.mqtt:
            user, client_id = str(uid).encode(), b"p%d" % uid
            body = (b"\x00\x04MQTT\x04\x82" + struct.pack(">H", MQTT_KEEPALIVE)
                    + struct.pack(">H", len(client_id)) + client_id + struct.pack(">H", len(user)) + user)
            self.s.sendall(bytes([0x10, len(body)]) + body)
            assert read_exact(self.s, 4) == CONNACK_OK
            return
        self.send(bytes([LOGIN]) + struct.pack(">Q", uid))
        assert self.recv()[0] == WELCOME

    def ping(self, payload):
        if self.mqtt:
            self.s.sendall(PINGREQ)
        else:
            self.send(bytes([PING]) + payload)

    def data(self, payload):
        if self.mqtt:
            topic = b"idlegate/load"
            body = struct.pack(">H", len(topic)) + topic + payload
            self.s.sendall(bytes([0x30, len(body)]) + body)
        else:
            self.send(bytes([DATA]) + payload)

    def pong(self, payload):
        if self.mqtt:
            assert read_exact(self.s, 2) == PINGRESP
        else:
            got = self.recv(); assert got == bytes([PONG]) + payload, got


def main():
    transport, port, connections, pings = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    ca = sys.argv[5] if len(sys.argv) > 5 else None
    clients = [Client(transport, port, ca) for _ in range(connections)]
    for uid, c in enumerate(clients, 1):
        c.login(uid)
    data = os.environ.get("DATA") == "1"
    for i in range(pings):
        payload = struct.pack(">Q", i)
        for c in clients:
            if data:
                c.data(payload + payload)
            c.ping(payload)
        for c in clients:
            c.pong(payload)
    for c in clients:
        c.s.close()


if __name__ == "__main__":
    main()
