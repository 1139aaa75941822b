"""Tokens whose kid no provider ever published, for tests/jwks.rs: made with PyJWT and
`cryptography`, independent of the library the gateway verifies with.

    random_kids.py UID COUNT

Prints one JSON list of COUNT ES256 tokens for UID, each naming a random kid of its own,
signed by a P-256 key made here (valid tokens but for their kid).
"""
import json
import secrets
import sys
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

uid, count = int(sys.argv[1]), int(sys.argv[2])
now = int(time.time())
key = ec.generate_private_key(ec.SECP256R1())
claims = {"sub": str(uid), "iss": "https://idp.example", "aud": "idlegate", "iat": now, "exp": now + 600}
print(json.dumps([jwt.encode(claims, key, algorithm="ES256", headers={"kid": secrets.token_hex(8)}) for _ in range(count)]))
