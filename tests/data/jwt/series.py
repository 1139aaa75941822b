"""A series of short-lived HS256 tokens per uid, made with PyJWT (a library independent of
the one the gateway verifies with), for the refresh tests (tests/token_refresh.rs):

    series.py DIR COUNT UID [UID ...]

Writes DIR/secret.txt and prints {uid: [token, ...]}: token k of a uid expires 20 + 15k
seconds from now, so a client that refreshes each 5 s before its expiry hands the gateway
token k + 1 while token k still has 5 s to run, and every token has 20 s left when used.
"""
import json
import secrets
import sys
import time

import jwt

out, count, uids = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
secret = secrets.token_hex(32)
with open(f"{out}/secret.txt", "w") as f:
    f.write(secret + "\n")
now = int(time.time())
print(
    json.dumps(
        {
            uid: [
                jwt.encode(
                    {"sub": uid, "iat": now, "exp": now + 20 + 15 * k, "name": f"user {uid}", "org": "acme"},
                    secret,
                    algorithm="HS256",
                )
                for k in range(count)
            ]
            for uid in uids
        }
    )
)
