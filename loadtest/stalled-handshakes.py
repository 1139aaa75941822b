"""Opens N connections to a TLS door and stalls each one inside a ClientHello.

usage: stalled-handshakes.py HOST PORT N BYTES HOLD_SECONDS

Each connection starts a ClientHello announced at 60,000 bytes (under the 64 KiB rustls
joins), sends BYTES bytes of it in handshake records of at most 4 KiB, and sends nothing
more: the handshake bytes a gateway holds for a client nobody authenticated. Prints how
many connections the gateway kept open (the rest it closed, with or without an alert),
then holds them HOLD_SECONDS.
"""

import socket
import sys
import time

host, port, n, size, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
RECORD = 4096
MESSAGE = 60000


def stream():
    """BYTES bytes of records carrying the start of a 60,000-byte ClientHello."""
    out = bytearray()
    body = bytes([1]) + MESSAGE.to_bytes(3, "big") + bytes([3, 3])
    while len(out) < size:
        chunk = min(RECORD, size - len(out) - 5)
        if chunk <= 0:
            break
        payload = (body + bytes(chunk))[:chunk]
        body = b""
        out += bytes([22, 3, 1]) + chunk.to_bytes(2, "big") + payload
    return bytes(out)


data = stream()
conns = []
for _ in range(n):
    s = socket.create_connection((host, port))
    s.setblocking(False)
    try:
        s.sendall(data)
    except OSError:
        pass
    conns.append(s)
time.sleep(1)
still_open = 0
for s in conns:
    try:
        while True:
            got = s.recv(4096)
            if not got:
                break
    except BlockingIOError:
        still_open += 1
    except OSError:
        pass
print(still_open, flush=True)
time.sleep(hold)
