#!/usr/bin/env python3
"""What the cluster's APPLY script costs Redis, in instructions, for a fixed workload:
a count that repeats exactly, where a gateway's own batching (timing) moves Redis's totals
by more than the difference being measured.

    loadtest/apply-instructions.py OUT_FILE LABEL=REV [LABEL=REV ...]

For each git revision, takes `EMIT` and `APPLY` out of its src/cluster/scripts.rs, starts
a throwaway redis-server under valgrind's callgrind (counting only the measured part), and
sends one member's batches through `redis-cli --pipe`, each batch one `APPLY` call:
- `single`: 2,000 uids, each a login (its first session) then its end;
- `devices`: 1,000 uids, each three logins on three devices (under `--max-devices 3`),
  then the three ends.
Prints and writes, per revision and workload, the instructions per change. The revision's
`APPLY` is given `--max-devices` only if it reads it (the argument list before issue 49's
bound was one shorter). Needs redis-server, redis-cli, valgrind, callgrind_control.
"""

import os
import re
import subprocess
import sys
import tempfile
import time

from gateway_process import free_port

MEMBER = "bench#00000001"


def script_of(rev):
    text = subprocess.run(["git", "show", f"{rev}:src/cluster/scripts.rs"], check=True, capture_output=True, text=True).stdout
    def const(name):
        m = re.search(r'const ' + name + r': &str = r#"(.*?)"#;', text, re.S)
        return m.group(1)
    apply = const("APPLY")
    return const("EMIT") + "\n" + apply, "ARGV[13]" in apply and "max_devices" in apply


def resp(*args):
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def keys():
    return [f"{{idlegate}}:sessions:{MEMBER}", "{idlegate}:events", "{idlegate}:events:last",
            f"{{idlegate}}:applied:{MEMBER}", f"{{idlegate}}:reaped:{MEMBER}", "{idlegate}:users",
            f"{{idlegate}}:wills:{MEMBER}", "{idlegate}:grace", "{idlegate}:grace:why",
            f"{{idlegate}}:claims:{MEMBER}", f"{{idlegate}}:applied:{MEMBER}:verified"]


def workload(name, sha, bounded):
    """The pipe's bytes: one APPLY a batch, numbered as a node numbers its changes."""
    out, n = [], 0
    def batch(changes):
        nonlocal n
        first, last, prev = n + 1, n + len(changes), n
        n = last
        args = [MEMBER, "bench", last, prev, 1000000, 1 << 30, 0, 0, 0, first, "", 0]
        if bounded:
            args.append(3)
        for c in changes:
            args.extend(c)
        out.append(resp("EVALSHA", sha, 11, *keys(), *args))
    if name == "single":
        for uid in range(1, 2001):
            s = "%016x" % uid
            batch([("L1|30000||- -", uid, s, "", 1000, "")])
            batch([("E1", uid, s, "logout", 1001, "")])
    else:
        for uid in range(1, 1001):
            ss = ["%016x" % (uid * 4 + d) for d in range(3)]
            batch([("L1|30000||- -" if d == 0 else "L|30000||- -", uid, ss[d], "", 1000, f"d{d}") for d in range(3)])
            batch([("E1" if d == 2 else "E", uid, ss[d], "logout", 1001, f"d{d}") for d in range(3)])
    return b"".join(out), n


def measure(script, bounded, name):
    with tempfile.TemporaryDirectory() as d:
        port = free_port()
        out_file = os.path.join(d, "callgrind.out")
        redis = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}",
                                  "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                  "--dir", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cli = ["redis-cli", "-p", str(port)]
        try:
            while subprocess.run(cli + ["PING"], capture_output=True).stdout.strip() != b"PONG":
                time.sleep(0.2)
            sha = subprocess.run(cli + ["SCRIPT", "LOAD", script], check=True, capture_output=True, text=True).stdout.strip()
            pipe, changes = workload(name, sha, bounded)
            subprocess.run(["callgrind_control", "-i", "on", str(redis.pid)], check=True, capture_output=True)
            subprocess.run(cli + ["--pipe"], input=pipe, check=True, capture_output=True)
            subprocess.run(["callgrind_control", "-i", "off", str(redis.pid)], check=True, capture_output=True)
            subprocess.run(["callgrind_control", "-d", str(redis.pid)], check=True, capture_output=True)
            time.sleep(1)
            users = subprocess.run(cli + ["HLEN", "{idlegate}:users"], capture_output=True, text=True).stdout.strip()
            events = subprocess.run(cli + ["HGET", "{idlegate}:events:last", "n"], capture_output=True, text=True).stdout.strip()
        finally:
            redis.terminate()
            redis.wait()
        total = 0
        for f in os.listdir(d):
            if f.startswith("callgrind.out"):
                for line in open(os.path.join(d, f)):
                    if line.startswith(("summary:", "totals:")):
                        total += int(line.split()[1])
        return total, changes, users, events


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = open(sys.argv[1], "w")
    def say(line):
        print(line)
        out.write(line + "\n")
        out.flush()
    say(subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip())
    for pair in sys.argv[2:]:
        label, rev = pair.split("=", 1)
        script, bounded = script_of(rev)
        for name in ("single", "devices"):
            total, changes, users, events = measure(script, bounded, name)
            say(f"{name:8} {label:8} {rev:10} {changes:6d} changes {events:>6} events logged, users left {users}: "
                f"{total:12d} instructions, {total / changes:9.0f} a change")


if __name__ == "__main__":
    main()
