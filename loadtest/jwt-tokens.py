"""RS256 JWTs for a load test, minted by PyJWT with a 2048-bit RSA key of `cryptography`:

    jwt-tokens.py DIR COUNT [UID_BASE]

Writes DIR/jwks.json (the public key, kid "storm") for the gateway's --jwt-key-file and
DIR/tokens.txt (`<uid> <token>` a line, uids UID_BASE.. UID_BASE+COUNT-1, default 1) for
loadtest's --token-file. Each token lives two hours and carries a few claims, as an identity
provider's would (about 700 bytes).
"""
import json
import sys
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

out, count = sys.argv[1], int(sys.argv[2])
base = int(sys.argv[3]) if len(sys.argv) > 3 else 1
key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
public.update({"kid": "storm", "alg": "RS256", "use": "sig"})
with open(f"{out}/jwks.json", "w") as f:
    json.dump({"keys": [public]}, f)
now = int(time.time())
with open(f"{out}/tokens.txt", "w") as f:
    for uid in range(base, base + count):
        claims = {
            "iss": "https://idp.example",
            "sub": str(uid),
            "aud": "idlegate",
            "iat": now,
            "exp": now + 7200,
            "name": f"user {uid}",
            "org": "acme",
            "scope": "presence:read presence:write",
        }
        f.write(f"{uid} {jwt.encode(claims, key, algorithm='RS256', headers={'kid': 'storm'})}\n")
