"""What loadtest's Python measurement scripts share: the gateway binaries named on the
command line, a gateway started as a process of its own on free loopback ports and
stopped, and the CPU time it used (`jwt-kidless.py`, `jwt-refresh.py`, `proxy-partial.py`,
`login-latency.py`)."""

import os
import socket
import subprocess
import sys
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid):
    """User and system CPU time of process `pid`, in seconds (/proc/<pid>/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(binary, extra):
    """`binary serve` with `extra` flags on free ports, once its client port accepts:
    (the process, the client port)."""
    port, admin, api = free_port(), free_port(), free_port()
    gw = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}",
         "--api-listen", f"127.0.0.1:{api}", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    return gw, port


def wait_port(port, what="a gateway"):
    """Waits until something accepts on loopback `port` (10 s at most, then exits)."""
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen on {port}")


def stop(process):
    """Stops a process started here (SIGTERM) and reaps it."""
    process.terminate()
    process.wait()


def binaries(doc, first=2):
    """`LABEL=BINARY` pairs from the command line from argument `first` on; with none,
    exits printing the script's `doc`."""
    if len(sys.argv) <= first:
        sys.exit(doc)
    return [a.split("=", 1) for a in sys.argv[first:]]
