"""Keys and tokens for tests/jwt.rs, made with PyJWT and `cryptography`: a library
independent of the one the gateway verifies with.

    mint.py DIR UID

Writes into DIR: jwks.json (an RSA, two EC and an Ed25519 public key, each with a kid),
keys.pem (the same public keys as PEM, no kid), secret.txt (an HS secret) and
rotated.json (a JWKS holding only a new RSA key, kid "rsa-2"). Prints one JSON object:
name -> token, every token for UID unless its name says otherwise.
"""
import base64
import hashlib
import hmac
import json
import sys
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

out, uid = sys.argv[1], int(sys.argv[2])
now = int(time.time())
ISS, AUD = "https://idp.example", "idlegate"

rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
rsa_new = rsa.generate_private_key(public_exponent=65537, key_size=2048)
p256 = ec.generate_private_key(ec.SECP256R1())
p384 = ec.generate_private_key(ec.SECP384R1())
ed = ed25519.Ed25519PrivateKey.generate()
secret = "hs-secret-for-the-tests-" + "0123456789abcdef" * 3  # 72 bytes: long enough for HS512


def public_pem(key):
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()


def jwk(key, kid, alg=None):
    # PyJWT writes a JWK of a public key; the kid (and alg) are added.
    algo = {
        rsa.RSAPrivateKey: jwt.algorithms.RSAAlgorithm,
        ec.EllipticCurvePrivateKey: jwt.algorithms.ECAlgorithm,
        ed25519.Ed25519PrivateKey: jwt.algorithms.OKPAlgorithm,
    }
    for kind, algorithm in algo.items():
        if isinstance(key, kind):
            d = json.loads(algorithm.to_jwk(key.public_key()))
            d["kid"] = kid
            if alg:
                d["alg"] = alg
            return d
    raise ValueError(key)


with open(f"{out}/jwks.json", "w") as f:
    json.dump({"keys": [jwk(rsa_key, "rsa-1"), jwk(p256, "p256"), jwk(p384, "p384"), jwk(ed, "ed")]}, f)
with open(f"{out}/rotated.json", "w") as f:
    json.dump({"keys": [jwk(rsa_new, "rsa-2")]}, f)
with open(f"{out}/keys.pem", "w") as f:
    f.write(public_pem(rsa_key) + public_pem(p256) + public_pem(p384) + public_pem(ed))
with open(f"{out}/secret.txt", "w") as f:
    f.write(secret + "\n")

# A Keycloak-shaped set: a signing RSA key, an RSA-OAEP encryption key (`use: enc`), an EC
# key whose key_ops allow verifying, and an RSA key whose key_ops allow encrypting only.
signing = jwk(rsa_key, "rsa-1", "RS256")
signing["use"] = "sig"
encrypting = jwk(rsa_new, "enc-1", "RSA-OAEP")
encrypting["use"] = "enc"
ec_verify = jwk(p256, "p256")
ec_verify["key_ops"] = ["verify"]
encrypt_only = jwk(rsa_new, "rsa-enc")
encrypt_only["key_ops"] = ["encrypt"]
with open(f"{out}/keycloak.json", "w") as f:
    json.dump({"keys": [signing, encrypting, ec_verify, encrypt_only]}, f)
# Keys too weak to load, each in a file of its own.
with open(f"{out}/short-secret.txt", "w") as f:
    f.write("only-sixteen-byt\n")
weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
with open(f"{out}/rsa1024.json", "w") as f:
    json.dump({"keys": [jwk(weak, "weak")]}, f)
with open(f"{out}/rsa1024.pem", "w") as f:
    f.write(public_pem(weak))
short_ed = jwk(ed, "ed")
short_ed["x"] = base64.urlsafe_b64encode(base64.urlsafe_b64decode(short_ed["x"] + "==")[:31]).rstrip(b"=").decode()
with open(f"{out}/ed-short.json", "w") as f:
    json.dump({"keys": [short_ed]}, f)
with open(f"{out}/hs-short.json", "w") as f:
    json.dump({"keys": [{"kty": "oct", "k": "c2hvcnQ", "kid": "hs"}]}, f)

claims = {"sub": str(uid), "iss": ISS, "aud": AUD, "iat": now, "exp": now + 600}


def token(key, alg, kid=None, **changes):
    body = dict(claims)
    for k, v in changes.items():
        if v is None:
            body.pop(k, None)
        else:
            body[k] = v
    headers = {"kid": kid} if kid else None
    return jwt.encode(body, key, algorithm=alg, headers=headers)


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


tokens = {}
for alg in ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512"]:
    tokens[alg] = token(rsa_key, alg, "rsa-1")
    tokens[alg + "-nokid"] = token(rsa_key, alg)
tokens["ES256"] = token(p256, "ES256", "p256")
tokens["ES384"] = token(p384, "ES384", "p384")
tokens["EdDSA"] = token(ed, "EdDSA", "ed")
tokens["ES256-nokid"] = token(p256, "ES256")
tokens["EdDSA-nokid"] = token(ed, "EdDSA")
for alg in ["HS256", "HS384", "HS512"]:
    tokens[alg] = token(secret, alg)
tokens["uid-as-number"] = token(rsa_key, "RS256", "rsa-1", sub=uid)
tokens["rotated"] = token(rsa_new, "RS256", "rsa-2")
# Refused ones.
tokens["none"] = jwt.encode(claims, None, algorithm="none")
head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
payload = b64(json.dumps(claims).encode())
confused = hmac.new(public_pem(rsa_key).encode(), f"{head}.{payload}".encode(), hashlib.sha256).digest()
tokens["confusion"] = f"{head}.{payload}.{b64(confused)}"
tokens["wrong-kid"] = token(rsa_key, "RS256", "nobody")
tokens["expired"] = token(rsa_key, "RS256", "rsa-1", iat=now - 7200, exp=now - 3600)
tokens["not-yet"] = token(rsa_key, "RS256", "rsa-1", nbf=now + 3600)
tokens["iat-ahead"] = token(rsa_key, "RS256", "rsa-1", iat=now + 3600)
tokens["wrong-iss"] = token(rsa_key, "RS256", "rsa-1", iss="https://elsewhere.example")
tokens["wrong-aud"] = token(rsa_key, "RS256", "rsa-1", aud="another-service")
tokens["no-exp"] = token(rsa_key, "RS256", "rsa-1", exp=None)
tokens["other-uid"] = token(rsa_key, "RS256", "rsa-1", sub=str(uid + 1))
tokens["no-uid"] = token(rsa_key, "RS256", "rsa-1", sub=None)
tokens["too-long-ttl"] = token(rsa_key, "RS256", "rsa-1", exp=now + 10 * 24 * 3600)
tokens["bad-signature"] = token(rsa_new, "RS256", "rsa-1")
tokens["oversized"] = token(rsa_key, "RS256", "rsa-1", pad="x" * 4096)
tokens["crit"] = jwt.encode(claims, rsa_key, algorithm="RS256", headers={"kid": "rsa-1", "crit": ["x-ext"], "x-ext": 1})
tokens["nbf-string"] = token(rsa_key, "RS256", "rsa-1", nbf="tomorrow")
tokens["iat-string"] = token(rsa_key, "RS256", "rsa-1", iat="now")
print(json.dumps(tokens))
