"""HS256 tokens at fixed times, made with PyJWT (a library independent of the one the
gateway verifies with), for the unit tests that run the gateway's expiry under paused
time, where the wall clock is what the test says (T0 below):

    python3 tests/data/jwt/fixed.py > tests/data/jwt/fixed.json

The output is committed: the unit tests read it and run no Python.
"""
import json

import jwt

T0 = 1_000_000_000  # the tests' wall clock at their start, unix seconds
SECRET = "fixed-hs-secret-of-the-expiry-tests-0123456789abcdef"


def token(uid, exp, **claims):
    return jwt.encode({"sub": str(uid), "iat": T0, "exp": exp, **claims}, SECRET, algorithm="HS256")


print(
    json.dumps(
        {
            "t0": T0,
            "secret": SECRET,
            "tokens": {
                # uid 7's login token, expiring 20 s after T0, and its refreshes.
                "uid7_exp20": token(7, T0 + 20, name="Ada", org="acme"),
                "uid7_exp40": token(7, T0 + 40),
                "uid7_exp60": token(7, T0 + 60),
                # Another uid's token: refused as a refresh of uid 7's session.
                "uid8_exp100": token(8, T0 + 100),
                # Claims over 1 KiB: the session logs in, its events carry none.
                "uid9_big_claims": token(9, T0 + 20, name="x" * 1100),
            },
        },
        indent=2,
    )
)
