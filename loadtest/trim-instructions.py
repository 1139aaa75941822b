#!/usr/bin/env python3
"""What the event stream's writer costs Redis in instructions, per event, with trimming and
without: the writer (`EMIT` in src/cluster/scripts.rs) of each source tree given, called the
same number of times with the same batches, on a redis-server run under valgrind's
callgrind, counting only the calls. Instructions repeat exactly from run to run, where
Redis's own timings on a shared machine cannot tell 10 % apart; the batches are fixed, so
two writers compare event for event (docs/BENCHMARKS.md, "Trimming the shared stream").

    loadtest/trim-instructions.py OUT_DIR LABEL=SCRIPTS_RS [LABEL=SCRIPTS_RS ...]

SCRIPTS_RS is a copy of src/cluster/scripts.rs (`git show REV:src/cluster/scripts.rs`).
Writes OUT_DIR/instructions-batch-<BATCH>.txt: one line per writer and case, the
instructions per event.
The cases: `below` (both caps far), `count` (a cap of 1,000 events, the stream full) and
`bytes` (a cap of 1 MiB of 2 KiB events, full), each CALLS calls of BATCH events (CASES
picks some of them, space-separated). Needs
redis-server, redis-cli and valgrind; loopback only; a few minutes."""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time

CALLS = int(os.environ.get("CALLS", "2000"))
BATCH = int(os.environ.get("BATCH", "4"))
# Each case: (name, count cap, byte cap, payload bytes of each event).
CASES = [c for c in [
    ("below", 10_000_000, 1 << 40, 100),
    ("count", 1_000, 1 << 40, 100),
    ("bytes", 10_000_000, 1 << 20, 2_048),
] if c[0] in os.environ.get("CASES", "below count bytes").split()]
# Calls before counting starts: enough to fill the stream to its cap in every case.
FILL = 600


def emit_of(path):
    """The EMIT script's Lua from a scripts.rs."""
    text = open(path).read()
    found = re.search(r'const EMIT: &str = r#"(.*?)"#;', text, re.S)
    if not found:
        sys.exit(f"{path}: no EMIT")
    return found.group(1)


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def read_reply(f):
    line = f.readline()
    kind, rest = line[:1], line[1:].strip()
    if kind in (b"+", b":"):
        return rest
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        return [read_reply(f) for _ in range(int(rest))]
    raise RuntimeError(f"unexpected reply {line!r}")


def run(label, emit, case, maxlen, maxbytes, payload, out):
    script = emit + """
local ev = emitter(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
for i = 1, tonumber(ARGV[3]) do ev.emit('t', 'data', 'uid', '7', 'p', ARGV[4], 'at', '1') end
ev.save()
return 1
"""
    with tempfile.TemporaryDirectory() as d:
        sock_path = os.path.join(d, "redis.sock")
        grind = os.path.join(d, "callgrind.out")
        redis = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={grind}",
             "redis-server", "--port", "0", "--unixsocket", sock_path, "--save", "", "--appendonly", "no",
             "--dir", d],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                if os.path.exists(sock_path):
                    break
                time.sleep(0.1)
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock_path)
            f = s.makefile("rb")
            s.sendall(resp("SCRIPT", "LOAD", script))
            sha = read_reply(f)
            body = b"x" * payload
            call = resp("EVALSHA", sha, 2, "{idlegate}:events", "{idlegate}:events:last",
                        maxlen, maxbytes, BATCH, body)
            for _ in range(FILL):
                s.sendall(call)
                read_reply(f)
            subprocess.run(["callgrind_control", "-i", "on", str(redis.pid)], capture_output=True, check=True)
            for _ in range(CALLS):
                s.sendall(call)
                read_reply(f)
            subprocess.run(["callgrind_control", "-i", "off", str(redis.pid)], capture_output=True, check=True)
            subprocess.run(["callgrind_control", "-d", str(redis.pid)], capture_output=True, check=True)
            s.sendall(resp("XLEN", "{idlegate}:events"))
            length = int(read_reply(f))
            total = 0
            for _ in range(100):
                time.sleep(0.2)
                if any(n.startswith("callgrind.out.") for n in os.listdir(d)):
                    time.sleep(0.5)
                    break
            for name in os.listdir(d):
                if name.startswith("callgrind.out"):
                    for line in open(os.path.join(d, name)):
                        # `totals:` is what the dump counted (its `summary:` may be 0).
                        if line.startswith("totals:"):
                            total += int(line.split()[1])
                            break
        finally:
            redis.terminate()
            redis.wait()
    per = total / (CALLS * BATCH)
    line = f"{case:6} {label:8} {per:10.0f} instructions/event  (stream {length} entries)"
    print(line, flush=True)
    out.write(line + "\n")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    os.makedirs(sys.argv[1], exist_ok=True)
    writers = [(a.split("=", 1)[0], emit_of(a.split("=", 1)[1])) for a in sys.argv[2:]]
    with open(os.path.join(sys.argv[1], f"instructions-batch-{BATCH}.txt"), "w") as out:
        out.write(f"# {CALLS} calls of {BATCH} events each, after {FILL} calls that fill the stream\n")
        for case, maxlen, maxbytes, payload in CASES:
            for label, emit in writers:
                run(label, emit, case, maxlen, maxbytes, payload, out)


main()
