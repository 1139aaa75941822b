"""HS256 tokens whose `contacts` claim lists whom their session may watch, made with PyJWT
(a library independent of the one the gateway verifies with), for tests/watch.rs:

    watch_claim.py DIR

Writes DIR/secret.txt and prints {name: token}: "listed" (uid 1, contacts [2, "3"]),
"bare" (uid 4, no claim) and "bad" (uid 5, contacts not an array).
"""
import json
import secrets
import sys
import time

import jwt

out = sys.argv[1]
secret = secrets.token_hex(32)
with open(f"{out}/secret.txt", "w") as f:
    f.write(secret + "\n")
now = int(time.time())


def token(uid, **claims):
    return jwt.encode({"sub": str(uid), "iat": now, "exp": now + 600, **claims}, secret, algorithm="HS256")


print(
    json.dumps(
        {
            "listed": token(1, contacts=[2, "3"]),
            "bare": token(4),
            "bad": token(5, contacts="2"),
        }
    )
)
