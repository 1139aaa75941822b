"""What loadtest's Python measurement scripts share: a gateway started as a process of its
own on free loopback ports, and the CPU time it used (`jwt-kidless.py`,
`proxy-partial.py`)."""

import os
import socket
import subprocess
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
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            time.sleep(0.05)
    return gw, port
