#!/usr/bin/env python3
"""What a client repeating REFRESH costs the gateway (issue 48): each REFRESH is a signature
verification, so before a bound one connection could spend the gateway's CPU on them
without limit, with tokens of any size. Each gateway binary given runs three cases, with an
RS256 JWKS of one key (kid set) minted here with PyJWT and cryptography:

  per_refresh  `--max-data-rate 0` (no rate limit): REFRESHES refreshes, each answered with
               REFRESHED before the next, and the gateway's CPU time (user + system, from
               /proc/<pid>/stat) per refresh, against the same number of PINGs;
  flood        the default `--max-data-rate`: one connection sends REFRESH as fast as the
               gateway answers, for FLOOD_SECONDS at most; how many were verified
               (REFRESHED received) before the session ended, how it ended, and the CPU;
  large        one REFRESH carrying a valid 11 KiB token (a claim padded; docs/PROTOCOL.md:
               at most 4,096 bytes): the answer.

    loadtest/jwt-refresh.py OUT_FILE LABEL=GATEWAY_BINARY [LABEL=GATEWAY_BINARY ...]

The binaries' runs interleave (A B A B ...). Needs python3 with pyjwt and cryptography;
loopback only; under a minute per binary and round."""

import json
import os
import socket
import struct
import sys
import tempfile
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway_process import binaries as named_binaries, cpu_seconds, start, stop

REFRESHES = int(os.environ.get("REFRESHES", "2000"))
FLOOD_SECONDS = float(os.environ.get("FLOOD_SECONDS", "5"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
UID = 42


def frame(kind, payload=b""):
    return struct.pack(">I", 1 + len(payload)) + bytes([kind]) + payload


def read_frame(s):
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None, b""
    n = struct.unpack(">I", head)[0]
    body = s.recv(n, socket.MSG_WAITALL)
    return body[0], body[1:]


def logged_in(port, token):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(frame(0x01, struct.pack(">Q", UID) + token))
    kind, _ = read_frame(s)
    assert kind == 0x81, f"WELCOME expected, got {kind}"
    return s


def bye_text(payload):
    return f"BYE reason {payload[0]}: {payload[1:].decode(errors='replace')}"


def per_call(gw, port, token, kind, payload):
    """CPU microseconds per frame of `kind`, each answered before the next."""
    s = logged_in(port, token)
    for _ in range(20):
        s.sendall(frame(kind, payload))
        read_frame(s)
    before = cpu_seconds(gw.pid)
    for _ in range(REFRESHES):
        s.sendall(frame(kind, payload))
        answer, rest = read_frame(s)
        assert answer in (0x82, 0x84), f"PONG or REFRESHED expected: {answer} {rest[:80]}"
    used = cpu_seconds(gw.pid) - before
    s.close()
    return used / REFRESHES * 1e6


def flood(gw, port, token):
    """(refreshes verified, how it ended, CPU seconds) for one connection sending REFRESH
    back to back; a window of 16 in flight keeps the gateway busy."""
    s = logged_in(port, token)
    s.settimeout(5)
    before = cpu_seconds(gw.pid)
    verified, ended, start_at = 0, "still open", time.monotonic()
    sent = 0
    try:
        while time.monotonic() - start_at < FLOOD_SECONDS:
            while sent - verified < 16:
                s.sendall(frame(0x05, token))
                sent += 1
            kind, payload = read_frame(s)
            if kind == 0x84:
                verified += 1
            elif kind == 0x8F:
                ended = bye_text(payload)
                break
            elif kind is None:
                ended = "closed"
                break
    except OSError as e:
        ended = f"socket: {e}"
    used = cpu_seconds(gw.pid) - before
    s.close()
    return verified, ended, used, time.monotonic() - start_at


def large(port, token, big):
    s = logged_in(port, token)
    s.settimeout(5)
    s.sendall(frame(0x05, big))
    kind, payload = read_frame(s)
    s.close()
    if kind == 0x84:
        return "REFRESHED (accepted)"
    if kind == 0x8F:
        return bye_text(payload)
    return f"frame {kind}"


def run(binary, jwks, token, big, out, label):
    def say(line):
        line = f"{label:10} {line}"
        print(line, flush=True)
        out.write(line + "\n")

    gw, port = start(binary, ["--jwt-key-file", jwks, "--max-data-rate", "0"])
    try:
        ping = per_call(gw, port, token, 0x02, b"")
        refresh = per_call(gw, port, token, 0x05, token)
        say(f"per_refresh  {refresh:6.0f} us of gateway CPU a REFRESH, {ping:4.0f} us a PING (--max-data-rate 0)")
    finally:
        stop(gw)
    gw, port = start(binary, ["--jwt-key-file", jwks])
    try:
        verified, ended, used, took = flood(gw, port, token)
        say(f"flood        {verified:6} verified in {took:.2f} s, {used:.2f} s of gateway CPU; ended: {ended}")
        say(f"large        a token of {len(big)} bytes: {large(port, token, big)}")
    finally:
        stop(gw)


def main():
    binaries = named_binaries(__doc__)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    claims = {"sub": str(UID), "iat": now, "exp": now + 3600}
    token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"}).encode()
    big = jwt.encode({**claims, "pad": "p" * 8_000}, key, algorithm="RS256", headers={"kid": "k1"}).encode()
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update({"kid": "k1", "alg": "RS256", "use": "sig"})
    with tempfile.TemporaryDirectory() as d, open(sys.argv[1], "w") as out:
        out.write(f"# RS256 REFRESH, {REFRESHES} per_refresh calls, {FLOOD_SECONDS} s flood, {ROUNDS} rounds; "
                  "loadtest/jwt-refresh.py\n")
        jwks = os.path.join(d, "jwks.json")
        with open(jwks, "w") as f:
            json.dump({"keys": [jwk]}, f)
        for _ in range(ROUNDS):
            for label, binary in binaries:
                run(binary, jwks, token, big, out, label)


main()
