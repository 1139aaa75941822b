#!/usr/bin/env python3
"""LOGIN to WELCOME latency, p50 and p99, on one node and on a three-node cluster, at 1 and
at 2,000 logins a second (issue 49: Redis stays off the login path). For each gateway
binary given, each topology and each rate, `loadtest` connects clients at that rate and
reports `login_ms` (connect to WELCOME: on loopback the connect is a few microseconds of
it); the binaries' runs interleave (A B A B ...), ROUNDS times.

    loadtest/login-latency.py OUT_FILE LOADTEST_BINARY LABEL=GATEWAY_BINARY [...]

The cluster is one redis-server and three gateways joined through it (--redis), the
clients spread over the three. Loopback only; about four minutes per binary and round.
Needs redis-server. Settings from the environment: ROUNDS [1], SLOW_CLIENTS [60] (the
clients at 1 a second), FAST_CLIENTS [10000] (at 2,000 a second)."""

import json
import os
import subprocess
import sys
import tempfile
import time

from gateway_process import binaries as named_binaries, free_port, stop, wait_port

ROUNDS = int(os.environ.get("ROUNDS", "1"))
SLOW_CLIENTS = int(os.environ.get("SLOW_CLIENTS", "60"))
FAST_CLIENTS = int(os.environ.get("FAST_CLIENTS", "10000"))
RATES = [(1, SLOW_CLIENTS), (2000, FAST_CLIENTS)]


def gateways(binary, nodes, work):
    """Starts `nodes` gateways (with Redis when more than one); returns (processes, client
    ports)."""
    procs, ports = [], []
    extra = []
    if nodes > 1:
        redis_port = free_port()
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", work],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_port(redis_port, "redis-server")
        extra = ["--redis", f"redis://127.0.0.1:{redis_port}"]
    for i in range(nodes):
        port = free_port()
        node = ["--node-id", f"n{i + 1}"] if nodes > 1 else []
        procs.append(subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{free_port()}",
             "--api-listen", f"127.0.0.1:{free_port()}", "--timeout", "5s", "--max-connections", "19000",
             *node, *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_port(port)
        ports.append(port)
    if nodes > 1:
        time.sleep(2)  # every node joined and ready
    return procs, ports


def run(loadtest, binary, nodes, rate, clients, work):
    procs, ports = gateways(binary, nodes, work)
    report = os.path.join(work, "report.json")
    try:
        subprocess.run(
            [loadtest, "--target", ",".join(f"127.0.0.1:{p}" for p in ports), "--connections", str(clients),
             "--connect-rate", str(rate), "--duration", "1s", "--silent-fraction", "0", "--ping-interval", "2s",
             "--report", report],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(report) as f:
            login = json.load(f)["login_ms"]
        return login
    finally:
        for p in reversed(procs):
            stop(p)


def main():
    binaries = named_binaries(__doc__, first=3)
    loadtest = sys.argv[2]
    with open(sys.argv[1], "w") as out, tempfile.TemporaryDirectory() as work:
        out.write("# loadtest/login-latency.py: login_ms (connect to WELCOME), ms\n")
        out.write("# label nodes logins_per_second clients p50 p99 max\n")
        for _ in range(ROUNDS):
            for nodes in (1, 3):
                for rate, clients in RATES:
                    for label, binary in binaries:
                        login = run(loadtest, binary, nodes, rate, clients, work)
                        line = (f"{label} {nodes} {rate} {login['count']} {login['p50']:.3f} {login['p99']:.3f} "
                                f"{login['max']:.3f}")
                        print(line, flush=True)
                        out.write(line + "\n")


main()
