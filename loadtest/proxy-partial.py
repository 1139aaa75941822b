#!/usr/bin/env python3
"""What sockets that send the first byte of a PROXY header and then nothing cost the gateway
(issue 48: 1,000 such sockets took 73 % of a core while the header's wait polled every
5 ms). Each gateway binary given runs with `--proxy-protocol --proxy-protocol-from
127.0.0.2`; SOCKETS connections from 127.0.0.2 each send `P`, and the gateway's CPU time
(user + system, /proc/<pid>/stat) over SECONDS is read while they wait.

    loadtest/proxy-partial.py OUT_FILE LABEL=GATEWAY_BINARY [LABEL=GATEWAY_BINARY ...]

The runs interleave (A B A B ...). Loopback only; under a minute per binary."""

import os
import socket
import sys
import time

from gateway_process import binaries as named_binaries, cpu_seconds, start, stop

SOCKETS = int(os.environ.get("SOCKETS", "1000"))
SECONDS = float(os.environ.get("SECONDS", "10"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))


def run(label, binary, out):
    gw, port = start(binary, [
        "--proxy-protocol", "--proxy-protocol-from", "127.0.0.2", "--login-timeout", "60s",
        "--max-pending-logins", str(SOCKETS * 2), "--max-pending-logins-per-ip", str(SOCKETS * 2),
    ])
    sockets = []
    try:
        for _ in range(SOCKETS):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"P")
            sockets.append(s)
        time.sleep(1)
        before = cpu_seconds(gw.pid)
        time.sleep(SECONDS)
        used = cpu_seconds(gw.pid) - before
        line = f"{label:8} {SOCKETS} sockets waiting: {100 * used / SECONDS:5.1f} % of a core"
        print(line, flush=True)
        out.write(line + "\n")
    finally:
        for s in sockets:
            s.close()
        stop(gw)


def main():
    binaries = named_binaries(__doc__)
    with open(sys.argv[1], "w") as out:
        out.write(f"# {SOCKETS} sockets that sent 'P', the gateway's CPU over {SECONDS} s; loadtest/proxy-partial.py\n")
        for _ in range(ROUNDS):
            for label, binary in binaries:
                run(label, binary, out)


main()
