#!/usr/bin/env python3
"""What a refused JWT login without a `kid` costs the gateway, by the number of RSA keys it
holds: before a bound, such a token was checked against every key of its type, before
anyone was authenticated (issue 48). Each gateway binary given runs with 1, 8 and 32 RSA
keys (a JWKS minted here with PyJWT and cryptography), takes LOGINS logins over TCP whose
token (RS256, no `kid`) was signed by a key it does not hold, and the gateway's CPU time
(user + system, from /proc/<pid>/stat) is read before and after: the CPU per refused login.

    loadtest/jwt-kidless.py OUT_FILE LABEL=GATEWAY_BINARY [LABEL=GATEWAY_BINARY ...]

Binaries of several commits compare side by side; the runs interleave (A B A B ...).
Needs python3 with pyjwt and cryptography; loopback only; about a minute per binary."""

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

LOGINS = int(os.environ.get("LOGINS", "400"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
KEYS = [1, 8, 32]




def login(port, token):
    s = socket.create_connection(("127.0.0.1", port))
    body = bytes([0x01]) + struct.pack(">Q", 42) + token
    s.sendall(struct.pack(">I", len(body)) + body)
    head = s.recv(4, socket.MSG_WAITALL)
    n = struct.unpack(">I", head)[0]
    answer = s.recv(n, socket.MSG_WAITALL)
    s.close()
    return answer[0]


def run(binary, jwks, token, out, label, keys):
    gw, port = start(binary, ["--jwt-key-file", jwks])
    try:
        # Warm up, then measure.
        for _ in range(20):
            login(port, token)
        before = cpu_seconds(gw.pid)
        kinds = set()
        for _ in range(LOGINS):
            kinds.add(login(port, token))
        used = cpu_seconds(gw.pid) - before
        assert kinds == {0x8F}, f"every login refused with a BYE: {kinds}"
        line = f"{label:10} keys={keys:<3} {used / LOGINS * 1e6:8.0f} us of gateway CPU per refused login"
        print(line, flush=True)
        out.write(line + "\n")
    finally:
        stop(gw)


def main():
    binaries = named_binaries(__doc__)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = int(time.time())
    claims = {"sub": "42", "iat": now, "exp": now + 3600}
    token = jwt.encode(claims, stranger, algorithm="RS256").encode()
    with tempfile.TemporaryDirectory() as d, open(sys.argv[1], "w") as out:
        out.write(f"# {LOGINS} refused RS256 logins without kid, {ROUNDS} rounds; loadtest/jwt-kidless.py\n")
        held = [rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(max(KEYS))]
        for keys in KEYS:
            jwks = os.path.join(d, f"jwks-{keys}.json")
            with open(jwks, "w") as f:
                json.dump({"keys": [json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(k.public_key())) for k in held[:keys]]}, f)
            for _ in range(ROUNDS):
                for label, binary in binaries:
                    run(binary, jwks, token, out, label, keys)


main()
